"""Where a training step's time goes: TensorFlow's profiler on our step and on the Keras EfficientNetB0 baseline.

Both steps are the ones ``benchmarks/train_step.py`` times (``OursRunner``: our Trainer's compiled loop on one
CPU device; ``KerasRunner``: ``keras.applications.EfficientNetB0`` under ``model.fit``), at the same resolution
and batch, each warmed up, then ``--steps`` steps traced with ``tf.profiler`` into ``--logdir`` (open it in
TensorBoard's Profile tab). From each trace this prints the share of the process's op time (self time, all
threads) by op type, the two side by side, grouped into what the step does: convolutions (forward and
gradients), batch norm, elementwise/activation ops, the optimizer's and weight averaging's updates, data
movement (concat, slice, transpose, copies) and the input pipeline; and the traced steps' wall-clock time and
the process's CPU time. TensorFlow's op statistics leave out what runs as XLA-compiled code (our swish's fused
gradient, ``trainer_module/models/activations.py``): the CPU time a step spends outside them (that code, the
executor, thread pools waiting) is printed beside them.

Reading the traces needs ``tensorboard-plugin-profile`` (the ``dev`` extra): its TfStatsDatabase proto is what
TensorFlow's converter returns.

    .venv/bin/python benchmarks/profile_step.py                      # B0, 224 px, batch 16 (a few minutes)
    .venv/bin/python benchmarks/profile_step.py --variant tiny --size 28 --batch 256 --ghost 128 --classes 10
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # train_step, beside this file

import tensorflow as tf  # noqa: E402
import train_step  # noqa: E402
from tensorflow.python.profiler.internal import _pywrap_profiler  # noqa: E402 - the trace converter

# What a step does, by op type (TensorFlow's CPU kernels carry oneDNN prefixes: _Mkl, _MklNative).
GROUPS = (
    ("convolutions", ("Conv2D", "DepthwiseConv", "Conv2DBackprop", "FusedConv2D", "BiasAdd", "MatMul")),
    ("batch norm", ("FusedBatchNorm",)),
    ("elementwise and activations", ("Sigmoid", "Swish", "Mul", "Add", "Sub", "RealDiv", "Relu", "Square",
                                     "Sqrt", "Rsqrt", "Neg", "Exp", "Log", "Maximum", "Minimum", "Select",
                                     "Greater", "Less", "Equal", "Cast", "Floor", "Pow", "Softmax", "Xent")),
    ("reductions", ("Sum", "Mean", "Max", "Min", "Prod", "ArgMax")),
    ("variable reads and updates", ("ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp",
                                    "AssignSubVariableOp", "ResourceApply", "VarHandleOp")),
    ("data movement", ("Concat", "Split", "Slice", "Transpose", "Reshape", "Pack", "Unpack", "Tile", "Pad",
                       "Identity", "Copy", "Gather", "Fill", "ZerosLike", "OnesLike", "Shape", "Squeeze",
                       "ExpandDims", "Broadcast", "Reverse")),
    ("input pipeline", ("Dataset", "Iterator", "DecodeJpeg", "DecodeAndCropJpeg", "ResizeBicubic",
                        "ParseExample")),
)  # fmt: skip


def group_of(op_type: str) -> str:
    name = op_type.removeprefix("_MklNative").removeprefix("_Mkl")
    for group, markers in GROUPS:
        if any(marker in name for marker in markers):
            return group
    return "other"


def op_time_by_type(xplane_path: str) -> dict[str, float]:
    """Microseconds of self time by op type in one trace (TensorFlow's framework op statistics)."""
    from tensorboard_plugin_profile.protobuf import tf_stats_pb2

    data, ok = _pywrap_profiler.xspace_to_tools_data([xplane_path], "framework_op_stats", {})
    if not ok:
        raise RuntimeError(f"TensorFlow could not convert the trace {xplane_path}")
    database = tf_stats_pb2.TfStatsDatabase()
    database.ParseFromString(data)
    by_type: collections.Counter = collections.Counter()
    for record in database.without_idle.tf_stats_record:
        by_type[record.op_type] += record.total_self_time_in_us
    return dict(by_type)


def trace(runner, steps: int, logdir: str) -> tuple[str, train_step.Timing]:
    """Traces ``steps`` steps of a warmed-up runner; returns the trace's file and the steps' wall and CPU
    seconds."""
    before = set(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")))
    tf.profiler.experimental.start(logdir)
    try:
        timing = runner.run(steps)
    finally:
        tf.profiler.experimental.stop()
    (path,) = set(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))) - before
    return path, timing


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="b0")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--ghost", type=int, default=None, help="our ghost batch norm's examples per group")
    parser.add_argument("--classes", type=int, default=train_step.NUM_CLASSES)
    parser.add_argument("--steps", type=int, default=3, help="steps traced per model")
    parser.add_argument("--no-keras", action="store_true", help="profile our step only")
    parser.add_argument("--logdir", default=None, help="where the traces go (default: a temporary directory)")
    args = parser.parse_args(argv)
    logdir = args.logdir or tempfile.mkdtemp(prefix="profile_step-")
    cases = [train_step.Case("profile", "ours", False, args.variant, args.size, args.batch,
                             virtual_batch=args.ghost, num_classes=args.classes)]  # fmt: skip
    if not args.no_keras:
        cases.append(train_step.Case("profile", "keras B0", True, "b0", args.size, args.batch, baseline=True))
    print(
        f"TensorFlow {tf.__version__}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; traces in {logdir}"
    )
    shares, seconds = {}, {}
    for case in cases:
        runner = train_step.KerasRunner(case) if case.keras else train_step.OursRunner(case)
        runner.run(1)  # traces and compiles
        runner.run(1)
        path, timing = trace(runner, args.steps, logdir)
        wall, cpu = timing.wall_seconds / args.steps, timing.cpu_seconds / args.steps
        by_type = op_time_by_type(path)
        total = sum(by_type.values())
        shares[case.label] = {"types": {k: v / total for k, v in by_type.items()}}
        groups: collections.Counter = collections.Counter()
        for op_type, micros in by_type.items():
            groups[group_of(op_type)] += micros / total
        shares[case.label]["groups"] = dict(groups)
        seconds[case.label] = wall
        shares[case.label]["cpu_seconds"] = cpu
        shares[case.label]["op_seconds"] = total / 1e6 / args.steps
        print(f"  {case.label}: {wall:.2f} s a step ({args.batch / wall:.1f} img/s while traced), "
              f"{cpu:.2f} CPU-s a step, {total / 1e6 / args.steps:.2f} s of it in TensorFlow's op statistics",
              flush=True)  # fmt: skip
    labels = list(shares)
    print(f"\n  {'share of op time':<30}" + "".join(f"{label:>12}" for label in labels))
    for group in [g for g, _ in GROUPS] + ["other"]:
        print(
            f"  {group:<30}"
            + "".join(f"{shares[label]['groups'].get(group, 0.0):>12.1%}" for label in labels)
        )
    print("\n  top op types (ours)")
    for op_type, share in sorted(shares[labels[0]]["types"].items(), key=lambda kv: -kv[1])[:15]:
        keras_share = shares[labels[1]]["types"].get(op_type) if len(labels) > 1 else None
        other = "" if keras_share is None else f"   keras {keras_share:6.1%}"
        print(f"    {op_type:<48}{share:6.1%}{other}")
    print(json.dumps({"benchmark": "profile_step", "seconds_per_step": seconds, "shares": shares,
                      "logdir": logdir, "time": time.strftime("%Y-%m-%d %H:%M")}))  # fmt: skip


if __name__ == "__main__":
    main()
