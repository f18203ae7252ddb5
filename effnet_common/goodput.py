"""Where a run's time went: goodput (the training steps that count toward the final model) and badput by
cause, as parts that add up to the run's wall time.

The terms are those of ml-goodput-measurement (the goodput library MaxText reports with): its record (one
JSON object a line: ``job_start_time``, ``job_end_time``, ``step_count`` with ``step_start_time``, the
start and end of device set-up, training preparation and custom badput events) and its parts
(``BadputType``: ``TPU_INITIALIZATION``, ``TRAINING_PREP``, ``PROGRAM_STARTUP``,
``WASTED_PROGRESS_FROM_DISRUPTION``, ``INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION``, ``OTHER``, custom events).
That library records to Cloud Logging only, so a run keeps its own record (``trainer_module.goodput_log``)
and this module computes the account by the library's definitions:

- a step's time is the gap between its start and the next step's start, in one attempt (one process, from
  one ``job_start_time``); events inside the gap (an evaluation, a checkpoint) are taken out of it. A step
  number recorded twice in a row marks a pause: the first record ends the step before, the second starts
  the step (the time between belongs to no step);
- the first step of an attempt costs its excess over the attempt's mean step: tracing and compilation
  (``PROGRAM_STARTUP``);
- an attempt that ends without its ``job_end_time`` and a later one that restarts from a checkpoint make a
  disruption: the earlier attempt's steps from the restart's step on were trained for nothing
  (``WASTED_PROGRESS_FROM_DISRUPTION``), and the time from its last step's start to the next attempt's start
  is the recovery (``INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION``);
- what an attempt's window holds besides is ``OTHER``.

Where this differs from the library, it is for what a TFX pipeline adds or for steps run many to a compiled
call: custom events count wherever they fall (the export after the last step too, where the library counts
only those inside a step gap); a pause between calls is no step's, and the last step ends at its end record
(the library would count the time from it to the job's end as one more step); a disruption is told by the
missing end (a restart at the very step where a checkpoint was written repeats no step number); and the parts
around the training job have names of their own (the queue, provisioning, the other pipeline steps:
``PARTS``). tests/test_goodput_library.py holds the two to the same figures on a record where they agree.

Each part is a set of time spans; where spans overlap, the more specific part (``PARTS``' order) takes the
time, so every second of the wall time belongs to one part and the parts add up to it. Time no span covers is
``UNACCOUNTED``. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import heapq
import itertools
import logging
import os
import time
from collections.abc import Iterable, Iterator, Sequence

from effnet_common import console

logger = logging.getLogger(__name__)

# The record's keys (ml-goodput-measurement's payload fields).
JOB_START, JOB_END = "job_start_time", "job_end_time"
STEP_COUNT, STEP_START = "step_count", "step_start_time"
CUSTOM_EVENT = "custom_badput_event_type"
# A span of the record: its kind, and the start and end keys the library writes for it.
SPAN_KEYS = {
    "tpu_init": ("tpu_init_start_time", "tpu_init_end_time"),
    "training_prep": ("training_prep_start_time", "training_prep_end_time"),
    "custom": ("custom_badput_event_start_time", "custom_badput_event_end_time"),
}

GOODPUT = "GOODPUT"
UNACCOUNTED = "UNACCOUNTED"
# Every part, the most specific first (it takes the time where spans overlap), with the words the console and
# the report use for it.
PARTS: dict[str, str] = {
    "WAITING_FOR_CAPACITY": "waiting for capacity",
    "PROVISIONING": "provisioning",
    "EVAL": "evaluation",
    "CHECKPOINT_SAVE": "checkpointing",
    "EXPORT": "export",
    "REPORT": "run report",
    "COMMAND_STARTUP": "program start and imports",
    "TPU_INITIALIZATION": "device set-up",
    "TRAINING_PREP": "training preparation",
    "PROGRAM_STARTUP": "trace and compile",
    "WASTED_PROGRESS_FROM_DISRUPTION": "redone steps",
    GOODPUT: "training steps",
    "STOPPED": "stopped, until the next command",
    "ORCHESTRATION": "between pipeline steps",
    "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION": "recovery",
    "WORKER_SETUP": "worker set-up and image pull",
    "TEARDOWN": "deleting the slice",
    "OTHER": "other trainer time",
    "TRAINER_STEP": "Trainer step, outside its training",
    UNACCOUNTED: "unaccounted",
}
# Parts of a disruption: what the one-line account sums as "lost to N preemptions".
DISRUPTION_PARTS = ("WASTED_PROGRESS_FROM_DISRUPTION", "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION")
# A pipeline step's own time is a part named by the step ('ImageNetShardGen', 'Evaluator', ...): below the
# measured parts above it, above those that fill what is left.
STEP_PRIORITY_BEFORE = "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"


def priority(part: str) -> int:
    """The rank of ``part`` where spans overlap: lower wins."""
    order = list(PARTS)
    if part in PARTS:
        return order.index(part)
    return order.index(STEP_PRIORITY_BEFORE) - 0.5  # a pipeline step's own part


def words(part: str) -> str:
    return PARTS.get(part, part)


@contextlib.contextmanager
def best_effort(what: str) -> Iterator[None]:
    """Keeping the account never fails a run: an error inside the block is logged (a warning naming
    ``what``) and the run goes on without that part of its account."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - whatever failed, the training and the pipeline go on
        logger.warning("%s left out: %s", what, console.one_line(error))


def process_started(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch, to 10 ms), by Linux's /proc: its start in
    ticks since boot against the uptime now; None where there is none. Never later than now (a container
    whose /proc/uptime is its own, as lxcfs gives, would put it in the future)."""
    try:
        with open(f"/proc/{pid}/stat") as stat, open("/proc/uptime") as uptime:
            ticks = int(stat.read().rpartition(")")[2].split()[19])
            since_boot = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    now = time.time()
    return min(now, now - since_boot + ticks / os.sysconf("SC_CLK_TCK"))


@dataclasses.dataclass(frozen=True)
class Span:
    """``part`` held the time from ``start`` to ``end`` (seconds since the epoch)."""

    start: float
    end: float
    part: str

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def to_list(self) -> list:
        return [round(self.start, 3), round(self.end, 3), self.part]

    @classmethod
    def from_list(cls, values: Sequence) -> Span:
        return cls(float(values[0]), float(values[1]), str(values[2]))


# ------------------------------------------------------------------------------------ the training record


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One process's part of a training: its start, its end if it recorded one, its step starts in order
    (``(steps done, when the next began)``) and its spans (device set-up, preparation, custom events)."""

    start: float
    end: float | None
    steps: tuple[tuple[int, float], ...]
    spans: tuple[Span, ...]

    @classmethod
    def of_records(cls, records: Iterable[dict]) -> Attempt:
        """The attempt of one process's records, in the order written: a span's start and its end are two
        records, as the library writes them (a start without its end is left out: the process died in it)."""
        records = list(records)
        start, end, steps, spans = None, None, [], []
        opened: dict[tuple[str, str], float] = {}  # (kind, part) -> its start
        for record in records:
            if JOB_START in record:
                start = float(record[JOB_START])
            elif JOB_END in record:
                end = float(record[JOB_END])
            elif STEP_COUNT in record:
                steps.append((int(record[STEP_COUNT]), float(record[STEP_START])))
            else:
                kind, part, is_start, at = _span_record(record)
                if is_start:
                    opened[(kind, part)] = at
                elif (kind, part) in opened:
                    spans.append(Span(opened.pop((kind, part)), at, part))
        if start is None:
            raise ValueError(f"a goodput record without {JOB_START}: {records[:1]}")
        return cls(start, end, tuple(steps), tuple(spans))

    @property
    def last_time(self) -> float:
        """The last time the attempt recorded: its end, else its latest step or span."""
        if self.end is not None:
            return self.end
        times = [self.start, *(t for _, t in self.steps), *(s.end for s in self.spans)]
        return max(times)


# The part each kind of span is (a custom event's is its type, upper-cased, as the library reports it).
SPAN_PARTS = {"tpu_init": "TPU_INITIALIZATION", "training_prep": "TRAINING_PREP"}


def _span_record(record: dict) -> tuple[str, str, bool, float]:
    """(its kind, its part, whether it starts the span, its time) of a span's start or end record."""
    for kind, keys in SPAN_KEYS.items():
        for is_start, key in zip((True, False), keys, strict=True):
            if key in record:
                part = str(record[CUSTOM_EVENT]).upper() if kind == "custom" else SPAN_PARTS[kind]
                return kind, part, is_start, float(record[key])
    raise ValueError(f"a goodput record of no known kind: {record}")


@dataclasses.dataclass(frozen=True)
class Training:
    """What the attempts' records say, by the library's definitions: the spans of every part, the
    disruptions (when the training restarted, and the steps each cost) and each attempt's window."""

    spans: tuple[Span, ...]
    disruptions: tuple[tuple[float, int], ...]
    start: float
    end: float
    attempts: tuple[tuple[float, float], ...] = ()


def current(attempts: Sequence[Attempt]) -> list[Attempt]:
    """The attempts of the latest training: those after the last one that ended before the newest began
    (an ended training continued later, with a later stop or another target, starts a new account)."""
    attempts = sorted(attempts, key=lambda a: a.start)
    ended = [index for index, attempt in enumerate(attempts[:-1]) if attempt.end is not None]
    return attempts[ended[-1] + 1 :] if ended else attempts


def training(attempts: Sequence[Attempt]) -> Training:
    """The spans of a training's parts from its attempts (in any order)."""
    attempts = sorted(attempts, key=lambda a: a.start)
    spans: list[Span] = []
    disruptions: list[tuple[float, int]] = []
    for index, attempt in enumerate(attempts):
        resumed = next((a for a in attempts[index + 1 :] if a.steps), None)  # the next that trained
        window_end = attempt.last_time
        spans.append(Span(attempt.start, window_end, "OTHER"))
        spans.extend(attempt.spans)
        gaps = [
            (step, begin, end)
            for (step, begin), (next_step, end) in itertools.pairwise(attempt.steps)
            if next_step == step + 1 and end > begin
        ]
        # An attempt that trained and ended without its end (killed, stopped, crashed), and a later one that
        # trained again: a disruption. This one's steps from where that one restarted were trained for
        # nothing; the time from this one's last step start to the start of the one that trained again is the
        # recovery (attempts lost in between included). (An attempt that ended, then continued with a later
        # stop or target, is no disruption.)
        restart = resumed.steps[0][0] if resumed is not None else None
        disrupted = restart is not None and attempt.end is None and bool(attempt.steps)
        wasted = [g for g in gaps if disrupted and g[0] >= restart]
        if disrupted:
            disruptions.append((resumed.start, len(wasted)))
            spans.append(Span(attempt.steps[-1][1], resumed.start, "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"))
        kept = [g for g in gaps if not (disrupted and g[0] >= restart)]
        spans.extend(Span(begin, end, "WASTED_PROGRESS_FROM_DISRUPTION") for _, begin, end in wasted)
        spans.extend(_merged(Span(begin, end, GOODPUT) for _, begin, end in kept))
        if len(kept) > 1:
            # The first step's excess over the mean step, both without the events inside their gaps.
            steps_only = _without_events(kept, attempt.spans)
            excess = steps_only[0] - sum(steps_only[1:]) / (len(kept) - 1)
            if excess > 0:
                spans.append(Span(kept[0][1], kept[0][1] + excess, "PROGRAM_STARTUP"))
    start = attempts[0].start if attempts else 0.0
    end = max((a.last_time for a in attempts), default=start)
    windows = tuple((a.start, a.last_time) for a in attempts)
    return Training(tuple(spans), tuple(disruptions), start, end, windows)


def _without_events(gaps: list[tuple[int, float, float]], events: Sequence[Span]) -> list[float]:
    """Each step gap's seconds (the gaps in time order) less those of the events wholly inside it."""
    seconds = [end - begin for _, begin, end in gaps]
    begins = [begin for _, begin, _ in gaps]
    for event in events:
        index = bisect.bisect_right(begins, event.start) - 1
        if index >= 0 and event.end <= gaps[index][2]:
            seconds[index] -= event.seconds
    return [max(0.0, value) for value in seconds]


def _merged(spans: Iterable[Span]) -> list[Span]:
    """Spans of one part, touching ones joined (a run of steps is one span)."""
    merged: list[Span] = []
    for span in sorted(spans, key=lambda s: s.start):
        if merged and merged[-1].part == span.part and span.start <= merged[-1].end + 1e-6:
            merged[-1] = Span(merged[-1].start, max(merged[-1].end, span.end), span.part)
        else:
            merged.append(span)
    return merged


# ------------------------------------------------------------------------------------------- the account


def partition(spans: Iterable[Span], start: float, end: float) -> list[Span]:
    """``start``-``end`` cut into consecutive spans, each held by the highest-priority part of the spans that
    cover it (``UNACCOUNTED`` where none does); neighbours of one part joined."""
    clipped = [
        Span(max(s.start, start), min(s.end, end), s.part) for s in spans if s.end > start and s.start < end
    ]
    edges = sorted({start, end, *(s.start for s in clipped), *(s.end for s in clipped)})
    by_start = sorted(clipped, key=lambda s: s.start)
    active: list[tuple[float, float, str]] = []  # (priority, end, part), a heap: the winner on top
    result: list[Span] = []
    next_span = 0
    for left, right in itertools.pairwise(edges):
        while next_span < len(by_start) and by_start[next_span].start <= left:
            span = by_start[next_span]
            heapq.heappush(active, (priority(span.part), span.end, span.part))
            next_span += 1
        part = _open_winner(active, left)  # an ended span below the top stays until it surfaces
        result.append(Span(left, right, part))
    return _merged_neighbours(result)


def _open_winner(active: list[tuple[float, float, str]], at: float) -> str:
    while active and active[0][1] <= at:
        heapq.heappop(active)
    return active[0][2] if active else UNACCOUNTED


