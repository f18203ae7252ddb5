"""The local pipeline's steps as the console shows them, and what Ctrl-C in the middle of one leaves.

The LocalDagRunner runs each component in turn, in this process, and logs (through absl) when a component
starts and finishes, the execution it runs or the cached one it reuses, and an execution that failed.
``StepLines`` turns those records into the console's account, one line as a step starts and one as it ends,
and so knows at any moment which step runs and which execution it is.

Ctrl-C stops the command (``effnet_common.stopping``) and TFX would leave the unfinished step's directories
as they were: its outputs (``<node>/<output>/<execution>``), its ``.system/executor_execution`` and
``.system/stateful_working_dir`` directories and, for a Pusher, a half-copied serving version.
``StepLines.remove_unfinished`` removes them (the next run starts that step again); finished steps are in the
metadata store and cached. ``StepLines.stop_description`` says what was kept (the Trainer's checkpoints, the
Tuner's trials, the cached steps). The pipeline root is local (the metadata store is SQLite), so plain local
file calls read and remove the directories.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time

from effnet_common import console

TRAINER, TUNER, PUSHER = "Trainer", "Tuner", "Pusher"
_SYSTEM_DIR = ".system"
_TEMPORARY = (".system", "executor_execution")
_WORKING = (".system", "stateful_working_dir")
_CHECKPOINT_STATE = "checkpoint"
_CHECKPOINT_STEP = re.compile(r'^model_checkpoint_path: ".*?(\d+)"$', re.M)


def last_checkpoint_step(directory: str) -> int | None:
    """The step of the newest checkpoint under ``directory`` (``<key>/checkpoint`` state files, TensorFlow's
    ``model_checkpoint_path: "ckpt-<step>"``), or None when there is none yet."""
    if not os.path.isdir(directory):
        return None
    states = [
        os.path.join(directory, key, _CHECKPOINT_STATE)
        for key in os.listdir(directory)
        if os.path.isfile(os.path.join(directory, key, _CHECKPOINT_STATE))
    ]
    if not states:
        return None
    with open(max(states, key=os.path.getmtime), encoding="utf-8") as f:
        found = _CHECKPOINT_STEP.search(f.read())
    return int(found.group(1)) if found else None


class StepLines(logging.Handler):
    """The console's account of the pipeline's steps, from the records TFX's launcher logs in this process;
    and, on Ctrl-C, the unfinished step's directories and what the stop kept.

    Args:
      num_steps: the pipeline's components.
      artifacts: the pipeline root TFX writes under (``<artifacts>/<node id>/...``).
      checkpoints: where the Trainer keeps its checkpoints across runs.
      tuning: where the Tuner keeps its trials across runs.
      serving: the Pusher's serving directory (one version directory a push).
      record: where each step's start and end go (``pipeline.run_account.CommandRecord``), if anywhere.
    """

    RUNNING = "Component %s is running."
    NEW_EXECUTION = "Going to run a new execution %d"
    CACHED = "A cached execution %d is used."
    FAILED = "Execution %d failed."
    FINISHED = "Component %s is finished."

    def __init__(
        self, num_steps: int, artifacts: str, checkpoints: str, tuning: str, serving: str, record=None
    ):
        super().__init__(logging.INFO)
        self._record = record  # the command's time record (``pipeline.run_account.CommandRecord``)
        self._total = num_steps
        self._artifacts, self._checkpoints, self._tuning, self._serving = (
            artifacts,
            checkpoints,
            tuning,
            serving,
        )
        self._index = 0
        self._node = ""
        self._execution: int | None = None
        self._running = False
        self._started = 0.0
        self._cached = False
        self._recorded = False
        self._before: dict[str, set[str]] = {}
        self.cached: set[str] = set()  # the steps whose earlier outputs were reused

    def emit(self, record: logging.LogRecord) -> None:
        if not isinstance(record.msg, str) or record.msg not in self._EVENTS:
            return
        try:
            self._EVENTS[record.msg](self, record.args or ())
        except Exception:  # a console line must never break the run
            self.handleError(record)

    def _prefix(self) -> str:
        return f"[{self._index}/{self._total}] {self._node}"

    def _node_dir(self, *parts: str) -> str:
        return os.path.join(self._artifacts, self._node, *parts)

    def _running_event(self, args) -> None:
        self._index += 1
        self._node, self._started, self._cached = str(args[0]), time.time(), False
        self._recorded = False
        self._execution, self._running = None, True
        # What the step's own directories hold before it runs: a stop removes only what it added.
        watched = {"working": self._node_dir(*_WORKING)}
        if self._node == PUSHER:
            watched["serving"] = self._serving
        self._before = {name: set(_entries(path)) for name, path in watched.items()}

    def _new_execution(self, args) -> None:
        self._execution = int(args[0])
        console.say("%s: running", self._prefix())

    def _cached_execution(self, args) -> None:
        self._cached = True

    def _failed(self, args) -> None:
        self.end_running()
        console.say("%s: FAILED after %s", self._prefix(), console.duration(time.time() - self._started))

    def _finished(self, args) -> None:
        self.end_running()
        took = console.duration(time.time() - self._started)
        if self._cached:
            self.cached.add(self._node)
            console.say("%s: CACHED, outputs of an earlier run reused (%s)", self._prefix(), took)
        else:
            console.say("%s: done in %s", self._prefix(), took)

    def end_running(self) -> None:
        """The running step ends now (finished or failed): its time goes to the record."""
        self.record_running()
        self._running = False

    def record_running(self) -> None:
        """The running step's time up to now goes to the record (a stop: the step still counts as running,
        for the stop's line)."""
        if self._running and self._record is not None and not self._recorded:
            self._record.step(self._node, self._started, time.time(), self._cached)
            self._recorded = True

    _EVENTS = {
        RUNNING: _running_event,
        NEW_EXECUTION: _new_execution,
        CACHED: _cached_execution,
        FAILED: _failed,
        FINISHED: _finished,
    }

    # -- Ctrl-C

    def unfinished_directories(self) -> list[str]:
        """The directories the running step made and would leave half-done: its outputs, its temporary and
        working directories, a Pusher's partial version. [] between steps."""
        if not self._running or self._execution is None:
            return []
        execution = str(self._execution)
        node = self._node_dir()
        outputs = [
            os.path.join(node, name, execution)
            for name in _entries(node)
            if not name.startswith(".") and os.path.isdir(os.path.join(node, name, execution))
        ]
        found = [*outputs, self._node_dir(*_TEMPORARY, execution)]
        working = self._node_dir(*_WORKING)
        found += [os.path.join(working, name) for name in set(_entries(working)) - self._before["working"]]
        if "serving" in self._before:
            found += [
                os.path.join(self._serving, n) for n in set(_entries(self._serving)) - self._before["serving"]
            ]
        return [path for path in found if os.path.exists(path)]

    def remove_unfinished(self) -> None:
        for path in self.unfinished_directories():
            shutil.rmtree(path, ignore_errors=True)

    def stop_description(self) -> str:
        """What a stop now kept, and what the same command does next."""
        if not self._index:
            return "nothing ran yet; run the same command again"
        if not self._running:
            return "the finished steps are kept (cached): run the same command again to go on from there"
        if self._node == TRAINER:
            step = last_checkpoint_step(self._checkpoints)
            kept = "no checkpoint yet (the first is written at the first evaluation)"
            if step is not None:
                kept = f"its checkpoint of step {step} is kept in {self._checkpoints}"
            return f"the Trainer stopped: {kept}; run the same command again to resume the training"
        if self._node == TUNER:
            return (
                f"the Tuner stopped: its finished trials are kept in {self._tuning}; run the same command "
                "again to resume the search"
            )
        if self._index == 1:
            return f"{self._node} did not finish (its partial output was removed); run the same command again"
        return (
            f"{self._node} did not finish (its partial output was removed), the steps before it are cached: "
            "run the same command again to go on from there"
        )


def _entries(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []
