"""Training-step images/s: our compiled step against `keras.applications.EfficientNetB0` under `model.fit`.

Our step is ``trainer_module.train.Trainer.train_loop`` (forward, backward and the LARS update, several steps
per compiled call, under ``OneDeviceStrategy('/cpu:0')``), built from the 'smoke' preset with overrides. The
baseline is ``keras.applications.EfficientNetB0(weights=None)`` compiled with SGD (momentum 0.9) and sparse
categorical cross-entropy, trained with ``model.fit`` at its default settings (``jit_compile='auto'``, which
Keras resolves to False on a machine with no accelerator; the value it picked is printed). Both read one
random in-memory batch repeated by ``tf.data``, so the input pipeline is not measured.

Variants of ours, all in the same process and run:

- ``fp32`` / ``bf16``: ``model.precision`` float32, or bfloat16 convolutions (float32 everywhere else);
- ``two-pass BN``: batch norm as moments + normalisation (what ``GroupedBatchNormalization`` did before it
  took the fused kernel for groups of one replica) - the "before" of the batch-norm speed-up;
- ``XLA`` (with ``--xla``): the same per-step function compiled with ``jit_compile=True`` inside the same
  loop. Off by default: on a 2-core CPU, compiling B0's training step takes about 4-5 minutes (the tiny
  variant's about 2) and the compiled step runs several times slower than the default TensorFlow executor.

The large-batch study's step (``--only study``): the tiny variant at 28 px, batch 256, ghost batch norm over
128 examples, a 10-way head, one replica, as each study run trains; its baseline is the same step with ghost
batch norm in the two-pass form (how every study run so far trained), and with it the 16x batch (4096, 32
ghost groups).

Two resolutions: B0 at 224 px (``--batch``, 16 by default: at 32 the run outgrows its time budget) against
Keras B0 at 224 px, and the demo's resolution: the 'tiny' variant at 32 px, batch 64, plus our B0 at 32 px
for a like-for-like ratio, against Keras B0 at 32 px. Every case is built and warmed up first (one call that
traces and compiles, then an untimed one-step call), then timed in ``--rounds`` round-robin rounds of
``--steps`` steps each, so that every round sees about the same machine load (other processes may share the
CPUs: the load average is printed); a case's ratio to Keras is taken within each round, and the median of
those ratios is the headline (it checks the goal of 1.3x). Printed: a table of images/s (best, median and
range over rounds), ratios to Keras (within-round median and range, and best round over best round), the
median within-round ratio of images per CPU-second of this process (all threads; less sensitive to other
processes' load, though thread pools that spin while waiting count too), the seconds of the first call
(tracing and compilation), then one JSON line.

    .venv/bin/python benchmarks/train_step.py        # 6-8 minutes on 2 cores (more if they are shared)
    .venv/bin/python benchmarks/train_step.py --only demo --xla   # XLA: minutes more per case
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from typing import NamedTuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)  # run as a script: the packages are importable from the checkout

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainer_module import presets, train  # noqa: E402
from trainer_module.config import replace  # noqa: E402
from trainer_module.distribute.batchnorm import GroupedBatchNormalization  # noqa: E402

NUM_CLASSES = 1000
GOAL_RATIO = 1.3
DEMO_VARIANT, DEMO_SIZE, DEMO_BATCH = "tiny", 32, 64
# The large-batch study's runs (benchmarks/large_batch_study.py): 28 px, ghost groups of 128, ten classes.
STUDY_SIZE, STUDY_GHOST, STUDY_CLASSES = 28, 128, 10


@dataclasses.dataclass(frozen=True)
class Case:
    """One timed training step.

    Attributes:
        group: the resolution group it is compared within ('224' or 'demo'); each has one Keras baseline.
        label: row name in the table.
        keras: True for the keras.applications baseline, False for our Trainer.
        variant: EfficientNet variant of ours ('b0', 'tiny'); Keras is always B0.
        image_size: input side in pixels.
        batch: images per step.
        precision: 'float32' or 'bfloat16' (our model.precision).
        xla: compile our per-step function with jit_compile=True.
        fused_bn: let GroupedBatchNormalization take the fused kernel (False: the two-pass form).
        virtual_batch: ghost batch norm's examples per group (None: the replica's batch).
        num_classes: logits of the classifier.
        baseline: the case the others of its group are compared with (the Keras model, or the study's step as
            it was).
    """

    group: str
    label: str
    keras: bool
    variant: str
    image_size: int
    batch: int
    precision: str = "float32"
    xla: bool = False
    fused_bn: bool = True
    virtual_batch: int | None = None
    num_classes: int = NUM_CLASSES
    baseline: bool = False


def build_cases(args) -> list[Case]:
    """The cases selected by the command line, the Keras baseline first in each group."""
    cases = []
    if args.only in ("", "224"):
        size, batch = 224, args.batch
        cases += [
            Case("224", f"keras B0 fit, batch {batch}", True, "b0", size, batch, baseline=True),
            Case("224", "ours B0 fp32", False, "b0", size, batch),
            Case("224", "ours B0 bf16", False, "b0", size, batch, precision="bfloat16"),
        ]
        if not args.no_before:
            cases.append(
                Case("224", "ours B0 fp32 two-pass BN (before)", False, "b0", size, batch, fused_bn=False)
            )
        if args.xla:
            cases += [
                Case("224", "ours B0 fp32 XLA", False, "b0", size, batch, xla=True),
                Case("224", "ours B0 bf16 XLA", False, "b0", size, batch, precision="bfloat16", xla=True),
            ]
    if args.only in ("", "demo"):
        size, batch = DEMO_SIZE, DEMO_BATCH
        cases += [
            Case("demo", f"keras B0 fit {size}px, batch {batch}", True, "b0", size, batch, baseline=True),
            Case("demo", f"ours B0 {size}px fp32", False, "b0", size, batch),
            Case("demo", f"ours {DEMO_VARIANT} fp32 (demo)", False, DEMO_VARIANT, size, batch),
            Case("demo", f"ours {DEMO_VARIANT} bf16", False, DEMO_VARIANT, size, batch, precision="bfloat16"),
        ]
        if not args.no_before:
            before = f"ours {DEMO_VARIANT} fp32 two-pass BN (before)"
            cases.append(Case("demo", before, False, DEMO_VARIANT, size, batch, fused_bn=False))
        if args.xla:
            cases.append(
                Case("demo", f"ours {DEMO_VARIANT} fp32 XLA", False, DEMO_VARIANT, size, batch, xla=True)
            )
    if args.only == "study":
        study = {"variant": DEMO_VARIANT, "image_size": STUDY_SIZE, "virtual_batch": STUDY_GHOST}
        study["num_classes"] = STUDY_CLASSES
        for batch in (256, 4096):
            cases += [
                Case(
                    "study",
                    f"study {batch} two-pass ghost BN (before)",
                    False,
                    batch=batch,
                    fused_bn=False,
                    baseline=True,
                    **study,
                ),
                Case("study", f"study {batch} fused ghost BN", False, batch=batch, **study),
            ]
    return cases


def synthetic_dataset(image_size: int, batch: int, num_classes: int, seed: int = 0) -> tf.data.Dataset:
    """One random batch of 0..255 images and labels, repeated forever (nothing is decoded per step)."""
    rng = np.random.default_rng(seed)
    images = rng.uniform(0.0, 255.0, (batch, image_size, image_size, 3)).astype(np.float32)
    labels = rng.integers(0, num_classes, (batch,)).astype(np.int32)
    return tf.data.Dataset.from_tensors((images, labels)).repeat()


class Timing(NamedTuple):
    wall_seconds: float
    cpu_seconds: float  # this process's CPU time, all threads: barely moved by other processes' load


class Clock:
    """Starts at construction; ``stop()`` returns the wall-clock and process CPU seconds since."""

    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def stop(self) -> Timing:
        return Timing(time.perf_counter() - self.wall, time.process_time() - self.cpu)


class OursRunner:
    """Our Trainer on one CPU device; ``run(steps)`` times one ``steps``-step call of its training loop."""

    def __init__(self, case: Case):
        config = replace(
            presets.get_preset("smoke"),
            {
                "model.variant": case.variant,
                "model.image_size": case.image_size,
                "model.precision": case.precision,
                "model.num_classes": case.num_classes,
                "model.bn_virtual_batch": case.virtual_batch,
                "data.global_batch_size": case.batch,
                # Enough examples for a long schedule: the benchmark never reaches its end.
                "data.num_train_examples": case.batch * 1000,
                "data.num_cores": 1,
                "loop.strategy": "one_device",
            },
        )
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
        self.trainer = train.Trainer(config, strategy)
        for layer in self.trainer.model.layers:
            if isinstance(layer, GroupedBatchNormalization):
                layer.fused = case.fused_bn  # read when the step is traced, i.e. at the first call
        self.iterator = iter(
            strategy.experimental_distribute_dataset(
                synthetic_dataset(case.image_size, case.batch, case.num_classes)
            )
        )
        self.loop = jit_train_loop(self.trainer) if case.xla else self.trainer.train_loop

    def run(self, steps: int) -> Timing:
        clock = Clock()
        loss = float(np.mean(self.loop(self.iterator, tf.constant(steps))["loss"]))
        timing = clock.stop()
        if not np.isfinite(loss):
            raise RuntimeError(f"non-finite training loss {loss}")
        return timing


def jit_train_loop(trainer: train.Trainer):
    """``Trainer.train_loop`` with its per-step function compiled by XLA (the iterator stays outside XLA).

    Train.py has no switch for this; it reuses the Trainer's per-replica step, ``_train_step``.
    """
    step = tf.function(trainer._train_step, jit_compile=True)

    @tf.function
    def loop(iterator, num_steps):
        total = tf.constant(0.0)
        for _ in tf.range(num_steps):
            per_replica = trainer.strategy.run(step, args=(next(iterator),))
            total += trainer.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica["loss"], axis=None)
        return {"loss": total / tf.cast(num_steps, tf.float32)}

    return loop


class _EpochClock(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.clock = Clock()

    def on_epoch_end(self, epoch, logs=None):
        self.timing = self.clock.stop()
        self.loss = (logs or {}).get("loss")


class KerasRunner:
    """Keras EfficientNetB0 trained by ``model.fit`` with default settings; ``run(steps)`` times an epoch."""

    def __init__(self, case: Case):
        self.model = keras.applications.EfficientNetB0(
            weights=None, input_shape=(case.image_size, case.image_size, 3), classes=NUM_CLASSES
        )
        self.model.compile(
            optimizer=keras.optimizers.SGD(learning_rate=0.01, momentum=0.9),
            loss="sparse_categorical_crossentropy",
        )
        self.jit_compile = self.model.jit_compile  # what jit_compile='auto' resolved to
        self.dataset = synthetic_dataset(case.image_size, case.batch, case.num_classes)
        self.clock = _EpochClock()

    def run(self, steps: int) -> Timing:
        self.model.fit(self.dataset, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[self.clock])
        if self.clock.loss is None or not np.isfinite(self.clock.loss):
            raise RuntimeError(f"non-finite Keras training loss {self.clock.loss}")
        return self.clock.timing


@dataclasses.dataclass
class Measurement:
    """What one case measured: the first call (tracing, compilation) and each round's seconds."""

    case: Case
    steps: int
    first_call_seconds: float
    rounds: list[Timing] = dataclasses.field(default_factory=list)
    keras_jit_compile: bool | None = None  # what Keras' jit_compile='auto' resolved to (baseline only)

    @property
    def rates(self) -> list[float]:
        """Images per (wall-clock) second of each round."""
        return [self.case.batch * self.steps / timing.wall_seconds for timing in self.rounds]

    @property
    def cpu_rates(self) -> list[float]:
        """Images per CPU second of this process in each round."""
        return [self.case.batch * self.steps / timing.cpu_seconds for timing in self.rounds]


