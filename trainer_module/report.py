"""The run report: ``report.html`` with the paper's plots, drawn from a model directory's own files.

Figure 1 of the paper is top-1 against training time; the report draws it from the run's evaluations
(``run_log.jsonl`` / ``metrics.json``), with top-5 and the target line, against time (from the start of the
train-and-eval loop, the paper's clock) and against epochs; the learning-rate schedule over the run with the
end of warmup marked (the config's schedule, evaluated at every step); images/s of each training loop call;
and the evaluation loss. The page states the config (preset and the settings that differ from it), time to
target, peak top-1, replicas and hosts, and, when the pipeline adds it, TFMA's verdict.

Everything is read and written through ``tf.io.gfile``, so ``python -m trainer_module report gs://...``
redraws the report of a finished or running run where it lies. The PNGs sit beside ``report.html``.
"""

from __future__ import annotations

import dataclasses
import html
import io
import json

from trainer_module import files
from trainer_module.recorder import CONFIG_FILE, METRICS_FILE, RUN_LOG_FILE, read_run_log

REPORT_FILE = "report.html"
PLOTS = {
    "accuracy": "report_top1.png",
    "schedule": "report_learning_rate.png",
    "throughput": "report_images_per_second.png",
    "loss": "report_eval_loss.png",
}


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

    @property
    def evaluations(self) -> list[dict]:
        return [e for e in self.events if e["event"] == "eval"]

    @property
    def progress(self) -> list[dict]:
        return [e for e in self.events if e["event"] == "progress"]

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


def accuracy_plot(record: RunRecord) -> bytes:
    """Top-1 and top-5 against time since the loop started and against epochs, with the target line."""
    plt = _figure()
    figure, (by_time, by_epoch) = plt.subplots(1, 2, figsize=(11, 4))
    evaluations = record.evaluations
    minutes = [e["elapsed_seconds"] / 60 for e in evaluations]
    epochs = [e["epoch"] for e in evaluations]
    target = record.config["loop"].get("target_top1")
    for axis, xs, label in (
        (by_time, minutes, "minutes since the train-and-eval loop started"),
        (by_epoch, epochs, "epoch"),
    ):
        axis.plot(xs, [e["top1"] for e in evaluations], marker="o", label="top-1")
        axis.plot(xs, [e["top5"] for e in evaluations], marker=".", linestyle="--", label="top-5")
        if target is not None:
            axis.axhline(target, color="grey", linestyle=":", label=f"target {target:g}")
        axis.set_xlabel(label)
        axis.set_ylabel("validation accuracy")
        axis.set_ylim(0, 1)
        axis.set_xlim(left=0)
        axis.grid(alpha=0.3)
        axis.legend(loc="lower right")
    figure.suptitle("Top-1 against training time (the paper's Figure 1) and against epochs")
    figure.tight_layout()
    return _png(figure)


def schedule_plot(record: RunRecord) -> bytes:
    """The learning rate over the run's steps (the config's schedule), warmup shaded, logged values marked."""
    import numpy as np

    from trainer_module import schedules
    from trainer_module.config import TrainerConfig

    config = TrainerConfig.from_dict(record.config)
    plan = config.plan
    schedule = schedules.build_schedule(config.schedule, plan.peak_learning_rate, plan.schedule_steps)
    steps = np.unique(np.linspace(0, plan.total_steps, num=min(plan.total_steps + 1, 400)).astype(int))
    plt = _figure()
    figure, axis = plt.subplots(figsize=(7, 3.5))
    axis.plot(steps, [float(schedule(int(s))) for s in steps], label=f"schedule ({config.schedule.kind})")
    progress = record.progress
    if progress:
        axis.plot([p["step"] for p in progress], [p["learning_rate"] for p in progress], ".", label="logged")
    if plan.warmup_steps:
        axis.axvspan(
            0, plan.warmup_steps, color="orange", alpha=0.15, label=f"warmup ({plan.warmup_steps} steps)"
        )
    axis.set_xlabel("step")
    axis.set_ylabel("learning rate")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    return _png(figure)


