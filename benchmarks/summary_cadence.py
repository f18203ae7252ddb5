"""What a steady cadence of training curves costs on the demo preset: per-step records inside the compiled loop
(what ``trainer_module.train`` does) against cutting the compiled calls to the cadence, both against the loop as
it was before either (one call per evaluation interval, its mean loss the only output).

The three cases train the demo preset's model (the 'tiny' EfficientNet at 32 px, batch 64, LARS, a 1000-way
head with label smoothing, TensorFlow's deterministic ops as ``loop.deterministic`` asks) on one CPU device, from one random in-memory batch repeated by ``tf.data`` (so the
input pipeline is not measured), each with a Trainer of its own:

- ``before``: one call of the evaluation interval's steps (the demo's 225) of the loop as it was, a sum of the
  per-step losses whose mean is read back;
- ``in-loop records``: one call of ``Trainer.train_loop``, which returns the loss, the plain cross-entropy,
  the regularisation term, the learning rate and the host's clock of every step, handed to
  ``Recorder.training`` as the trainer does (so its run-log records and TensorBoard scalars every
  ``loop.summary_every_steps`` steps are written too, into a temporary directory);
- ``cut calls``: the loop as it was, called every ``loop.summary_every_steps`` steps (10), its loss and the
  learning rate read back and written to TensorBoard after each call.

Each case is built and warmed up first (one call that traces, then an untimed short one), then timed in
``--rounds`` round-robin rounds of the same number of steps, so that every round sees about the same machine
load; a case's ratio to ``before`` is taken within each round and the median of those is the headline, for
wall-clock images/s and for images per CPU-second of this process. Then one JSON line.

    .venv/bin/python benchmarks/summary_cadence.py     # about 4 minutes on 2 idle cores
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)  # run as a script: the packages are importable from the checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tensorflow as tf  # noqa: E402
from train_step import Clock, Timing, synthetic_dataset  # noqa: E402

from trainer_module import presets, train  # noqa: E402
from trainer_module.recorder import Recorder, TrainingCall  # noqa: E402

SUM = tf.distribute.ReduceOp.SUM


def loop_before(trainer: train.Trainer):
    """The compiled training loop as it was before the per-step records: each step's loss summed, the mean
    returned (the same forward, backward and update as ``Trainer._train_step``)."""

    def step(batch):
        images, labels = batch
        with tf.GradientTape() as tape:
            loss, _ = trainer._loss(labels, trainer.model(images, training=True))
        grads = tape.gradient(loss, trainer.model.trainable_variables)
        trainer.optimizer.apply_gradients(zip(grads, trainer.model.trainable_variables, strict=True))
        return loss

    @tf.function
    def loop(iterator, num_steps):
        total = tf.constant(0.0)
        for _ in tf.range(num_steps):
            total += trainer.strategy.reduce(
                SUM, trainer.strategy.run(step, args=(next(iterator),)), axis=None
            )
            if trainer.average is not None:
                trainer.average.update(trainer.optimizer.iterations)
        return total / tf.cast(num_steps, tf.float32)

    return loop


class Case:
    """One way of training ``steps`` steps with a curve point every ``cadence`` steps; ``run`` times it."""

    def __init__(self, label: str, config, directory: str):
        self.label = label
        self.config = config
        self.cadence = config.loop.summary_every_steps
        self.trainer = train.Trainer(config, tf.distribute.OneDeviceStrategy("/cpu:0"))
        dataset = synthetic_dataset(
            config.plan.input_size, config.data.global_batch_size, config.model.num_classes
        )
        self.iterator = iter(self.trainer.strategy.experimental_distribute_dataset(dataset))
        self.loop = loop_before(self.trainer)
        self.directory = os.path.join(directory, label.replace(" ", "-"))
        self.recorder = Recorder(
            log_dir=self.directory,
            model_dir=self.directory,
            checkpoint_dir=self.directory,
            tensorboard_dir=self.directory,
            chief=True,
            global_batch_size=config.data.global_batch_size,
            steps_per_epoch=config.plan.steps_per_epoch,
            summary_every_steps=self.cadence,
        )
        self.writer = tf.summary.create_file_writer(os.path.join(self.directory, "cut"))
        self.rounds: list[Timing] = []

    def run(self, steps: int) -> Timing:
        clock = Clock()
        if self.label == "before":
            float(self.loop(self.iterator, tf.constant(steps)))
        elif self.label == "in-loop records":
            started, first = time.time(), self.trainer.step
            records = self.trainer.train_loop(self.iterator, tf.constant(steps))
            call = TrainingCall.of(first + steps, time.time() - started, records)
            self.recorder.training(call, self.config.plan.total_steps)
        else:
            for _ in range(steps // self.cadence):
                loss = float(self.loop(self.iterator, tf.constant(self.cadence)))
                with self.writer.as_default(step=self.trainer.step):
                    tf.summary.scalar("train/loss", loss)
                    tf.summary.scalar("train/learning_rate", self.trainer.learning_rate)
        return clock.stop()


def main(argv: list[str] | None = None) -> None:
    config = presets.get_preset("demo")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--steps",
        type=int,
        default=config.plan.steps_per_loop,
        help="steps per timed round (default: the demo's evaluation interval, one call of its loop)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="round-robin rounds (the variance)")
    args = parser.parse_args(argv)
    cadence = config.loop.summary_every_steps
    steps = args.steps // cadence * cadence  # whole cadences, so that every case trains the same steps
    load = os.getloadavg()[0]
    print(
        f"summary cadence on the demo preset: {steps} steps per round, a point every {cadence} steps, "
        f"{args.rounds} rounds, {os.cpu_count()} CPUs, load average {load:.2f}",
        flush=True,
    )
    start = time.perf_counter()
    # As the demo trains: with deterministic ops (then the loop's clock is Python's, through py_function).
    with (
        train.op_determinism(config.loop.deterministic),
        tempfile.TemporaryDirectory(prefix="summary-cadence-") as directory,
    ):
        cases = [Case(label, config, directory) for label in ("before", "in-loop records", "cut calls")]
        for case in cases:
            clock = Clock()
            case.run(cadence)  # traces
            first = clock.stop().wall_seconds
            case.run(cadence)  # warm-up, untimed
            print(f"  built {case.label}: first call {first:.1f} s", flush=True)
        for index in range(args.rounds):
            for case in cases:
                case.rounds.append(case.run(steps))
            print(f"  round {index + 1}/{args.rounds} done, load {os.getloadavg()[0]:.2f}", flush=True)
        for case in cases:
            case.recorder.flush()
            case.writer.close()
    batch = config.data.global_batch_size
    before = cases[0]
    rows = []
    print(
        f"\n  {'case':<18} {'images/s: median (min-max)':>28} {'x before: median (min-max)':>28} {'CPU x before':>13}"
    )
    for case in cases:
        rates = [batch * steps / t.wall_seconds for t in case.rounds]
        ratios = [b.wall_seconds / t.wall_seconds for t, b in zip(case.rounds, before.rounds, strict=True)]
        cpu = statistics.median(
            b.cpu_seconds / t.cpu_seconds for t, b in zip(case.rounds, before.rounds, strict=True)
        )
        row = {
            "case": case.label,
            "images_per_s": statistics.median(rates),
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "cpu_ratio": cpu,
        }
        rows.append(row)
        rate = f"{row['images_per_s']:.0f} ({min(rates):.0f}-{max(rates):.0f})"
        ratio = f"{row['ratio']:.3f} ({row['ratio_min']:.3f}-{row['ratio_max']:.3f})"
        print(f"  {case.label:<18} {rate:>28} {ratio:>28} {cpu:>13.3f}")
    seconds = time.perf_counter() - start
    print(f"\nwall time {seconds:.0f} s; load average at the end {os.getloadavg()[0]:.2f}")
    print(
        json.dumps(
            {
                "benchmark": "summary_cadence",
                "steps": steps,
                "cadence": cadence,
                "rounds": args.rounds,
                "load_average_start": load,
                "rows": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
