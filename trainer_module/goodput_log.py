"""The training's goodput record, kept by the chief: one file per attempt (process) under ``goodput/`` beside
the checkpoints, so that a resumed training carries the records of the attempts before it: an attempt
without its end followed by one that trained again is a disruption, and the steps trained twice its cost.
The terms are ml-goodput-measurement's (``effnet_common.goodput``); the account is computed from these
files. Each attempt's file is rewritten after every training call and after every checkpoint.

A compiled training call runs many steps and returns once, so the steps' starts are backfilled from the
in-loop clock of each step (``TrainingCall.time``): a step ends when its loss is known, the next begins
then. The file is rewritten whole (object stores have no append), so a preempted attempt leaves its
steps up to the call before the one it lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator

from effnet_common import goodput
from trainer_module import files
from trainer_module.recorder import TrainingCall

GOODPUT_DIR = "goodput"
# The parts this record writes as spans of their own kind; every other part is a custom badput event.
_OWN_KINDS = {part: kind for kind, part in goodput.SPAN_PARTS.items()}


class GoodputLog:
    """One attempt's record.

    Args:
      directory: the training's checkpoint directory (``goodput/`` goes under it).
      job_start: when the attempt started: the process's start for a command of its own (its imports are
        then a ``COMMAND_STARTUP`` span up to ``entered``), the entry point's call in a pipeline's process.
      entered: when the entry point was called.
    """

    def __init__(self, directory: str, job_start: float, entered: float | None = None):
        name = f"{int(job_start * 1000)}-{socket.gethostname()}-{os.getpid()}.jsonl"
        self.path = files.join(directory, GOODPUT_DIR, name)
        self.chief = True  # only the chief writes; set once the strategy says who it is
        self._lines: list[str] = []  # the records written so far, one JSON line each
        self._add({goodput.JOB_START: job_start})
        if entered is not None and entered > job_start:
            self.span("COMMAND_STARTUP", job_start, entered)

    def span(self, part: str, start: float, end: float) -> None:
        """Two records, the span's start and its end, as the library writes them."""
        kind = _OWN_KINDS.get(part, "custom")
        for key, at in zip(goodput.SPAN_KEYS[kind], (start, end), strict=True):
            record = {key: at}
            if kind == "custom":
                record[goodput.CUSTOM_EVENT] = part
            self._add(record)

    @contextlib.contextmanager
    def timed(self, part: str) -> Iterator[None]:
        """Records the block's time as ``part`` (also when it ends by an exception)."""
        start = time.time()
        try:
            yield
        finally:
            self.span(part, start, time.time())

    def training_call(self, call: TrainingCall, started: float) -> None:
        """The starts of the call's steps, the first when the call began, each other when the loss of the one
        before it was known (the call's end less the in-loop clock's time from then to its last step); and
        the end of its last step, as the start of the next step (which a later call records again when it
        begins: the time between is not a step's)."""
        ended = started + call.seconds
        first = call.end_step - call.num_steps
        starts = [started] + [ended - float(call.time[-1] - t) for t in call.time[:-1]]
        for index, start in enumerate([*starts, ended]):
            self._add({goodput.STEP_COUNT: first + index, goodput.STEP_START: start})
        self.flush()

    def job_ended(self, at: float | None = None) -> None:
        self._add({goodput.JOB_END: at or time.time()})
        self.flush()

    def flush(self) -> None:
        """Rewrites the attempt's file (the chief's); a failed write is logged and the training goes on."""
        if self.chief:
            with goodput.best_effort(f"the goodput record {self.path}"):
                files.write_text(self.path, "".join(self._lines))

    def _add(self, record: dict) -> None:
        self._lines.append(json.dumps(record) + "\n")


def read_attempts(directory: str) -> list[goodput.Attempt]:
    """The attempts recorded under ``directory`` (a checkpoint directory), oldest first."""
    found = files.glob(files.join(directory, GOODPUT_DIR, "*.jsonl"))
    attempts = []
    for path in found:
        lines = [json.loads(line) for line in files.read_text(path).splitlines() if line.strip()]
        if lines:
            attempts.append(goodput.Attempt.of_records(lines))
    return sorted(attempts, key=lambda a: a.start)


def account(directory: str) -> goodput.TimeAccount:
    """The time account of the training whose checkpoints are in ``directory``: all its attempts, from the
    first one's start to the last one's end."""
    return goodput.training_account(read_attempts(directory))
