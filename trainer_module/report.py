"""The run report: ``report.html`` with the paper's plots, drawn from a model directory's own files.

Figure 1 of the paper is top-1 against training time; the report draws it from the run's evaluations
(``run_log.jsonl``), with top-5 and the target line, against time since the train-and-eval loop started (the
paper's clock) and against epochs. Then the learning rate (the config's schedule, the values the run
recorded); images/s, when there are enough points for a curve; and the losses, each labelled with what it
includes (the training objective beside its floor, the plain cross-entropy of training batches beside the
evaluation's). The page states the run's state (``run_state``), the settings that differ from the preset,
time to target, peak top-1, replicas and hosts, and, when the pipeline adds it, TFMA's verdict.

Everything is read and written through ``tf.io.gfile``, so ``python -m trainer_module report gs://...``
redraws the report of a finished or running run where it lies. The PNGs sit beside ``report.html``.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import itertools
import json
import math
import os
import socket
import statistics
import textwrap
import time

from effnet_common import console, goodput
from trainer_module import files, recorder, time_report
from trainer_module.recorder import CONFIG_FILE, METRICS_FILE, RUN_LOG_FILE, read_run_log

REPORT_FILE = "report.html"
PLOTS = {
    "accuracy": "report_top1.png",
    "schedule": "report_learning_rate.png",
    "throughput": "report_images_per_second.png",
    "loss": "report_loss.png",
}
# A rate curve needs this many points; with fewer the page gives the figure in words instead.
MIN_RATE_POINTS = 5
# A run written from another host counts as running while its log is younger than this many times the longest
# gap between two of its writes so far (the log is written at the start and at each evaluation).
SILENCE_FACTOR = 2.0


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """What a model directory says about its run (a running one has no metrics yet)."""

    model_dir: str
    config: dict
    plan: dict
    events: list[dict]
    metrics: dict | None
    # The settings a hyperparameter search chose (config.json's "tuned"), already part of ``config``.
    tuned: dict = dataclasses.field(default_factory=dict)

    def of_kind(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]

    @property
    def evaluations(self) -> list[dict]:
        return self.of_kind("eval")

    @property
    def progress(self) -> list[dict]:
        """One record per compiled training call."""
        return self.of_kind("progress")

    @property
    def curve(self) -> list[dict]:
        """The training curves' points, every ``loop.summary_every_steps`` steps (none in logs written before
        the trainer recorded them)."""
        return self.of_kind("train")

    @property
    def last_step(self) -> int:
        steps = [e["step"] for e in self.events if e["event"] in ("progress", "eval", "start")]
        return max(steps, default=0)

    @classmethod
    def read(cls, model_dir: str) -> RunRecord:
        config_path = files.join(model_dir, CONFIG_FILE)
        if not files.exists(config_path):
            raise ValueError(
                f"{model_dir} holds no {CONFIG_FILE}: not the model directory of a trainer_module run"
            )
        saved = files.read_json(config_path)
        log_path = files.join(model_dir, RUN_LOG_FILE)
        events = read_run_log(log_path) if files.exists(log_path) else []
        metrics_path = files.join(model_dir, METRICS_FILE)
        metrics = files.read_json(metrics_path) if files.exists(metrics_path) else None
        return cls(model_dir, saved["config"], saved.get("plan", {}), events, metrics, saved.get("tuned", {}))


# ------------------------------------------------------------------------------------------ the run's state


@dataclasses.dataclass(frozen=True)
class RunState:
    """What the report says of the run: ``label`` ('finished', 'interrupted', 'running', 'stopped', ...), a
    sentence of what it means for the user, and the evidence the rule read."""

    label: str
    summary: str
    evidence: str


def process_alive(pid: int, started_by: float) -> bool:
    """Whether process ``pid`` of this host runs and is the one that wrote at ``started_by`` (a process that
    started later reuses the number)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    started = goodput.process_started(pid)
    return started is None or started <= started_by + 1.0


def _resume_point(record: RunRecord) -> str:
    evaluations = record.evaluations
    if not evaluations:
        return "no checkpoint was written yet: running the same command again starts it over"
    return (
        f"its last checkpoint is step {evaluations[-1]['step']}: running the same command again resumes "
        "from it"
    )


