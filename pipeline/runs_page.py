"""The page of a pipeline root's runs: each local run adds a row, and ``runs/index.html`` lists them, newest
first.

A run's report lives in its Trainer's artifact directory; this page is where a root's runs are seen together:
when each started, its preset and target, the Evaluator's top-1 and top-5, the Trainer's epochs and training
time, its goodput (where its time went, from the run's time account, ``effnet_common.goodput``), whether the
model was blessed (or why not, or that the run failed or was stopped), the version pushed, and links to its
report and TensorBoard.

The rows are kept as JSON lines in ``runs/runs.jsonl`` beside the page, which is drawn from them after every
run. Both files are written whole (``effnet_common.whole``), so a run stopped while writing leaves the
previous ones; a line that is not a row (a hand edit) is left out with a warning and a note on the page. The
page is one self-contained HTML file (inline CSS, no script) whose links under the root are relative, so the
root can be copied and browsed. Paths go through ``effnet_common.storage`` (the root is a local directory),
with no Beam or TensorFlow import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import json
import logging
import pathlib
import posixpath
import time
import typing
import urllib.parse
from collections.abc import Iterator, Sequence

from effnet_common import console, stopping, storage
from effnet_common.goodput import TimeAccount

if typing.TYPE_CHECKING:
    from pipeline.outcome import Outcome

logger = logging.getLogger(__name__)

RUNS_DIR = "runs"
ROWS_FILE = "runs.jsonl"
PAGE_FILE = "index.html"
# How a run ended: it ran to the Evaluator's verdict, a step failed, or Ctrl-C stopped it.
FINISHED, FAILED, STOPPED = STATES = "finished", "failed", "stopped"


@dataclasses.dataclass(frozen=True)
class Row:
    """One run of a pipeline root, as its row of ``runs.jsonl`` holds it.

    Attributes:
      preset / target_top1: what the run was asked for (the target as the run resolved it).
      started: when the run started, in seconds since the epoch.
      state: ``FINISHED``, ``FAILED`` or ``STOPPED``.
      blessed: whether the Evaluator blessed the model (a finished run).
      why_not: why it was not: the failed blessing conditions, or the failure's first line.
      top1 / top5: the Evaluator's (TFMA's) on the validation split.
      epochs / training_seconds: where the Trainer's last evaluation was, on the paper's clock (metrics.json).
      goodput / time_account_line: the share (0-1) of the run's time that went to training steps that count
        toward the model, and the one-line account of where it went (``TimeAccount.one_line``), by the run's
        time account in metrics.json, else the training's; None without one (or in a row written before).
      pushed_destination: where the Pusher put the model (the version's directory); None when nothing was.
      pushed_before: the push is an earlier run's (the Pusher's execution was cached).
      report: the path of the run's report.html; tensorboard: the command that shows its curves.
    """

    preset: str
    target_top1: float
    started: float = dataclasses.field(default_factory=time.time)
    state: str = FINISHED
    blessed: bool = False
    why_not: str = ""
    top1: float | None = None
    top5: float | None = None
    epochs: float | None = None
    training_seconds: float | None = None
    goodput: float | None = None
    time_account_line: str | None = None
    pushed_destination: str | None = None
    pushed_before: bool = False
    report: str | None = None
    tensorboard: str | None = None

    @classmethod
    def from_dict(cls, values: dict) -> Row:
        """The row of a ``runs.jsonl`` line; ValueError when its fields are not a row's."""
        types = typing.get_type_hints(cls)
        unknown = set(values) - set(types)
        if unknown:
            raise ValueError(f"not fields of a row: {', '.join(sorted(unknown))}")
        for field in dataclasses.fields(cls):
            value = values.get(field.name, field.default)
            if value is dataclasses.MISSING or not _is_a(value, types[field.name]):
                raise ValueError(f"{field.name}: {value!r} is not a {types[field.name]}")
        if values.get("state", FINISHED) not in STATES:
            raise ValueError(f"state: {values['state']!r} is not one of {', '.join(STATES)}")
        return cls(**values)


def _is_a(value, kind) -> bool:
    """``isinstance`` as JSON gives numbers: an int stands for a float (a target of 1), a bool for neither."""
    if isinstance(value, bool):
        return kind is bool
    if isinstance(value, int) and float in (kind, *typing.get_args(kind)):
        return True
    return isinstance(value, kind)


