"""What a run writes besides its checkpoints, in one place (the run log, progress lines, TensorBoard
summaries, the evaluation history, throughput, ``config.json``, ``metrics.json``) and its typed result.

Every file goes through ``trainer_module.files`` (``tf.io.gfile``, written whole), so a model directory on
``gs://`` or ``ram://`` behaves like a local one. The run log (``run_log.jsonl``, one JSON object per event)
and the history (``checkpoints/history.json``) are rewritten at every evaluation, just before the checkpoint,
and once more when the run ends by an exception (Ctrl-C included: an ``interrupted`` event); a resumed run
drops the records of the steps it trains again, so its log and history never hold a step twice.

The training curves come at a steady cadence, every ``loop.summary_every_steps`` steps, from the per-step
values each compiled call returns (``TrainingCall``): the run log's ``train`` records and TensorBoard's
``train/`` scalars. Evaluations are written at every evaluation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import time
from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from effnet_common import console, stopping
from trainer_module import files

logger = logging.getLogger("trainer_module")

RUN_LOG_FILE = "run_log.jsonl"
HISTORY_FILE = "history.json"
METRICS_FILE = "metrics.json"
CONFIG_FILE = "config.json"
# metrics.json's time accounts (``effnet_common.goodput.TimeAccount.to_dict``): the training's, from its first
# attempt's start to its end, which the trainer writes; the run's, which the local pipeline's runner adds
# (from the run's first command's start to its outcome) or a cloud Trainer step (from the step's start to its
# end: ``components.trainer_account``).
TRAINING_ACCOUNT, RUN_ACCOUNT = "training_time_account", "time_account"
# What a plan estimated for the run (``components.accelerators.planned``) and the hours its accelerators were
# held (``held_hours``), which its runner adds.
PLANNED = "planned"


# What each TensorBoard scalar holds (TensorBoard shows it beside the chart). The training curves' points are
# means over the steps since the previous point.
CURVE_DESCRIPTIONS = {
    "loss": "The loss the gradient follows: cross-entropy against label-smoothed targets, plus the L2 term "
    "where the loss carries one (train/regularisation). Label smoothing sets a floor under it, so it reads "
    "higher than eval/loss; train/cross_entropy is the comparable one.",
    "cross_entropy": "Plain cross-entropy (no label smoothing, no L2) of the training batches, in training "
    "mode: comparable with eval/loss.",
    "regularisation": "The L2 term of train/loss (absent when the optimizer decays the weights itself).",
    "learning_rate": "The learning rate of the next step.",
    "images_per_second": "Training images/s of the steps since the previous point, timed inside the compiled "
    "loop (tracing, evaluations and checkpoints left out).",
}
EVAL_DESCRIPTIONS = {
    "top1": "Top-1 accuracy on the validation set.",
    "top5": "Top-5 accuracy on the validation set.",
    "loss": "Plain cross-entropy (no label smoothing, no L2) of the validation set.",
}
# Run-log events of trained steps: a resumed run drops those after the step it restored. (A profile's trace
# stays where it was written, and so does its record.)
STEP_EVENTS = ("progress", "train", "eval")


def read_run_log(path: str) -> list[dict]:
    """The events of a ``run_log.jsonl`` (local path or URL)."""
    return [json.loads(line) for line in files.read_text(path).splitlines() if line.strip()]


# What a compiled training call returns for each of its steps (``TrainingCall``'s per-step fields).
STEP_RECORDS = ("loss", "regularisation", "cross_entropy", "learning_rate", "time")


@dataclasses.dataclass(frozen=True)
class TrainingCall:
    """One compiled training call as the host sees it when it returned (``Trainer.train_loop``).

    Attributes:
      end_step: the step the call ended at (steps done before it + its length).
      seconds: wall-clock seconds of the call, tracing and compilation included on a process's first call.
      loss / regularisation / cross_entropy / learning_rate / time: one value per step of the call (what
        ``STEP_RECORDS`` names): the loss the gradient follows, its regularisation term, the plain
        cross-entropy, the learning rate of the next step and the host's clock (seconds, only its
        differences within the call meaningful) when the step's loss was known.
    """

    end_step: int
    seconds: float
    loss: np.ndarray
    regularisation: np.ndarray
    cross_entropy: np.ndarray
    learning_rate: np.ndarray
    time: np.ndarray

    @classmethod
    def of(cls, end_step: int, seconds: float, records: dict) -> TrainingCall:
        return cls(end_step, seconds, **{key: np.asarray(value) for key, value in records.items()})

    @property
    def num_steps(self) -> int:
        return len(self.loss)

    def steps_seconds(self) -> float | None:
        """Seconds of the call's steps by the in-loop clock, scaled from the n - 1 timed intervals to n steps
        (the call's tracing, compilation and its return to the host left out); None for a one-step call."""
        if self.num_steps < 2:
            return None
        return float(self.time[-1] - self.time[0]) * self.num_steps / (self.num_steps - 1)

    @property
    def mean_loss(self) -> float:
        return float(np.mean(self.loss))

    def first_non_finite(self) -> tuple[int, float] | None:
        """The first step whose loss is NaN or infinite, and that loss; None when every loss is finite."""
        bad = np.flatnonzero(~np.isfinite(self.loss))
        if not len(bad):
            return None
        return self.end_step - self.num_steps + int(bad[0]) + 1, float(self.loss[bad[0]])


class _Window:
    """The steps since the last point of the training curves: sums of their values and of the durations of
    those whose previous step ended in the same call (the first step of a call waits for the host, and the
    first of a process also for warm-up: neither counts towards images/s)."""

    def __init__(self):
        self.steps = 0
        self.sums = {"loss": 0.0, "regularisation": 0.0, "cross_entropy": 0.0}
        self.timed_steps = 0
        self.seconds = 0.0

    def add(self, call: TrainingCall, index: int) -> None:
        self.steps += 1
        for key in self.sums:
            self.sums[key] += float(getattr(call, key)[index])
        if index > 0:
            self.timed_steps += 1
            self.seconds += float(call.time[index] - call.time[index - 1])

    def point(self, step: int, learning_rate: float, batch: int) -> dict:
        values = {key: total / self.steps for key, total in self.sums.items()}
        rate = self.timed_steps * batch / self.seconds if self.timed_steps and self.seconds > 0 else None
        return {
            "step": step,
            "steps": self.steps,
            **values,
            "learning_rate": learning_rate,
            "images_per_second": rate,
        }


@dataclasses.dataclass(frozen=True)
class RunResult:
    """The outcome of one train-and-evaluate run (what ``metrics.json`` holds).

    Times are seconds since the train-and-eval loop started (the paper's clock), summed over resumed attempts.
    """

    final_top1: float | None
    final_top5: float | None
    peak_top1: float | None
    peak_step: int | None
    time_to_peak_seconds: float | None
    target_top1: float | None
    target_reached: bool
    time_to_target_seconds: float | None
    images_per_second: float | None
    replicas: int
    eval_examples: int
    steps: int
    first_call_seconds: float | None
    allreduce_seconds_per_step: float | None
    allreduce_share: float | None
    history: tuple[dict, ...]
    export_dir: str = ""
    # The epoch a truncated run (loop.stop_at_epoch) stopped at; None if it ran its budget or met the target.
    stopped_at_epoch: int | None = None

    @property
    def images_per_ms(self) -> float | None:
        return self.images_per_second / 1000 if self.images_per_second else None

    def to_dict(self) -> dict:
        values = dataclasses.asdict(self)
        values["history"] = list(self.history)
        values["images_per_ms"] = self.images_per_ms
        return values

    def summary(self) -> dict:
        """Everything but the history (for logs and the CLI's output)."""
        return {k: v for k, v in self.to_dict().items() if k != "history"}


class Recorder:
    """Records one run (one task of it under MultiWorkerMirroredStrategy).

    Args:
      log_dir: this task's directory for the run log (the model directory for the chief).
      model_dir: the run's model directory (history, config.json, metrics.json).
      checkpoint_dir: where the history sits beside the checkpoints it belongs to.
      tensorboard_dir: summaries (written by the chief only).
      chief: whether this task writes the run's shared files.
      global_batch_size / steps_per_epoch: to turn steps into images and epochs.
      summary_every_steps: the cadence of the training curves (``loop.summary_every_steps``).
    """

    def __init__(
        self,
        log_dir: str,
        model_dir: str,
        checkpoint_dir: str,
        tensorboard_dir: str,
        chief: bool,
        global_batch_size: int,
        steps_per_epoch: float,
        summary_every_steps: int,
    ):
        self._log_path = files.join(log_dir, RUN_LOG_FILE)
        self._model_dir = model_dir
        self._history_path = files.join(checkpoint_dir, HISTORY_FILE)
        self._chief = chief
        self._batch = global_batch_size
        self._steps_per_epoch = steps_per_epoch
        self._cadence = summary_every_steps
        self._window = _Window()
        self._step = 0  # the last step this attempt trained (or restored)
        self._events: list[dict] = []
        self.history: list[dict] = []
        self._tensorboard_dir = tensorboard_dir
        self._summary = (
            tf.summary.create_file_writer(tensorboard_dir) if chief else tf.summary.create_noop_writer()
        )
        self._total_steps = 0
        self._stop_step = 0  # where this run ends: total_steps, or earlier for a truncated run
        self._seconds_per_step: float | None = None
        self._images_per_second: float | None = None
        self._first_call_seconds: float | None = None
        self._train_seconds = 0.0
        self._trained_images = 0

    # -- resuming

    def resume(self, step: int) -> None:
        """Takes back the log and the evaluations of earlier attempts, up to the restored ``step``: the
        records of later steps (trained again now) are dropped; starts and interruptions are kept."""
        self._step = step
        if files.exists(self._log_path):
            self._events = [
                e for e in read_run_log(self._log_path) if e["event"] not in STEP_EVENTS or e["step"] <= step
            ]
        if files.exists(self._history_path):
            self.history = [h for h in files.read_json(self._history_path) if h["step"] <= step]

    # -- events

    def event(self, name: str, **fields) -> None:
        """One event of the run log; logged as a line unless it is a progress, training-curve or evaluation
        record (those have lines of their own). The chief says on the console what the start of the run is;
        the start names the process writing the log (host and pid), so a report can tell whether it runs."""
        if name == "start":
            fields = {**fields, "host": socket.gethostname(), "pid": os.getpid()}
        self._events.append({"event": name, "time": time.time(), **fields})
        if name not in ("progress", "train", "eval"):
            logger.info("%s %s", name, json.dumps(fields, default=str))
        if name == "start":
            self._step = int(fields.get("step", 0))
            self._total_steps = int(fields.get("total_steps", 0))
            self._stop_step = int(fields.get("stop_step", self._total_steps))
            if self._chief:
                self._say_start(fields)

    def _say_start(self, fields: dict) -> None:
        total, replicas = self._total_steps, fields.get("replicas", 1)
        where = f"resumed at step {fields['step']} of {total}" if fields.get("resumed") else f"{total} steps"
        where += f" ({total / self._steps_per_epoch:.1f} epochs)"
        stop = fields.get("stop_step", total)
        if stop < total:
            where += f", stopping at step {stop} (epoch {stop / self._steps_per_epoch:.1f}),"
        console.say(
            "training: %s on %d replica%s, evaluating on %s images",
            where,
            replicas,
            "" if replicas == 1 else "s",
            fields.get("eval_examples", "?"),
        )
        console.say("TensorBoard: %s", console.tensorboard_command(self._tensorboard_dir))

    def write_config(self, config_json: str, plan: dict, tuned: dict | None = None) -> None:
        """config.json: the resolved config, its plan and, under ``tuned``, the settings a search chose."""
        if self._chief:
            saved = {"config": json.loads(config_json), "plan": plan}
            if tuned:
                saved["tuned"] = tuned
            files.write_json(files.join(self._model_dir, CONFIG_FILE), saved)

    def training(self, call: TrainingCall, total_steps: int) -> None:
        """One compiled training call: its progress record and line, and the points of the training curves
        that fall in it (every ``summary_every_steps`` steps: the run log's ``train`` records, TensorBoard's
        ``train/`` scalars)."""
        step, num_steps, seconds = call.end_step, call.num_steps, call.seconds
        if self._first_call_seconds is None:
            self._first_call_seconds = seconds  # tracing and compilation: kept out of the throughput
            # The first call's rate and ETA come from its steps alone (the tracing would halve them).
            seconds = call.steps_seconds() or seconds
        else:
            self._train_seconds += seconds
            self._trained_images += num_steps * self._batch
        rate = num_steps * self._batch / seconds
        self._seconds_per_step, self._images_per_second = seconds / num_steps, rate
        self._step = step
        eta = console.duration((total_steps - step) * seconds / num_steps)
        epoch = step / self._steps_per_epoch
        loss, lr = call.mean_loss, float(call.learning_rate[-1])
        self.event(
            "progress",
            step=step,
            total_steps=total_steps,
            epoch=epoch,
            loss=loss,
            learning_rate=lr,
            images_per_second=rate,
            eta=eta,
        )
        logger.info(
            "train step %d/%d  epoch %.2f  loss %.4f  lr %.4g  %.1f img/s  ETA %s",
            step,
            total_steps,
            epoch,
            loss,
            lr,
            rate,
            eta,
        )
        first = step - num_steps
        for index in range(num_steps):
            self._window.add(call, index)
            if (first + index + 1) % self._cadence == 0:
                self._curve_point(first + index + 1, float(call.learning_rate[index]))

    def _curve_point(self, step: int, learning_rate: float) -> None:
        """A point of the training curves at ``step``: the means over the steps since the previous point."""
        point = self._window.point(step, learning_rate, self._batch)
        self._window = _Window()
        self.event("train", epoch=step / self._steps_per_epoch, **point)
        with self._summary.as_default(step=step):
            for key, description in CURVE_DESCRIPTIONS.items():
                # No rate for a window none of whose steps was timed; no L2 curve for a loss without the term.
                if point[key] is not None and (key != "regularisation" or point[key]):
                    tf.summary.scalar(f"train/{key}", point[key], description=description)

    def profiled(self, directory: str, first_step: int, end_step: int) -> None:
        """A profiler trace of steps ``first_step`` to ``end_step`` - 1 was written to ``directory``."""
        self.event("profile", directory=directory, first_step=first_step, end_step=end_step)
        say = console.say if self._chief else logger.info
        say(
            "profile of steps %d-%d: %s (TensorBoard's Profile tab: %s)",
            first_step,
            end_step - 1,
            directory,
            console.tensorboard_command(self._tensorboard_dir),
        )

    def evaluation(self, step: int, elapsed_seconds: float, result: dict) -> dict:
        """One in-loop evaluation: appended to the history, logged, summarised."""
        entry = {
            "step": step,
            "epoch": step / self._steps_per_epoch,
            "elapsed_seconds": elapsed_seconds,
            **result,
        }
        self.history.append(entry)
        self.event("eval", **entry)
        # The console's one line per evaluation (other workers log theirs): the training rate and the time
        # left to the epoch budget come from the latest training call.
        rate = "" if self._images_per_second is None else f"{self._images_per_second:.0f} img/s  "
        remaining = max(0, self._stop_step - step) * (self._seconds_per_step or 0.0)
        say = console.say if self._chief else logger.info
        say(
            "epoch %.2f  step %d/%d  top-1 %.4f  top-5 %.4f  loss %.4f  %sETA %s",
            entry["epoch"],
            step,
            self._total_steps,
            result["top1"],
            result["top5"],
            result["loss"],
            rate,
            console.duration(remaining),
        )
        with self._summary.as_default(step=step):
            for key in ("top1", "top5", "loss"):
                tf.summary.scalar(f"eval/{key}", result[key], description=EVAL_DESCRIPTIONS[key])
        return entry

    @contextlib.contextmanager
    def interruptions(self) -> Iterator[None]:
        """The run log says when the block (the training loop) ends before its end, and why: an error, or
        Ctrl-C, which stops the process from its stopping thread without unwinding the block
        (``effnet_common.stopping``: a clean-up writes the record then)."""
        try:
            with stopping.cleanup(lambda: self.interrupted(KeyboardInterrupt())):
                yield
        except BaseException as error:
            self.interrupted(error)
            raise

    def interrupted(self, error: BaseException) -> None:
        """The run ended by ``error`` (Ctrl-C: ``KeyboardInterrupt``) before its end: said in the run log,
        which is written with every record up to the last trained step, so that a report says so."""
        reason = (
            "stopped by the user (Ctrl-C)" if isinstance(error, KeyboardInterrupt) else type(error).__name__
        )
        detail = str(error).strip().splitlines()
        if detail and not isinstance(error, KeyboardInterrupt):
            reason += f": {detail[0]}"
        self.event("interrupted", step=self._step, reason=reason)
        self.flush()

    def peak_reached(self, target: float | None) -> bool:
        return target is not None and any(h["top1"] >= target for h in self.history)

    # -- files

    def flush(self) -> None:
        """Rewrites the run log (every task) and the history (the chief) whole."""
        files.write_text(self._log_path, "".join(json.dumps(e, default=str) + "\n" for e in self._events))
        if self._chief:
            files.write_json(self._history_path, self.history)
        self._summary.flush()

    def finish(
        self,
        target: float | None,
        replicas: int,
        eval_examples: int,
        allreduce: float | None,
        stopped_at_epoch: int | None = None,
    ) -> RunResult:
        """The run's result, logged and (by the chief) written to ``metrics.json``."""
        history = self.history
        peak = max(history, key=lambda h: h["top1"]) if history else None
        reached = next((h for h in history if target is not None and h["top1"] >= target), None)
        rate = self._trained_images / self._train_seconds if self._train_seconds else None
        step_seconds = self._batch / rate if rate else None
        result = RunResult(
            final_top1=history[-1]["top1"] if history else None,
            final_top5=history[-1]["top5"] if history else None,
            peak_top1=peak["top1"] if peak else None,
            peak_step=peak["step"] if peak else None,
            time_to_peak_seconds=peak["elapsed_seconds"] if peak else None,
            target_top1=target,
            target_reached=reached is not None,
            time_to_target_seconds=reached["elapsed_seconds"] if reached else None,
            images_per_second=rate,
            replicas=replicas,
            eval_examples=eval_examples,
            steps=history[-1]["step"] if history else 0,
            first_call_seconds=self._first_call_seconds,
            allreduce_seconds_per_step=allreduce,
            allreduce_share=allreduce / step_seconds if allreduce is not None and step_seconds else None,
            history=tuple(history),
            stopped_at_epoch=stopped_at_epoch,
        )
        self.event("end", **result.summary())
        self.flush()
        if self._chief:
            files.write_json(files.join(self._model_dir, METRICS_FILE), result.to_dict())
        return result


def add_time_account(model_dir: str, key: str, account) -> None:
    """Puts ``account`` (an ``effnet_common.goodput.TimeAccount``) into the run's metrics.json under ``key``
    (``TRAINING_ACCOUNT`` or ``RUN_ACCOUNT``)."""
    add_to_metrics(model_dir, {key: account.to_dict()})


def add_to_metrics(model_dir: str, values: dict) -> None:
    """Adds ``values`` (time accounts, ``PLANNED``) to the run's metrics.json, the file rewritten whole."""
    path = files.join(model_dir, METRICS_FILE)
    metrics = files.read_json(path) if files.exists(path) else {}
    files.write_json(path, {**metrics, **values})


def read_time_account(model_dir: str, key: str):
    """The account under ``key`` in the run's metrics.json, or None (no file, or no such account)."""
    from effnet_common import goodput

    path = files.join(model_dir, METRICS_FILE)
    values = files.read_json(path).get(key) if files.exists(path) else None
    return goodput.TimeAccount.from_dict(values) if values else None


def time_account(metrics: dict):
    """The run's account in ``metrics`` (a metrics.json's values), else the training's; None without one."""
    from effnet_common import goodput

    values = metrics.get(RUN_ACCOUNT) or metrics.get(TRAINING_ACCOUNT)
    return goodput.TimeAccount.from_dict(values) if values else None