def run_state(record: RunRecord, now: float | None = None, host: str | None = None) -> RunState:
    """The run's state, by this rule, in order:

    1. the run log ends with ``end``: finished (a truncated run, ``loop.stop_at_epoch``, says where);
    2. it ends with ``interrupted`` (the trainer writes it when an exception ends the loop, Ctrl-C included):
       interrupted, with the reason;
    3. otherwise the writer gave no word. The last ``start`` names its host and process: on this host the run
       is running while that process lives, and stopped (killed, out of memory, machine restarted) once it is
       gone. From another host (a Vertex job read from a laptop), or for a log that names no process, the run
       counts as running while its log is younger than ``SILENCE_FACTOR`` times the longest gap between two of
       its writes (the start and each evaluation); older, it has presumably stopped. Before its first
       evaluation there is no gap to go by, and the state is unknown.
    """
    now = time.time() if now is None else now
    host = socket.gethostname() if host is None else host
    events, config = record.events, record.config
    total = record.plan.get("total_steps")
    where = f"step {record.last_step}" + (f" of {total}" if total else "")
    if not events:
        return RunState("not started", "the run log holds no event yet", "no run_log.jsonl")
    last = events[-1]
    if last["event"] == "end":
        stopped = (record.metrics or {}).get("stopped_at_epoch", last.get("stopped_at_epoch"))
        if stopped is not None:
            return RunState(
                "stopped early",
                f"stopped at epoch {stopped} of {config['loop']['train_epochs']} "
                "(truncated: loop.stop_at_epoch)",
                "the run log ends with the run's end",
            )
        return RunState("finished", f"finished at {where}", "the run log ends with the run's end")
    if last["event"] == "interrupted":
        return RunState(
            "interrupted",
            f"interrupted at step {last['step']}: {last['reason']}; {_resume_point(record)}",
            "the run log ends with the trainer's interruption record",
        )
    start = next(e for e in reversed(events) if e["event"] == "start") if record.of_kind("start") else last
    silence = console.duration(now - last["time"])
    if start.get("host") == host and "pid" in start:
        if process_alive(start["pid"], start["time"]):
            return RunState(
                "running",
                f"running, at {where} when last written",
                f"process {start['pid']} on this host runs",
            )
        return RunState(
            "stopped",
            f"stopped without a word, its log ending at {where} (killed, out of memory, or the machine "
            f"restarted); {_resume_point(record)}",
            f"process {start['pid']} on this host, which wrote the log, has ended",
        )
    writes = [e["time"] for e in events[events.index(start) :] if e["event"] in ("start", "eval")]
    gaps = [later - earlier for earlier, later in itertools.pairwise(writes)]
    origin = f"written on {start.get('host', 'an unnamed host')}, last {silence} ago"
    if not gaps:
        return RunState(
            "unknown",
            f"started {silence} ago, no evaluation yet: whether it still runs cannot be told from its log",
            origin,
        )
    longest = max(gaps)
    if now - last["time"] <= SILENCE_FACTOR * longest:
        return RunState(
            "running",
            f"running, at {where} when last written",
            f"{origin}; its longest gap between two writes is {console.duration(longest)}",
        )
    return RunState(
        "stopped",
        f"presumably stopped, its log ending at {where}: nothing written for {silence}, more than "
        f"{SILENCE_FACTOR:g}x the longest gap between two evaluations ({console.duration(longest)}); "
        + _resume_point(record),
        origin,
    )


# ------------------------------------------------------------------------------------------------ the plots


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    _figure().close(figure)
    return buffer.getvalue()


def accuracy_limits(values: list[float], margin: float = 0.08) -> tuple[float, float]:
    """The y range of an accuracy axis: the values (and the target) with a margin of their span on each side,
    so that a line at 1.0 or at the target sits inside the frame, not on it; at least 0.02 high."""
    low, high = min(values), max(values)
    span = max(high - low, 0.02)
    return low - margin * span, high + margin * span


def _accuracy_ticks(axis) -> None:
    """Only ticks an accuracy can take: the margins may reach a little beyond 0 and 1."""
    axis.set_yticks([t for t in axis.get_yticks() if -1e-9 <= t <= 1 + 1e-9])