def measure(cases: list[Case], steps: int, rounds: int) -> list[Measurement]:
    """Builds and warms up every case, then times them round-robin."""
    runners, results = [], []
    for case in cases:
        clock = Clock()
        runner = KerasRunner(case) if case.keras else OursRunner(case)
        runner.run(1)  # traces and compiles
        first = clock.stop().wall_seconds
        runner.run(1)  # warm-up, untimed: allocator, thread pools, oneDNN primitive caches
        runners.append(runner)
        jit_compile = runner.jit_compile if case.keras else None
        results.append(Measurement(case, steps, first, keras_jit_compile=jit_compile))
        jit = f", jit_compile='auto' resolved to {jit_compile}" if case.keras else ""
        print(f"  built {case.label}: first call {first:.1f} s{jit}", flush=True)
    for round_index in range(rounds):
        for runner, result in zip(runners, results, strict=True):
            result.rounds.append(runner.run(steps))
        print(f"  round {round_index + 1}/{rounds} done, load {os.getloadavg()[0]:.2f}", flush=True)
    return results


def summarise(results: list[Measurement]) -> list[dict]:
    """Per case: images/s over the rounds, and its ratio to its group's baseline (within each round, and
    best round over best round: the least disturbed rounds when other processes share the CPUs). A study case
    is compared with the study's step of the same batch as it was."""
    baselines = {
        (r.case.group, r.case.batch if r.case.group == "study" else None): r
        for r in results
        if r.case.baseline
    }
    rows = []
    for result in results:
        baseline = baselines[(result.case.group, result.case.batch if result.case.group == "study" else None)]
        ratios = [ours / theirs for ours, theirs in zip(result.rates, baseline.rates, strict=True)]
        cpu_ratios = [
            ours / theirs for ours, theirs in zip(result.cpu_rates, baseline.cpu_rates, strict=True)
        ]
        rows.append(
            {
                "group": result.case.group,
                "case": result.case.label,
                "variant": "keras-b0" if result.case.keras else result.case.variant,
                "image_size": result.case.image_size,
                "batch": result.case.batch,
                "precision": result.case.precision,
                "xla": result.case.xla,
                "fused_bn": result.case.fused_bn,
                "images_per_s": statistics.median(result.rates),
                "images_per_s_best": max(result.rates),
                "images_per_s_min": min(result.rates),
                "images_per_s_max": max(result.rates),
                "ratio_to_keras": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "ratio_best_to_best": max(result.rates) / max(baseline.rates),
                "images_per_cpu_s": statistics.median(result.cpu_rates),
                "cpu_ratio_to_keras": statistics.median(cpu_ratios),
                "first_call_s": result.first_call_seconds,
                "keras_jit_compile": result.keras_jit_compile,
                "meets_goal": (
                    None
                    if result.case.baseline or result.case.group == "study"
                    else statistics.median(ratios) >= GOAL_RATIO
                ),
            }
        )
    return rows