def finished(
    row: Row,
    result: Outcome,
    report: str | None,
    tensorboard: str | None,
    pushed_before: bool,
    account: TimeAccount | None = None,
) -> Row:
    """``row`` once the run ended with ``result`` (``pipeline.outcome``), its report and TensorBoard command
    (as the runner printed them), whether the Pusher was cached, and the run's time account (its goodput and
    one-line account; a run whose Trainer was cached has its own, not the training run's)."""
    epochs, seconds = _training(result.model_run_uri) if result.model_run_uri else (None, None)
    return dataclasses.replace(
        row,
        blessed=result.blessed,
        why_not="; ".join(result.refusals),
        top1=result.top1,
        top5=result.top5,
        epochs=epochs,
        training_seconds=seconds,
        goodput=None if account is None else account.goodput,
        time_account_line=None if account is None else account.one_line(),
        pushed_destination=result.pushed_destination if result.pushed else None,
        pushed_before=pushed_before and result.pushed,
        report=report,
        tensorboard=tensorboard,
    )


def _training(model_run_uri: str) -> tuple[float | None, float | None]:
    """The epoch and the training time (the train-and-eval loop's clock, over resumed attempts) of the last
    evaluation the Trainer recorded."""
    from trainer_module.tuning.trials import read_evaluations

    history = read_evaluations(model_run_uri)
    if not history:
        return None, None
    return history[-1]["epoch"], history[-1]["elapsed_seconds"]


@contextlib.contextmanager
def unfinished(root: str, row: Row) -> Iterator[None]:
    """A run that ends inside the block still adds its row: failed, with the error's first line, or stopped.

    Ctrl-C ends the process from ``effnet_common.stopping``'s thread without unwinding the block: the row is
    added by the stop's clean-up, after those of the step that was running.
    """
    try:
        with stopping.cleanup(lambda: add(root, dataclasses.replace(row, state=STOPPED))):
            yield
    except Exception as error:
        try:
            add(root, dataclasses.replace(row, state=FAILED, why_not=console.one_line(error)))
        except OSError:  # the run's own error is the one to report
            logger.warning("the failed run's row could not be added to the runs page", exc_info=True)
        raise


def page_path(root: str) -> str:
    return storage.join(root, RUNS_DIR, PAGE_FILE)


def add(root: str, row: Row) -> str:
    """Appends ``row`` to the root's ``runs.jsonl`` and draws the page again; returns the page's path."""
    path = storage.join(root, RUNS_DIR, ROWS_FILE)
    text = _read(path)
    if text and not text.endswith("\n"):
        text += "\n"  # a last line cut short stays a line of its own, left out as broken
    text += json.dumps(dataclasses.asdict(row)) + "\n"
    storage.write_text(path, text)
    rows, skipped = parse_rows(text)
    storage.write_text(page_path(root), render(rows, root, skipped))
    return page_path(root)


def _read(path: str) -> str:
    """The file's text; "" when there is none yet (the root is a local directory: a missing file is one)."""
    try:
        return storage.read_text(path)
    except FileNotFoundError:
        return ""


def parse_rows(text: str) -> tuple[list[Row], list[int]]:
    """The rows of a ``runs.jsonl``'s text, and the numbers of the lines that are not rows (with a
    warning)."""
    rows, skipped = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            values = json.loads(line)
            if not isinstance(values, dict):
                raise ValueError("not a JSON object")
            rows.append(Row.from_dict(values))
        except ValueError as e:  # json.JSONDecodeError included
            logger.warning("%s line %d is not a run's row, left out: %s", ROWS_FILE, number, e)
            skipped.append(number)
    return rows, skipped


# ------------------------------------------------------------------------------------------------- the page


def newest_first(rows: list[Row]) -> list[Row]:
    """By start time, newest first; of two that started together, the one added last first."""
    return list(reversed(sorted(rows, key=lambda row: row.started)))


def _number(value: float | None, spec: str = ".4f") -> str:
    return "" if value is None else format(value, spec)


def _verdict(row: Row) -> tuple[str, str]:
    """(the class of the verdict's cell, its text)."""
    if row.state == STOPPED:
        return "stopped", stopping.STOPPED
    if row.state == FAILED:
        return "failed", f"failed: {row.why_not}"
    if row.blessed:
        return "blessed", "blessed"
    return "refused", "not blessed" + (f": {row.why_not}" if row.why_not else "")


def _href(path: str, root: str) -> str:
    """A link to ``path`` from the page: relative when it lies under ``root``, else absolute."""
    if "://" in path:
        return path
    if path.startswith(root.rstrip("/") + "/"):
        return urllib.parse.quote(posixpath.relpath(path, storage.join(root, RUNS_DIR)))
    return pathlib.PurePosixPath(path).as_uri()


def _pushed(row: Row) -> str:
    if row.pushed_destination is None:
        return ""
    version = html.escape(posixpath.basename(row.pushed_destination.rstrip("/")))
    again = ' <span class="note">(pushed before)</span>' if row.pushed_before else ""
    return f'<span title="{html.escape(row.pushed_destination)}">{version}</span>{again}'


def _goodput(row: Row) -> str:
    """The goodput as a percentage, the one-line account as its title."""
    if row.goodput is None:
        return ""
    share = format(row.goodput, ".0%")
    if not row.time_account_line:
        return share
    return f'<span title="{html.escape(row.time_account_line)}">{share}</span>'


def _links(row: Row, root: str) -> tuple[str, str]:
    """The report's link and the TensorBoard command (folded: it is long) of a row."""
    report = f'<a href="{html.escape(_href(row.report, root))}">report</a>' if row.report else ""
    tensorboard = ""
    if row.tensorboard:
        tensorboard = (
            f"<details><summary>command</summary><code>{html.escape(row.tensorboard)}</code></details>"
        )
    return report, tensorboard


def _row_html(row: Row, root: str) -> str:
    kind, verdict = _verdict(row)
    report, tensorboard = _links(row, root)
    seconds = "" if row.training_seconds is None else console.duration(row.training_seconds)
    cells = [
        html.escape(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.started))),
        html.escape(row.preset),
        _number(row.target_top1),
        _number(row.top1),
        _number(row.top5),
        _number(row.epochs, ".2f"),
        seconds,
        _goodput(row),
        f'<span class="{kind}">{html.escape(verdict)}</span>',
        _pushed(row),
        report,
        tensorboard,
    ]
    return "<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>"


HEADINGS = (
    "started",
    "preset",
    "target top-1",
    "top-1",
    "top-5",
    "epochs",
    "training time",
    "goodput",
    "blessed?",
    "pushed version",
    "report",
    "TensorBoard",
)
STYLE = """body{font-family:sans-serif;margin:2em;color:#222}
table{border-collapse:collapse}th,td{padding:.35em .8em;border-bottom:1px solid #ddd;\
text-align:left;vertical-align:top}
th{background:#f2f2f2}:is(th,td):nth-child(n+3):nth-child(-n+8){text-align:right;\
font-variant-numeric:tabular-nums}
.blessed{color:#17692b;font-weight:bold}.refused{color:#a35a00}.failed{color:#b00020;font-weight:bold}
.stopped,.note,.intro{color:#666}td:first-child{white-space:nowrap}td:empty::after{content:"–";color:#bbb}
code{font-size:90%;word-break:break-all}td code{user-select:all}summary{cursor:pointer;color:#1a56c4}"""


def render(rows: list[Row], root: str, skipped: Sequence[int] = ()) -> str:
    """The page of ``rows`` (a root's), newest first; ``skipped``: the numbers of the lines left out."""
    body = "".join(_row_html(row, root) for row in newest_first(rows))
    note = ""
    if skipped:
        lines = ", ".join(map(str, skipped))
        note = f'<p class="note">{ROWS_FILE}: left out line(s) {lines}, which are not rows of a run.</p>'
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Runs of {html.escape(root)}</title><style>{STYLE}</style></head>
<body><h1>Runs of {html.escape(root)}</h1>
<p class="intro">{console.plural(len(rows), "run")}, newest first: each run of \
<code>python -m pipeline.local_runner
--pipeline-root {html.escape(root)}</code> adds its row to {ROWS_FILE} beside this page. \
Top-1 and top-5 are the
Evaluator's on the validation split; epochs and training time are where the Trainer's last evaluation was;
goodput is the share of the run's time that went to training steps that count toward the model (hover over it
for where the rest went).</p>
<table><thead><tr>{"".join(f"<th>{heading}</th>" for heading in HEADINGS)}</tr></thead>
<tbody>{body}</tbody></table>{note}
</body></html>
"""