def _time_axis(seconds: list[float]) -> tuple[float, str]:
    """Divisor and label of the time axis: minutes, or hours for a run of more than two."""
    if max(seconds, default=0) > 2 * 3600:
        return 3600.0, "hours since the train-and-eval loop started"
    return 60.0, "minutes since the train-and-eval loop started"


def accuracy_plot(record: RunRecord) -> bytes:
    """Top-1 and top-5 against time since the loop started and against epochs, zoomed to the data with the
    target line inside the frame; where top-1 first reached the target is marked."""
    plt = _figure()
    figure, (by_time, by_epoch) = plt.subplots(1, 2, figsize=(11, 5))
    evaluations = record.evaluations
    target = record.config["loop"].get("target_top1")
    top1 = [e["top1"] for e in evaluations]
    top5 = [e["top5"] for e in evaluations]
    divisor, time_label = _time_axis([e["elapsed_seconds"] for e in evaluations])
    reached = next((e for e in evaluations if target is not None and e["top1"] >= target), None)
    limits = accuracy_limits(top1 + top5 + ([target] if target is not None else []) or [0.0, 1.0])
    for axis, key, label in (
        (by_time, "elapsed_seconds", time_label),
        (by_epoch, "epoch", "epoch"),
    ):
        scale = divisor if key == "elapsed_seconds" else 1.0
        xs = [e[key] / scale for e in evaluations]
        axis.plot(xs, top1, marker="o", label="top-1")
        axis.plot(xs, top5, marker=".", linestyle="--", label="top-5")
        if target is not None:
            axis.axhline(target, color="grey", linestyle=":", label=f"target {target:g}")
        if reached is not None:
            x = reached[key] / scale
            at = (
                f"{x:.2f} {'h' if divisor == 3600 else 'min'}"
                if key == "elapsed_seconds"
                else f"epoch {x:.1f}"
            )
            axis.plot(
                [x],
                [reached["top1"]],
                marker="*",
                markersize=14,
                color="crimson",
                linestyle="none",
                label=f"target reached: {reached['top1']:.4f} at {at}",
            )
        elif target is not None and top1:
            axis.plot([], [], " ", label=f"target not reached (best {max(top1):.4f})")
        axis.set_xlabel(label)
        axis.set_ylabel("validation accuracy")
        axis.set_ylim(*limits)
        _accuracy_ticks(axis)
        # The epoch axis spans the budget, so a run that stopped early or still runs shows how far it got.
        budget = record.config["loop"].get("stop_at_epoch") or record.config["loop"]["train_epochs"]
        right = max([*xs, budget if key == "epoch" else 0.0], default=1.0)
        axis.set_xlim(left=0, right=right * 1.04 or 1)
        axis.grid(alpha=0.3)
        axis.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize="small")
    figure.suptitle("Top-1 against training time (the paper's Figure 1) and against epochs")
    figure.tight_layout()
    return _png(figure)


def _stop_reason(record: RunRecord, state: RunState) -> str | None:
    """Why the run ends before its schedule does (None when it ran the whole budget)."""
    if state.label == "finished" and (record.metrics or {}).get("target_reached"):
        return "target reached"
    if state.label in ("stopped early", "interrupted", "stopped"):
        return state.label
    return None


def schedule_plot(record: RunRecord, state: RunState) -> bytes:
    """The learning rate over the run's steps (the config's schedule), warmup shaded, the recorded values
    marked, and the step where the run stopped when it stopped before the schedule's end."""
    import numpy as np

    from trainer_module.config import TrainerConfig
    from trainer_module.optim import schedules

    config = TrainerConfig.from_dict(record.config)
    plan = config.plan
    schedule = schedules.build_schedule(config.schedule, plan.peak_learning_rate, plan.schedule_steps)
    steps = np.unique(np.linspace(0, plan.total_steps, num=min(plan.total_steps + 1, 400)).astype(int))
    plt = _figure()
    figure, axis = plt.subplots(figsize=(8, 3.6))
    # The schedules are elementwise: one call draws every step (a call per step is thousands of eager ops).
    axis.plot(steps, schedule(steps).numpy(), label=f"schedule ({config.schedule.kind})")
    recorded = record.curve or record.progress
    if recorded:
        every = f"every {config.loop.summary_every_steps} steps" if record.curve else "each training call"
        axis.plot(
            [p["step"] for p in recorded],
            [p["learning_rate"] for p in recorded],
            ".",
            markersize=4,
            label=f"recorded by the run ({every})",
        )
    if plan.warmup_steps:
        axis.axvspan(
            0, plan.warmup_steps, color="orange", alpha=0.15, label=f"warmup ({plan.warmup_steps} steps)"
        )
    reason = _stop_reason(record, state)
    if reason and record.last_step < plan.total_steps:
        axis.axvline(
            record.last_step, color="crimson", linestyle="--", label=f"{reason} at step {record.last_step}"
        )
    axis.set_xlabel("step")
    axis.set_ylabel("learning rate")
    axis.set_xlim(0, plan.total_steps)
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.legend(fontsize="small")
    figure.tight_layout()
    return _png(figure)


def rate_points(record: RunRecord) -> list[tuple[int, float]]:
    """(step, images/s) of the training curves' points; from a log without them, of each training call but
    the first of each attempt (which traces and compiles)."""
    if record.curve:
        return [(p["step"], p["images_per_second"]) for p in record.curve if p["images_per_second"]]
    points, first = [], True
    for event in record.events:
        if event["event"] == "start":
            first = True
        elif event["event"] == "progress":
            if not first:
                points.append((event["step"], event["images_per_second"]))
            first = False
    return points


def throughput_plot(record: RunRecord) -> bytes | None:
    """Images/s over the run, when it has at least ``MIN_RATE_POINTS`` points (None: too few for a curve).

    Each point is the rate of the steps since the previous one, timed inside the compiled loop: a call's
    tracing and compilation, and the host's work between calls (evaluations, checkpoints) are not in it.
    """
    points = rate_points(record)
    if len(points) < MIN_RATE_POINTS:
        return None
    plt = _figure()
    figure, axis = plt.subplots(figsize=(8, 4.2))
    steps, rates = zip(*points, strict=True)
    axis.plot(steps, rates, marker=".", linewidth=1, label="images/s")
    median = statistics.median(rates)
    axis.axhline(median, color="grey", linestyle=":", label=f"median {median:.0f} images/s")
    for start in record.of_kind("start")[1:]:
        axis.axvline(
            start["step"], color="crimson", linestyle="--", alpha=0.6, label=f"resumed at {start['step']}"
        )
    axis.set_xlabel("step")
    axis.set_ylabel("training images/s")
    axis.set_ylim(0, max(rates) * 1.12)
    axis.grid(alpha=0.3)
    axis.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3)
    figure.tight_layout()
    return _png(figure)


def smoothed_floor(label_smoothing: float, num_classes: int) -> float:
    """The lowest cross-entropy against labels smoothed by ``label_smoothing`` over ``num_classes`` classes
    (the entropy of the smoothed target, reached by predicting it exactly): the training objective cannot go
    below it, however good the model (1.015 for 0.1 over 1000 classes)."""
    if not label_smoothing:
        return 0.0
    other = label_smoothing / num_classes
    right = 1.0 - label_smoothing + other
    return -(right * math.log(right) + (num_classes - 1) * other * math.log(other))


@dataclasses.dataclass(frozen=True)
class LossLabels:
    """What each plotted loss includes, in words, from the run's config."""

    objective: str
    training: str
    evaluation: str
    floor: float

    @classmethod
    def of(cls, config: dict, plan: dict) -> LossLabels:
        optimizer, model = config["optimizer"], config["model"]
        smoothing, classes = optimizer.get("label_smoothing", 0.0), model.get("num_classes", 1000)
        objective = "training objective: cross-entropy"
        if smoothing:
            objective += f" with label smoothing {smoothing:g} over {classes} classes"
        l2 = plan.get("l2_loss_weight", 0.0)
        if l2:
            weights = (
                "every weight but batch norm's" if optimizer.get("l2_includes_biases") else "the kernels"
            )
            objective += f" + {l2:g} x sum of w\u00b2/2 over {weights}"
        elif optimizer.get("name") == "lars" and optimizer.get("weight_decay"):
            objective += " (no L2 term: LARS decays the weights itself)"
        dropout = (
            "dropout on" if plan.get("classifier_dropout") or model.get("drop_connect_rate") else "no dropout"
        )
        averaged = ", averaged weights" if optimizer.get("ema_decay") else ""
        return cls(
            objective=objective,
            training=f"training: plain cross-entropy of the training batches (augmented, {dropout})",
            evaluation=f"evaluation: plain cross-entropy of the validation set (centre crops{averaged})",
            floor=smoothed_floor(smoothing, classes),
        )