def print_table(rows: list[dict]) -> None:
    header = (
        f"{'case':<40} {'images/s: best, median (min-max)':>34} {'x baseline: median (min-max), best':>35}"
    )
    print(f"\n  {header} {'per CPU-s':>10} {'1st call':>9}")
    for row in rows:
        rate = (
            f"{row['images_per_s_best']:.1f}, {row['images_per_s']:.1f} "
            f"({row['images_per_s_min']:.1f}-{row['images_per_s_max']:.1f})"
        )
        ratio = (
            f"{row['ratio_to_keras']:.2f} ({row['ratio_min']:.2f}-{row['ratio_max']:.2f}), "
            f"{row['ratio_best_to_best']:.2f}"
        )
        cpu = f"{row['cpu_ratio_to_keras']:.2f}"
        print(f"  {row['case']:<40} {rate:>34} {ratio:>35} {cpu:>10} {row['first_call_s']:>8.0f}s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16, help="batch of the 224 px cases")
    parser.add_argument("--steps", type=int, default=2, help="training steps per timed round")
    parser.add_argument("--rounds", type=int, default=3, help="round-robin rounds (the variance)")
    parser.add_argument("--demo-steps", type=int, default=6, help="steps per round at the demo resolution")
    parser.add_argument("--study-steps", type=int, default=4, help="steps per round of the study's cases")
    parser.add_argument(
        "--only",
        choices=("", "224", "demo", "study"),
        default="",
        help="one group only; 'study' (the large-batch study's step against its two-pass form) only this way",
    )
    parser.add_argument("--xla", action="store_true", help="add the jit_compile=True cases (slow to compile)")
    parser.add_argument("--no-before", action="store_true", help="skip the two-pass batch-norm cases")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    load_before = os.getloadavg()
    print(
        f"training step, TensorFlow {tf.__version__}, Keras {keras.__version__}, {os.cpu_count()} CPUs, "
        f"load average {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}"
    )
    cases = build_cases(args)
    rows = []
    for group in dict.fromkeys(case.group for case in cases):
        group_cases = [case for case in cases if case.group == group]
        steps = {"224": args.steps, "demo": args.demo_steps, "study": args.study_steps}[group]
        print(f"\n{group}: {steps} steps per round, {args.rounds} rounds", flush=True)
        rows += summarise(measure(group_cases, steps, args.rounds))
    print_table(rows)
    load_after = os.getloadavg()
    seconds = time.perf_counter() - start
    print(f"\nwall time {seconds:.0f} s; load average at the end {load_after[0]:.2f} {load_after[1]:.2f}")
    print(
        json.dumps(
            {
                "benchmark": "train_step",
                "goal_ratio": GOAL_RATIO,
                "cpus": os.cpu_count(),
                "load_average_start": load_before[0],
                "load_average_end": load_after[0],
                "wall_seconds": round(seconds, 1),
                "cases": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