def throughput_plot(record: RunRecord) -> bytes:
    """Images/s of each compiled training call (the first includes tracing and compilation)."""
    plt = _figure()
    figure, axis = plt.subplots(figsize=(7, 3.5))
    progress = record.progress
    axis.plot([p["step"] for p in progress], [p["images_per_second"] for p in progress], marker=".")
    axis.set_xlabel("step")
    axis.set_ylabel("images/s (training loop call)")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    return _png(figure)


def loss_plot(record: RunRecord) -> bytes:
    """Evaluation loss (and the training loss of each loop call) against epochs."""
    plt = _figure()
    figure, axis = plt.subplots(figsize=(7, 3.5))
    axis.plot(
        [p["epoch"] for p in record.progress],
        [p["loss"] for p in record.progress],
        ".",
        alpha=0.5,
        label="training",
    )
    axis.plot(
        [e["epoch"] for e in record.evaluations],
        [e["loss"] for e in record.evaluations],
        marker="o",
        label="evaluation",
    )
    axis.set_xlabel("epoch")
    axis.set_ylabel("cross-entropy")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    return _png(figure)


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


def render_html(record: RunRecord, pipeline: dict | None = None) -> str:
    metrics = record.metrics or {}
    evaluations = record.evaluations
    peak = max(evaluations, key=lambda e: e["top1"]) if evaluations else None
    state = "finished" if record.metrics else "running (no metrics.json yet)"
    if metrics.get("stopped_at_epoch") is not None:
        state = f"stopped at epoch {metrics['stopped_at_epoch']} of {record.config['loop']['train_epochs']} (truncated)"
    summary = [
        ("preset", record.config.get("name")),
        ("state", state),
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
            "images/s (after the first call)",
            f"{metrics['images_per_second']:.1f}" if metrics.get("images_per_second") else None,
        ),
        (
            "all-reduce share of a step",
            f"{metrics['allreduce_share']:.3f}" if metrics.get("allreduce_share") else None,
        ),
    ]
    for profile in (e for e in record.events if e["event"] == "profile"):
        summary.append(
            (
                f"profile of steps {profile['first_step']}-{profile['end_step'] - 1}",
                f"{profile['directory']} (TensorBoard's Profile tab, tensorboard-plugin-profile)",
            )
        )
    for key, value in (pipeline or {}).items():
        summary.append((key, value))
    changed = changed_settings(record.config)
    images = "".join(f'<figure><img src="{name}" alt="{key}"></figure>' for key, name in PLOTS.items())
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>EfficientNet run: {html.escape(str(record.config.get('name')))}</title>
<style>body{{font-family:sans-serif;max-width:1150px;margin:2em auto}}th{{text-align:left;padding-right:2em}}
img{{max-width:100%}}table{{border-collapse:collapse;margin-bottom:1.5em}}</style></head>
<body><h1>Run report: {html.escape(str(record.config.get('name')))}</h1>
<p>{html.escape(record.model_dir)}</p>
<table>{_rows(summary)}</table>
<h2>Settings that differ from the preset</h2>
<table>{_rows(sorted(changed.items())) or '<tr><td>none</td></tr>'}</table>
<h2>Settings from hyperparameter tuning</h2>
<table>{_rows(sorted(record.tuned.items())) or '<tr><td>none</td></tr>'}</table>
{images}
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
    drawings = {
        "accuracy": accuracy_plot,
        "schedule": schedule_plot,
        "throughput": throughput_plot,
        "loss": loss_plot,
    }
    for key, draw in drawings.items():
        files.write_bytes(files.join(model_dir, PLOTS[key]), draw(record))
    path = files.join(model_dir, REPORT_FILE)
    files.write_text(path, render_html(record, pipeline))
    return path