def _log_axis(axis) -> None:
    """A log y axis labelled in plain numbers at 1, 2 and 5 of each decade."""
    from matplotlib import ticker

    axis.set_yscale("log")
    axis.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    axis.yaxis.set_minor_formatter(ticker.NullFormatter())
    axis.grid(alpha=0.3, which="both")


def _wrapped(text: str) -> str:
    return textwrap.fill(text, 62)


def loss_plot(record: RunRecord) -> bytes:
    """Two panels against epochs, on log axes (the late part of a run is where losses differ). Left, the
    comparable pair: the plain cross-entropy (no smoothing, no L2) of the training batches and of the
    evaluation. Right, the training objective the gradient follows, with its regularisation term when the loss
    carries one and the floor label smoothing sets under it."""
    labels = LossLabels.of(record.config, record.plan)
    plt = _figure()
    figure, (comparable, objective) = plt.subplots(1, 2, figsize=(12, 5.2))
    curve = record.curve
    if curve:
        comparable.plot(
            [p["epoch"] for p in curve],
            [p["cross_entropy"] for p in curve],
            ".",
            markersize=4,
            label=_wrapped(labels.training),
        )
    comparable.plot(
        [e["epoch"] for e in record.evaluations],
        [e["loss"] for e in record.evaluations],
        marker="o",
        label=_wrapped(labels.evaluation),
    )
    comparable.set_title("cross-entropy: the comparable pair", fontsize="medium")
    comparable.set_ylabel("nats (log scale)")
    recorded = curve or record.progress
    objective.plot(
        [p["epoch"] for p in recorded],
        [p["loss"] for p in recorded],
        ".",
        markersize=4,
        color="C2",
        label=_wrapped(labels.objective),
    )
    if any(p.get("regularisation") for p in curve):
        objective.plot(
            [p["epoch"] for p in curve],
            [p["regularisation"] for p in curve],
            color="C4",
            label="of which the L2 term",
        )
    if labels.floor:
        objective.axhline(
            labels.floor,
            color="grey",
            linestyle=":",
            label=_wrapped(
                f"floor of the smoothed cross-entropy, {labels.floor:.3f}: the objective cannot go below it"
            ),
        )
    objective.set_title("training objective: what the gradient follows", fontsize="medium")
    values = {
        comparable: [p["cross_entropy"] for p in curve] + [e["loss"] for e in record.evaluations],
        objective: [p["loss"] for p in recorded],
    }
    for axis in (comparable, objective):
        axis.set_xlabel("epoch")
        axis.set_xlim(left=0)
        if any(v is not None and v > 0 for v in values[axis]):
            _log_axis(axis)
        else:  # a run resumed at its end trains no step: nothing to draw on a log axis
            axis.text(0.5, 0.5, "no values recorded", transform=axis.transAxes, ha="center", color="grey")
        axis.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.14))
    figure.tight_layout()
    return _png(figure)


# ------------------------------------------------------------------------------------------------- the page


def changed_settings(config: dict) -> dict[str, object]:
    """The settings that differ from the named preset's (the run's ``--set`` overrides, in effect)."""
    from trainer_module import presets

    if config.get("name") not in presets.PRESETS:
        return {}
    base = presets.get_preset(config["name"]).to_dict()
    changed = {}
    for section, values in config.items():
        if isinstance(values, dict):
            for key, value in values.items():
                if base.get(section, {}).get(key) != value:
                    changed[f"{section}.{key}"] = value
    return changed


def _rows(pairs) -> str:
    return "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
        for k, v in pairs
        if v is not None
    )


def _seconds(value) -> str | None:
    return None if value is None else f"{value:.1f} s ({value / 60:.1f} min)"


def _captions(record: RunRecord) -> dict[str, str]:
    """What each figure shows and how to read it."""
    loop = record.config["loop"]
    every = loop.get("summary_every_steps")
    return {
        "accuracy": "Validation top-1 and top-5 at each evaluation; the axis is zoomed to the data and the "
        "target. The star marks the first evaluation at or above the target.",
        "schedule": "The learning rate of the config's schedule at every step of the whole budget; the dots "
        "are the values the run recorded.",
        "throughput": f"Training images/s of the steps between two points (every {every} steps), timed "
        "inside the compiled loop: tracing, compilation, evaluations and checkpoints are left out.",
        "time": time_report.CAPTION,
        "loss": "Left: plain cross-entropy (no label smoothing, no L2) of the training batches and of the "
        "validation set, the comparable pair; training batches are augmented and pass dropout, so they can "
        "sit above evaluation. Right: the loss the gradient follows; label smoothing keeps it above its "
        "floor however good the model, which is why it reads higher than the evaluation loss.",
    }


_STYLE = (
    "body{font-family:sans-serif;max-width:1250px;margin:2em auto}th{text-align:left;padding-right:2em}\n"
    "img{max-width:100%}table{border-collapse:collapse;margin-bottom:1.5em}"
    "figcaption{color:#444;font-size:90%}\n"
)


def render_html(
    record: RunRecord, state: RunState, drawn: dict[str, str | None], pipeline: dict | None = None
) -> str:
    """The page; ``drawn`` maps each plot to its file, or None when there was too little to draw it."""
    metrics = record.metrics or {}
    evaluations = record.evaluations
    peak = max(evaluations, key=lambda e: e["top1"]) if evaluations else None
    rates = [rate for _, rate in rate_points(record)]
    summary = [
        ("preset", record.config.get("name")),
        ("state", state.summary),
        ("how the state was told", f"{state.evidence} (the rule: trainer_module.report.run_state)"),
        (
            "peak top-1",
            f"{peak['top1']:.4f} at epoch {peak['epoch']:.2f}, step {peak['step']}" if peak else None,
        ),
        ("time to peak", _seconds(peak["elapsed_seconds"]) if peak else None),
        ("target top-1", record.config["loop"].get("target_top1")),
        ("target reached", metrics.get("target_reached")),
        ("time to target", _seconds(metrics.get("time_to_target_seconds"))),
        ("replicas", record.plan.get("replicas")),
        ("hosts", record.plan.get("hosts")),
        (
            "images/s, training calls after the first (wall clock, host work between steps included)",
            f"{metrics['images_per_second']:.1f}" if metrics.get("images_per_second") else None,
        ),
        (
            "images/s, the steps alone (median of the curve's points)",
            f"{statistics.median(rates):.1f} over {len(rates)} points" if rates else None,
        ),
        (
            "all-reduce share of a step",
            f"{metrics['allreduce_share']:.3f}" if metrics.get("allreduce_share") else None,
        ),
    ]
    for profile in record.of_kind("profile"):
        summary.append(
            (
                f"profile of steps {profile['first_step']}-{profile['end_step'] - 1}",
                f"{profile['directory']} (TensorBoard's Profile tab, tensorboard-plugin-profile)",
            )
        )
    account = recorder.time_account(metrics)
    if account is not None:
        summary.extend(time_report.summary_rows(account))
        planned = metrics.get(recorder.PLANNED)
        if planned:
            summary.extend(time_report.plan_rows(planned, account, planned.get("held_hours")))
    for key, value in (pipeline or {}).items():
        summary.append((key, value))
    changed = changed_settings(record.config)
    captions = _captions(record)
    figures = []
    # The time account's figure comes second, beside the accuracy's.
    placed = sorted(drawn.items(), key=lambda item: 0.5 if item[0] == "time" else list(PLOTS).index(item[0]))
    for key, name in placed:
        if name is None:
            figures.append(
                f"<p>images/s: {console.plural(len(rates), 'point')} of the curve, too few to "
                f"draw (it takes {MIN_RATE_POINTS}; lower loop.summary_every_steps for more).</p>"
            )
        else:
            figures.append(
                f'<figure><img src="{name}" alt="{key}">'
                f"<figcaption>{html.escape(captions[key])}</figcaption></figure>"
            )
    title = html.escape(str(record.config.get("name")))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>EfficientNet run: {title}</title>
<style>{_STYLE}</style></head>
<body><h1>Run report: {title}</h1>
<p>{html.escape(record.model_dir)}</p>
<table>{_rows(summary)}</table>
<h2>Settings that differ from the preset</h2>
<table>{_rows(sorted(changed.items())) or "<tr><td>none</td></tr>"}</table>
<h2>Settings from hyperparameter tuning</h2>
<table>{_rows(sorted(record.tuned.items())) or "<tr><td>none</td></tr>"}</table>
{"".join(figures)}
<h2>Resolved plan</h2><table>{_rows(record.plan.items())}</table>
<h2>Config</h2><pre>{html.escape(json.dumps(record.config, indent=2, sort_keys=True))}</pre>
</body></html>
"""


def write_report(model_dir: str, pipeline: dict | None = None) -> str:
    """Draws the plots and writes ``report.html`` into ``model_dir``; returns the report's path.

    Args:
      model_dir: a trainer_module model directory (finished, or running: then the plots stop where it is).
      pipeline: extra lines for the summary (the pipeline's TFMA top-1/top-5, blessing, push destination).
    """
    record = RunRecord.read(model_dir)
    state = run_state(record)
    drawings = {
        "accuracy": accuracy_plot(record),
        "schedule": schedule_plot(record, state),
        "throughput": throughput_plot(record),
        "loss": loss_plot(record),
    }
    drawn = {}
    for key, png in drawings.items():
        drawn[key] = None if png is None else PLOTS[key]
        if png is not None:
            files.write_bytes(files.join(model_dir, PLOTS[key]), png)
    path = files.join(model_dir, REPORT_FILE)
    files.write_text(path, render_html(record, state, {**drawn, **_time_drawn(record)}, pipeline))
    return path


def _time_drawn(record: RunRecord) -> dict[str, str]:
    """Draws the figure of the run's time account, when metrics.json has one: {'time': its file}, else {}.
    Drawn at every writing of the report: the pipeline's runner adds the whole run's account after the
    trainer wrote the training's."""
    account = recorder.time_account(record.metrics or {})
    if account is None or account.wall_seconds <= 0:
        return {}
    files.write_bytes(files.join(record.model_dir, time_report.PLOT), time_report.time_plot(account))
    return {"time": time_report.PLOT}


def add_pipeline_lines(model_dir: str, pipeline: dict) -> str:
    """Writes ``report.html`` of a run again with the pipeline's lines added, keeping the plots its trainer
    drew: they come from the run's own files, which the pipeline's later steps leave as they were. A run
    without a report yet, or missing a plot that is always drawn (all but the rate curve), gets the whole one
    (``write_report``). Returns the report's path."""
    path = files.join(model_dir, REPORT_FILE)
    drawn = {key: name if files.exists(files.join(model_dir, name)) else None for key, name in PLOTS.items()}
    if not files.exists(path) or any(name is None for key, name in drawn.items() if key != "throughput"):
        return write_report(model_dir, pipeline)
    record = RunRecord.read(model_dir)
    files.write_text(path, render_html(record, run_state(record), {**drawn, **_time_drawn(record)}, pipeline))
    return path


def self_contained_report(model_dir: str) -> str:
    """``report.html`` of ``model_dir`` with its plots inlined as ``data:`` URIs: one file that shows whole
    where nothing beside it can be fetched (a pipeline run page's HTML view, which renders the file alone)."""
    text = files.read_text(files.join(model_dir, REPORT_FILE))
    for name in [*PLOTS.values(), time_report.PLOT]:
        source = f'src="{name}"'
        path = files.join(model_dir, name)
        if source in text and files.exists(path):
            data = base64.b64encode(files.read_bytes(path)).decode("ascii")
            text = text.replace(source, f'src="data:image/png;base64,{data}"')
    return text
