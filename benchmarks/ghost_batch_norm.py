"""Ghost batch norm: CPU per forward+backward of the fused form against the two-pass form, same process.

``GroupedBatchNormalization(virtual_batch=v)`` in training mode, once with ``fused=True`` (the fused kernel on
each sub-batch, ``trainer_module.distribute.batchnorm.fused_virtual_batch_norm``) and once with ``fused=False`` (moments
per sub-batch, then normalisation: the form every ghost batch norm took before). A step is the layer's forward
pass, the gradient of ``sum(outputs * weights)`` with respect to the input, gamma and beta (``weights`` as the
output gradient), the moving-statistics update, and a sum of each gradient (so none is pruned; it is in both
forms' figures). Each form runs as one compiled loop of ``n`` steps
(``tf.range`` inside a ``tf.function``, so Python is not timed); the steady-state cost per step is the
marginal between a short and a long loop, ``(cpu(long) - cpu(short)) / (long - short)``, of this process's CPU
time (all threads). The two forms alternate within each round; the best round of each is taken, and the
ratio two-pass / fused printed per shape, with the goal (1.8x) beside it.

    .venv/bin/python benchmarks/ghost_batch_norm.py     # about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)  # run as a script: the packages are importable from the checkout

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainer_module.distribute.batchnorm import GroupedBatchNormalization  # noqa: E402

GOAL_RATIO = 1.8
# (input shape, examples per ghost group): an EfficientNet stage at 224 px / 16, and one at 224 px / 32,
# batch 256 per replica as a large-batch run on few replicas has.
SHAPES = [((256, 14, 14, 40), 128), ((256, 7, 7, 112), 64)]


def step_loop(shape, virtual_batch, fused):
    """A compiled ``loop(n)`` running ``n`` training steps of one ghost batch-norm layer on a fixed input."""
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=shape).astype(np.float32))
    weights = tf.constant(rng.normal(size=shape).astype(np.float32))
    layer = GroupedBatchNormalization(virtual_batch=virtual_batch, fused=fused)
    layer.build((None, *shape[1:]))

    @tf.function
    def loop(n):
        total = tf.constant(0.0)
        for _ in tf.range(n):
            with tf.GradientTape() as tape:
                tape.watch(x)
                outputs = layer(x, training=True)
            gradients = tape.gradient(outputs, [x, layer.gamma, layer.beta], output_gradients=weights)
            total += tf.add_n([tf.reduce_sum(g) for g in gradients])
        return total

    return loop


def cpu_seconds(loop, n):
    start = time.process_time()
    loop(tf.constant(n)).numpy()
    return time.process_time() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", type=int, default=5, help="steps of the short loop")
    parser.add_argument("--long", type=int, default=25, help="steps of the long loop")
    parser.add_argument("--rounds", type=int, default=4, help="rounds; the best of each form is taken")
    args = parser.parse_args(argv)
    print(
        f"ghost batch norm, TensorFlow {tf.__version__}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
    )
    rows = []
    for shape, virtual_batch in SHAPES:
        loops = {fused: step_loop(shape, virtual_batch, fused) for fused in (True, False)}
        for loop in loops.values():
            loop(tf.constant(1)).numpy()  # trace and warm up
        per_step = {True: [], False: []}
        for _ in range(args.rounds):
            for fused, loop in loops.items():
                marginal = cpu_seconds(loop, args.long) - cpu_seconds(loop, args.short)
                per_step[fused].append(marginal / (args.long - args.short))
        fused_ms, two_pass_ms = (1000 * min(per_step[fused]) for fused in (True, False))
        ratio = two_pass_ms / fused_ms
        rows.append(
            {
                "shape": list(shape),
                "virtual_batch": virtual_batch,
                "fused_cpu_ms_per_step": round(fused_ms, 3),
                "two_pass_cpu_ms_per_step": round(two_pass_ms, 3),
                "ratio": round(ratio, 3),
                "meets_goal": ratio >= GOAL_RATIO,
            }
        )
        print(
            f"  {str(list(shape)):<20} v={virtual_batch:<4} fused {fused_ms:7.2f} CPU-ms/step, two-pass "
            f"{two_pass_ms:7.2f}: {ratio:.2f}x less CPU (goal {GOAL_RATIO}x)",
            flush=True,
        )
    print(json.dumps({"benchmark": "ghost_batch_norm", "goal_ratio": GOAL_RATIO, "cases": rows}))


if __name__ == "__main__":
    main()
