"""What a run writes besides its checkpoints, in one place: the run log, progress lines, TensorBoard summaries,
the evaluation history, throughput, ``config.json`` and ``metrics.json``; and the run's typed result.

Every file goes through ``trainer_module.files`` (``tf.io.gfile``, written whole), so a model directory on
``gs://`` or ``ram://`` behaves like a local one. The run log (``run_log.jsonl``, one JSON object per event) and
the history (``checkpoints/history.json``) are rewritten at every evaluation, just before the checkpoint, so a
run killed at any point resumes with a log and a history that end at (or before) its restored step.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time

import tensorflow as tf

from effnet_common import console
from trainer_module import files

logger = logging.getLogger("trainer_module")

RUN_LOG_FILE = "run_log.jsonl"
HISTORY_FILE = "history.json"
METRICS_FILE = "metrics.json"
CONFIG_FILE = "config.json"


def read_run_log(path: str) -> list[dict]:
    """The events of a ``run_log.jsonl`` (local path or URL)."""
    return [json.loads(line) for line in files.read_text(path).splitlines() if line.strip()]


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
    # The epoch a truncated run (loop.stop_at_epoch) stopped at; None when it ran its budget or hit its target.
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
    ):
        self._log_path = files.join(log_dir, RUN_LOG_FILE)
        self._model_dir = model_dir
        self._history_path = files.join(checkpoint_dir, HISTORY_FILE)
        self._chief = chief
        self._batch = global_batch_size
        self._steps_per_epoch = steps_per_epoch
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
        """Takes back the log and the evaluations of earlier attempts, up to the restored ``step``."""
        if files.exists(self._log_path):
            self._events = read_run_log(self._log_path)
        if files.exists(self._history_path):
            self.history = [h for h in files.read_json(self._history_path) if h["step"] <= step]

    # -- events

    def event(self, name: str, **fields) -> None:
        """One event of the run log; logged as a line unless it is a progress or evaluation record (those have
        lines of their own). The chief says on the console what the start of the run is."""
        self._events.append({"event": name, "time": time.time(), **fields})
        if name not in ("progress", "eval"):
            logger.info("%s %s", name, json.dumps(fields, default=str))
        if name == "start":
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
        console.say("TensorBoard: tensorboard --logdir %s", self._tensorboard_dir)

    def write_config(self, config_json: str, plan: dict, tuned: dict | None = None) -> None:
        """config.json: the resolved config, its plan and, under ``tuned``, the settings a search chose."""
        if self._chief:
            saved = {"config": json.loads(config_json), "plan": plan}
            if tuned:
                saved["tuned"] = tuned
            files.write_json(files.join(self._model_dir, CONFIG_FILE), saved)

    def training(self, step: int, total_steps: int, num_steps: int, loss: float, lr: float, seconds: float):
        """One compiled training call of ``num_steps`` steps that ended at ``step``."""
        rate = num_steps * self._batch / seconds
        if self._first_call_seconds is None:
            self._first_call_seconds = seconds  # tracing and compilation: kept out of the throughput
        else:
            self._train_seconds += seconds
            self._trained_images += num_steps * self._batch
        self._seconds_per_step, self._images_per_second = seconds / num_steps, rate
        eta = console.duration((total_steps - step) * seconds / num_steps)
        epoch = step / self._steps_per_epoch
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
        with self._summary.as_default(step=step):
            tf.summary.scalar("train/loss", loss)
            tf.summary.scalar("train/learning_rate", lr)
            tf.summary.scalar("train/images_per_second", rate)

    def profiled(self, directory: str, first_step: int, end_step: int) -> None:
        """A profiler trace of steps ``first_step`` to ``end_step`` - 1 was written to ``directory``."""
        self.event("profile", directory=directory, first_step=first_step, end_step=end_step)
        say = console.say if self._chief else logger.info
        say(
            "profile of steps %d-%d: %s (TensorBoard's Profile tab: tensorboard --logdir %s)",
            first_step,
            end_step - 1,
            directory,
            self._tensorboard_dir,
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
                tf.summary.scalar(f"eval/{key}", result[key])
        return entry

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