def _merged_neighbours(spans: list[Span]) -> list[Span]:
    merged: list[Span] = []
    for span in spans:
        if span.end <= span.start:
            continue
        if merged and merged[-1].part == span.part and abs(merged[-1].end - span.start) < 1e-9:
            merged[-1] = Span(merged[-1].start, span.end, span.part)
        else:
            merged.append(span)
    return merged


@dataclasses.dataclass(frozen=True)
class TimeAccount:
    """A run's wall time from ``start`` to ``end`` in parts: ``spans`` (consecutive, one part each) and
    their seconds by part (``parts``, which add up to the wall time).

    Attributes:
      disrupted: the preemptions, crashes and stops the training resumed from, within the account's time:
        when it restarted, and the steps it trained again.
      attempts: a training's account: each attempt's (process's) start and last record.
    """

    start: float
    end: float
    spans: tuple[Span, ...]
    disrupted: tuple[tuple[float, int], ...] = ()
    attempts: tuple[tuple[float, float], ...] = ()

    @classmethod
    def of(
        cls,
        spans: Iterable[Span],
        start: float,
        end: float,
        disrupted: Iterable = (),
        attempts: Iterable = (),
    ) -> TimeAccount:
        within = tuple((float(at), int(steps)) for at, steps in disrupted if start <= at <= end)
        windows = tuple((float(begin), float(last)) for begin, last in attempts)
        return cls(start, end, tuple(partition(spans, start, end)), within, windows)

    @property
    def disruptions(self) -> int:
        return len(self.disrupted)

    @property
    def redone_steps(self) -> int:
        return sum(steps for _, steps in self.disrupted)

    @property
    def wall_seconds(self) -> float:
        return self.end - self.start

    @property
    def parts(self) -> dict[str, float]:
        """Seconds by part, the largest first."""
        totals: dict[str, float] = {}
        for span in self.spans:
            totals[span.part] = totals.get(span.part, 0.0) + span.seconds
        return dict(sorted(totals.items(), key=lambda item: -item[1]))

    @property
    def goodput_seconds(self) -> float:
        return self.parts.get(GOODPUT, 0.0)

    @property
    def goodput(self) -> float:
        """The goodput share of the wall time (0-1)."""
        return self.goodput_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def badput(self) -> dict[str, float]:
        """The other parts' seconds, the largest first."""
        return {part: seconds for part, seconds in self.parts.items() if part != GOODPUT}

    def one_line(self, parts: int = 4) -> str:
        """'goodput 41% of 1m05s: 18.5s Trainer step, ..., 3.0s lost to 1 disruption'."""
        badput = self.badput()
        lost = sum(badput.pop(part, 0.0) for part in DISRUPTION_PARTS)
        items = [(seconds, words(part)) for part, seconds in badput.items()]
        if self.disruptions:
            items.append((lost, f"lost to {console.plural(self.disruptions, 'disruption')}"))
        items.sort(key=lambda item: -item[0])
        said = [f"{console.duration(seconds)} {what}" for seconds, what in items[:parts] if seconds >= 0.05]
        head = f"goodput {self.goodput:.0%} of {console.duration(self.wall_seconds)}"
        return head + (": " + ", ".join(said) if said else "")

    def to_dict(self) -> dict:
        return {
            "start": round(self.start, 3),  # to the millisecond, as the spans: their sum stays the wall time
            "end": round(self.end, 3),
            "wall_seconds": self.wall_seconds,
            "goodput": self.goodput,
            "goodput_seconds": self.goodput_seconds,
            "parts": {part: round(seconds, 3) for part, seconds in self.parts.items()},
            "disruptions": self.disruptions,
            "redone_steps": self.redone_steps,
            "disrupted": [list(item) for item in self.disrupted],
            "attempts": [[round(begin, 3), round(last, 3)] for begin, last in self.attempts],
            "spans": [span.to_list() for span in self.spans],
        }

    @classmethod
    def from_dict(cls, values: dict) -> TimeAccount:
        spans = tuple(Span.from_list(span) for span in values["spans"])
        disrupted = tuple((float(at), int(steps)) for at, steps in values.get("disrupted", ()))
        attempts = tuple((float(begin), float(last)) for begin, last in values.get("attempts", ()))
        return cls(float(values["start"]), float(values["end"]), spans, disrupted, attempts)


def training_account(attempts: Sequence[Attempt], end: float | None = None) -> TimeAccount:
    """The account of the latest training alone (``current``): from its first attempt's start to ``end`` (its
    last record)."""
    found = training(current(attempts))
    return TimeAccount.of(found.spans, found.start, end or found.end, found.disruptions, found.attempts)
