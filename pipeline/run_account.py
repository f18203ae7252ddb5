"""The local pipeline run's time account, from the command's start to its push (``effnet_common.goodput``).

Each command of ``pipeline.local_runner`` appends one line to ``<root>/time_accounts/<pipeline>.jsonl`` as it
ends: when it started (the process's start, so the imports count), when it ended, how (``stopped`` by Ctrl-C,
``failed``, or ``finished``), and each pipeline step's start and end. A stopped command's run goes on in the
next command (the Trainer resumes from its checkpoint), so a run's account spans the commands since the last
one that did not stop, and the time between them is its own part. The pipeline root is local (its metadata
store is SQLite), so the file is a plain local one.

The parts: the command's start and imports up to its first step, each step's time by its name (the Trainer's
split by the training's own account, ``trainer_module.goodput_log``, and a rehearsed slice's states), the
launcher's time between steps, the time after the last step up to the account (reading the outcome) and,
between commands, the time the run was stopped. The report and the runs page, written after the account, are
outside it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time

from effnet_common import goodput
from pipeline.local_steps import TRAINER

ACCOUNTS_DIR = "time_accounts"
STOPPED, FAILED, FINISHED = "stopped", "failed", "finished"


@dataclasses.dataclass(frozen=True)
class Step:
    """One pipeline step as the command ran it (``cached``: an earlier run's outputs were reused)."""

    name: str
    start: float
    end: float
    cached: bool = False


@dataclasses.dataclass(frozen=True)
class Command:
    """One command of the pipeline: its process's start, its end, how it ended and its steps."""

    start: float
    end: float
    status: str
    steps: tuple[Step, ...] = ()

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, values: dict) -> Command:
        steps = tuple(Step(**step) for step in values.get("steps", ()))
        return cls(float(values["start"]), float(values["end"]), str(values["status"]), steps)


def record_path(root: str, pipeline_name: str) -> str:
    return os.path.join(root, ACCOUNTS_DIR, f"{pipeline_name}.jsonl")


def append(root: str, pipeline_name: str, command: Command) -> None:
    path = record_path(root, pipeline_name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(command.to_json() + "\n")


def run_commands(root: str, pipeline_name: str) -> list[Command]:
    """The commands of the run the last recorded command belongs to: it and the stopped ones just before
    it (an unreadable line ends the run there: what follows it is counted, what precedes it is not)."""
    path = record_path(root, pipeline_name)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    commands: list[Command] = []
    for line in reversed(lines):
        try:
            command = Command.from_dict(json.loads(line))
        except (ValueError, KeyError, TypeError):
            break
        if commands and command.status != STOPPED:
            break
        commands.insert(0, command)
    return commands


def trained(commands: list[Command]) -> bool:
    """Whether the Trainer ran (not cached) in one of the run's commands."""
    return any(step.name == TRAINER and not step.cached for command in commands for step in command.steps)


def command_spans(commands: list[Command]) -> list[goodput.Span]:
    """The spans the commands' own records give: start-up, steps, the time between and after them, and the
    time between commands."""
    spans: list[goodput.Span] = []
    for index, command in enumerate(commands):
        steps = sorted(command.steps, key=lambda s: s.start)
        first = steps[0].start if steps else command.end
        spans.append(goodput.Span(command.start, first, "COMMAND_STARTUP"))
        for step, following in zip(steps, [*steps[1:], None], strict=True):
            spans.append(
                goodput.Span(step.start, step.end, "TRAINER_STEP" if step.name == TRAINER else step.name)
            )
            spans.append(goodput.Span(step.end, following.start if following else step.end, "ORCHESTRATION"))
        if steps:
            spans.append(goodput.Span(steps[-1].end, command.end, "REPORT"))
        if index + 1 < len(commands):
            spans.append(goodput.Span(command.end, commands[index + 1].start, "STOPPED"))
    return spans


def account(
    commands: list[Command], training: goodput.TimeAccount | None, more: list[goodput.Span] = ()
) -> goodput.TimeAccount:
    """The run's account: from its first command's start to its last one's end, the commands' spans, the
    training's own spans (``training``: the Trainer's account, its disruptions within the run count) and
    ``more`` (a rehearsed slice's states)."""
    spans = command_spans(commands)
    disrupted: tuple = ()
    if training is not None:
        spans.extend(training.spans)
        disrupted = training.disrupted
    spans.extend(more)
    return goodput.TimeAccount.of(spans, commands[0].start, commands[-1].end, disrupted)


class CommandRecord:
    """The running command's record: its start (the process's), the steps as they end, and its line,
    appended once when it ends (``close``)."""

    def __init__(self, root: str, pipeline_name: str):
        self.root, self.pipeline_name = root, pipeline_name
        self.start = goodput.process_started(os.getpid()) or time.time()
        self.steps: list[Step] = []
        self._closed: Command | None = None
        self._lock = threading.Lock()  # a stop closes it from the stopping thread

    def step(self, name: str, start: float, end: float, cached: bool) -> None:
        with self._lock:
            self.steps.append(Step(name, start, end, cached))

    def close(self, status: str, end: float | None = None) -> Command:
        """Appends the command's line, once: a later close returns the first one's command."""
        with self._lock:
            if self._closed is None:
                self._closed = Command(self.start, end or time.time(), status, tuple(self.steps))
                with goodput.best_effort(f"the command's time record in {self.root}"):
                    append(self.root, self.pipeline_name, self._closed)
            return self._closed
