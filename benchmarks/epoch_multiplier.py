"""The large-batch study's third design: k, how many times the epochs 16x the batch needs to end where the small
batch ends.

The second design (``large_batch_study.DESIGN``) asked a yes/no question at 72 epochs and its rule computed
"budget-limited". This design measures instead. Every run is LARS at the peak LR both grids picked (4), with
everything else as in the second design; the small batch is trained to the end of several short schedules, the
large batch of several long ones, and each large-batch level (its mean end-of-schedule top-1 at 72, 144 and 288
epochs) is placed on the small batch's curve of end-of-schedule top-1 against epochs, interpolated linearly in
log epochs between the two budgets that bracket it. k at a level is the large batch's epochs divided by the
small batch's epochs to the same top-1. The finding follows a rule fixed before the runs (``MultiplierDesign``),
at the highest level the large batch reached.

This module holds the design, the arithmetic and the report section; ``large_batch_study.py`` trains the runs
(``--multiplier``) and writes them into the same results file, beside the second design's runs, some of which
this design reuses (the 72- and 36-epoch small-batch runs, the 72- and 144-epoch large-batch runs).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

FINDINGS = ("equal-epoch scaling holds", "needs more epochs", "undecided")


@dataclasses.dataclass(frozen=True)
class MultiplierDesign:
    """What the epoch-multiplier study runs and how it decides, fixed before its runs.

    Attributes:
      small_batch / large_batch / middle_batch: the global batches (256, 4096 and one between them).
      lr: every run's peak LR (the pick of both grids of the second design).
      small_budgets: the small batch's new schedule lengths in epochs.
      reused_small_budgets: the second design's schedule lengths of the small batch, whose runs count here.
      small_seeds: seeds of every small-batch budget.
      large_epochs / large_seeds: the large batch's new schedule length and its seeds (beside 72 and 144).
      middle_epochs / middle_seeds: the middle batch's schedule length and seeds.
      max_extensions: budgets the small batch adds, halving below its shortest or doubling above its longest,
        until every large-batch level is bracketed by its budgets' means (each way at most this many times).
      holds_at_most: k at or under which equal-epoch scaling holds on this proxy.
      more_epochs_from: k at or over which the large batch needs more epochs.
      target_top1: the fixed top-1 of the steps-to-target measure (from end-of-schedule results).
      interval: coverage of k's bootstrap interval over seeds; bootstrap_samples, bootstrap_seed: its draws.
    """

    small_batch: int = 256
    middle_batch: int = 1024
    large_batch: int = 4096
    lr: float = 4.0
    small_budgets: tuple[int, ...] = (4, 8, 16)
    reused_small_budgets: tuple[int, ...] = (36, 72)
    small_seeds: int = 3
    large_epochs: int = 288
    large_seeds: int = 2
    middle_epochs: int = 72
    middle_seeds: int = 3
    max_extensions: int = 2
    holds_at_most: float = 1.3
    more_epochs_from: float = 2.0
    target_top1: float = 0.85
    interval: float = 0.90
    bootstrap_samples: int = 4000
    bootstrap_seed: int = 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


MULTIPLIER = MultiplierDesign()


# ------------------------------------------------------------------------------------------- the arithmetic


def end_of_schedule(runs: dict[str, dict], batch: int, lr: float) -> dict[int, list[float]]:
    """Epochs -> the final top-1 of each finished run of ``batch`` at ``lr`` on the test split (every seed;
    a diverged run counts as 0.0), from every design's runs."""
    curve: dict[int, list[float]] = {}
    for run in sorted(runs.values(), key=lambda r: (r["epochs"], r["seed"])):
        if run["kind"] == "grid" or run["batch"] != batch or run["lr"] != lr:
            continue
        curve.setdefault(run["epochs"], []).append(0.0 if run["diverged"] else run["final_top1"])
    return curve


def epochs_to_reach(curve: dict[int, float], level: float) -> tuple[float | None, str]:
    """The epochs at which a curve of mean end-of-schedule top-1 first reaches ``level``, interpolated
    linearly in log epochs between the two budgets that bracket it.

    Returns ``(epochs, "inside")``; or ``(None, "below")`` when the shortest budget already ends at or above the
    level (fewer epochs than that would do), ``(None, "above")`` when no budget reaches it.
    """
    budgets = sorted(curve)
    if not budgets:
        return None, "above"
    if curve[budgets[0]] >= level:
        return None, "below"
    for shorter, longer in zip(budgets, budgets[1:], strict=False):
        low, high = curve[shorter], curve[longer]
        if low < level <= high:
            share = (level - low) / (high - low)
            return math.exp(math.log(shorter) + share * (math.log(longer) - math.log(shorter))), "inside"
    return None, "above"


def multiplier(large_epochs: int, small_curve: dict[int, float], level: float) -> dict:
    """k at one large-batch level: its epochs over the small batch's epochs to the same top-1; where the level
    lies outside the small batch's budgets, the bound k is known to satisfy instead."""
    epochs, where = epochs_to_reach(small_curve, level)
    budgets = sorted(small_curve)
    if where == "inside":
        return {"k": large_epochs / epochs, "small_epochs": epochs, "bound": None}
    if where == "below":  # the small batch needs fewer epochs than its shortest budget: k is larger than this
        return {
            "k": None,
            "small_epochs": None,
            "bound": [">", large_epochs / budgets[0]] if budgets else None,
        }
    return {"k": None, "small_epochs": None, "bound": ["<", large_epochs / budgets[-1]] if budgets else None}


def _means(curve: dict[int, list[float]]) -> dict[int, float]:
    return {epochs: float(np.mean(values)) for epochs, values in curve.items() if values}


def bootstrap_interval(
    design: MultiplierDesign, large_epochs: int, large: list[float], small: dict[int, list[float]]
) -> list[float] | None:
    """A percentile bootstrap interval of k: seeds resampled with replacement within every budget of the small
    batch and within the large level; None when fewer than 2 seeds anywhere or k is undefined in more than
    one draw in twenty."""
    if len(large) < 2 or any(len(v) < 2 for v in small.values()):
        return None
    rng = np.random.default_rng(design.bootstrap_seed)
    draws = []
    for _ in range(design.bootstrap_samples):
        level = float(np.mean(rng.choice(large, len(large))))
        curve = {e: float(np.mean(rng.choice(v, len(v)))) for e, v in small.items()}
        draws.append(multiplier(large_epochs, curve, level)["k"])
    defined = [k for k in draws if k is not None]
    if len(defined) < 0.95 * len(draws):
        return None
    tail = (1.0 - design.interval) / 2 * 100
    return [float(np.percentile(defined, tail)), float(np.percentile(defined, 100 - tail))]


def finding(design: MultiplierDesign, level: dict | None) -> str:
    """The rule fixed before the runs, on k at the highest level the large batch reached (or its bound)."""
    if level is None:
        return "undecided"
    k, bound = level["k"], level["bound"]
    if k is not None:
        if k <= design.holds_at_most:
            return FINDINGS[0]
        return FINDINGS[1] if k >= design.more_epochs_from else FINDINGS[2]
    if bound is not None and bound[0] == ">" and bound[1] >= design.more_epochs_from:
        return FINDINGS[1]
    if bound is not None and bound[0] == "<" and bound[1] <= design.holds_at_most:
        return FINDINGS[0]
    return FINDINGS[2]


def small_budgets_needed(design: MultiplierDesign, runs: dict[str, dict]) -> list[int]:
    """The small batch's budgets to run: the design's and the second design's, extended (halving below the
    shortest, doubling above the longest, each way at most ``max_extensions`` times in all) until every
    large-batch level lies between the means of two budgets. An extension waits until every seed of the
    budget it extends from is in."""
    planned = sorted(set(design.small_budgets) | set(design.reused_small_budgets))
    small = end_of_schedule(runs, design.small_batch, design.lr)
    budgets = sorted(set(planned) | {e for e in small if e < planned[0] or e > planned[-1]})
    large = _means(end_of_schedule(runs, design.large_batch, design.lr))
    if not large:
        return budgets
    means = {e: float(np.mean(v)) for e, v in small.items() if len(v) >= design.small_seeds}
    lowest, highest = min(large.values()), max(large.values())
    shortest, longest = budgets[0], budgets[-1]
    below = sum(e < planned[0] for e in budgets)
    if below < design.max_extensions and shortest > 1 and means.get(shortest, -1.0) >= lowest:
        budgets.insert(0, shortest // 2)
    above = sum(e > planned[-1] for e in budgets)
    if above < design.max_extensions and longest in means and means[longest] < highest:
        budgets.append(2 * longest)
    return budgets


def summarise(design: MultiplierDesign, runs: dict[str, dict], steps_per_epoch) -> dict:
    """``summary.epoch_multiplier``: every batch's end-of-schedule curve, k at each large-batch level (with its
    interval), k of the middle batch, the finding, and steps to the target top-1."""
    curves = {
        b: end_of_schedule(runs, b, design.lr)
        for b in (design.small_batch, design.middle_batch, design.large_batch)
    }
    small = curves[design.small_batch]
    small_means = _means(small)
    levels = []
    for epochs, values in sorted(curves[design.large_batch].items()):
        level = float(np.mean(values))
        entry = {
            "large_epochs": epochs,
            "seeds": len(values),
            "top1_each": values,
            "top1_mean": level,
            **multiplier(epochs, small_means, level),
        }
        entry["k_interval"] = bootstrap_interval(design, epochs, values, small)
        levels.append(entry)
    middle = []
    for epochs, values in sorted(curves[design.middle_batch].items()):
        level = float(np.mean(values))
        middle.append({"epochs": epochs, "seeds": len(values), "top1_each": values, "top1_mean": level,
                       **multiplier(epochs, small_means, level),
                       "k_interval": bootstrap_interval(design, epochs, values, small)})  # fmt: skip
    highest = levels[-1] if levels else None
    steps = {}
    for batch, curve in curves.items():
        epochs, where = epochs_to_reach(_means(curve), design.target_top1)
        budgets = sorted(curve)
        steps[str(batch)] = {
            "epochs": epochs,
            "steps": None if epochs is None else epochs * steps_per_epoch(batch),
            "where": where,
            # Outside the measured budgets only a bound is known: at most the shortest ("below"), more than the
            # longest ("above").
            "bound_steps": (
                None
                if where == "inside" or not budgets
                else ["<=", budgets[0] * steps_per_epoch(batch)]
                if where == "below"
                else [">", budgets[-1] * steps_per_epoch(batch)]
            ),
        }
    return {
        "design": design.to_dict(),
        "curves": {str(b): {str(e): v for e, v in sorted(c.items())} for b, c in curves.items()},
        "levels": levels,
        "middle_batch": middle,
        "k": None if highest is None else highest["k"],
        "k_bound": None if highest is None else highest["bound"],
        "k_interval": None if highest is None else highest["k_interval"],
        "at_large_epochs": None if highest is None else highest["large_epochs"],
        "finding": finding(design, highest),
        "complete": _complete(design, runs),
        "steps_to_target": {"target_top1": design.target_top1, "by_batch": steps},
    }


def _complete(design: MultiplierDesign, runs: dict[str, dict]) -> bool:
    def seeds(batch, epochs):
        return len(end_of_schedule(runs, batch, design.lr).get(epochs, []))

    small = all(
        seeds(design.small_batch, e) >= design.small_seeds for e in small_budgets_needed(design, runs)
    )
    large = seeds(design.large_batch, design.large_epochs) >= design.large_seeds
    return small and large and seeds(design.middle_batch, design.middle_epochs) >= design.middle_seeds


# ------------------------------------------------------------------------------------------- the report


def design_section(design: MultiplierDesign, cost: dict | None = None) -> str:
    d = design
    ratio = d.large_batch // d.small_batch
    lines = [
        "## Third design: the epoch multiplier (fixed before its runs)",
        "",
        f"**Question.** How many times the epochs does LARS at {ratio}x the batch ({d.large_batch} against "
        f"{d.small_batch}) need to end at the top-1 the small batch ends at? The second design could not "
        "decide its yes/no question at 72 epochs (its baseline was still improving), and no budget this machine "
        "can give would turn it into a verdict at that pair; this design measures the multiplier k instead.",
        "",
        f"**Runs.** Every run LARS at peak LR {d.lr:g} (both grids' pick), everything else as in the second "
        "design, top-1 of the averaged weights on the test images at the end of each schedule. The small batch "
        f"at {', '.join(map(str, d.small_budgets))} epochs, {d.small_seeds} seeds each, beside the second "
        f"design's 36 and 72 (3 seeds each); the large batch at {d.large_epochs} epochs, {d.large_seeds} seeds, "
        f"beside the second design's 72 (3 seeds) and 144 (1 seed); {d.middle_batch} at {d.middle_epochs} "
        f"epochs, {d.middle_seeds} seeds, which places where larger batches stop paying. Should a large-batch "
        "level lie outside the small batch's budgets, the small batch adds a budget half its shortest or twice "
        f"its longest ({d.small_seeds} seeds), up to {d.max_extensions} times each way.",
        "",
        "**k at each level** the large batch reaches (its mean end-of-schedule top-1 at each of its budgets): its "
        "epochs divided by the epochs the small batch needs to end at the same top-1, read off the small "
        "batch's mean end-of-schedule top-1 against epochs, interpolated linearly in log epochs between the two "
        f"budgets that bracket the level; a {d.interval:.0%} percentile bootstrap interval over seeds (seeds "
        f"resampled within every budget, {d.bootstrap_samples} draws, seed {d.bootstrap_seed}). The same for "
        f"{d.middle_batch} at {d.middle_epochs} epochs.",
        "",
        "**The rule**, on k at the highest level the large batch reached: "
        f"**{FINDINGS[0]}** on this proxy if k <= {d.holds_at_most:g}; **{FINDINGS[1]}** if k >= "
        f"{d.more_epochs_from:g} (the report then says: at {ratio}x the batch, LARS here needs about k times the "
        f"epochs, so the paper's equal-epoch claim is tied to a budget of at least k x 72 epochs on this data); "
        f"**{FINDINGS[2]}** otherwise. A level outside the small batch's budgets gives only a bound on k; the "
        "rule applies to the bound where the bound decides, else the finding is undecided. The second design's "
        "verdict stays as computed; this finding is reported beside it.",
        "",
        f"**Steps to top-1 {d.target_top1:g}** (Shallue et al.'s measure) from end-of-schedule results: the "
        "epochs at which a batch's schedule first ends at the target, interpolated as above, times its steps per "
        "epoch; a bound where the target lies outside a batch's budgets. It replaces the mid-run crossing the "
        "second design reported.",
        "",
        "**Cheaper steps first, checked to change no result.** The runs of this design train with ghost batch "
        "norm through the fused kernel, input batches prepared whole and one thread pool of one core a run "
        "(`loop.cpu_threads=1`, two runs side by side); evaluation, weight-average swap and checkpoint every "
        "max(1, epochs // 36) epochs (every epoch up to 36 epochs, every 8 at 288). Before the runs, the second "
        "design's 256 and 4096 finals (seed 0) were run again on the new code up to epoch 8 and compared with "
        "their committed histories (docs/status.md).",
    ]
    if cost:
        lines += [
            "",
            f"**Budget.** {cost['runs']} new runs of {cost['epoch_runs']} run-epochs on 60,000 images; about "
            f"{cost['cpu_hours']:.1f} CPU-hours at the measured CPU-seconds per epoch of the new code "
            f"({', '.join(f'{b}: {s:.0f}' for b, s in cost['cpu_seconds_per_epoch'].items())}), about half of "
            "that in wall-clock hours with two runs side by side, more if budgets extend.",
        ]
    return "\n".join(lines)


def estimated_cost(design: MultiplierDesign, cpu_seconds_per_epoch: dict[int, float]) -> dict:
    runs = [(design.small_batch, e, design.small_seeds) for e in design.small_budgets]
    runs += [(design.large_batch, design.large_epochs, design.large_seeds)]
    runs += [(design.middle_batch, design.middle_epochs, design.middle_seeds)]
    epoch_runs = sum(e * n for _, e, n in runs)
    cpu = sum(e * n * cpu_seconds_per_epoch[b] for b, e, n in runs)
    return {
        "runs": sum(n for _, _, n in runs),
        "epoch_runs": epoch_runs,
        "cpu_seconds_per_epoch": {str(b): s for b, s in cpu_seconds_per_epoch.items()},
        "cpu_hours": cpu / 3600,
    }


def _k_text(level: dict) -> str:
    if level["k"] is None:
        return (
            "outside the budgets: k "
            + " ".join(f"{x:.3g}" if isinstance(x, float) else x for x in level["bound"])
            if level["bound"]
            else "—"
        )
    interval = level["k_interval"]
    span = f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else " (no interval: fewer than 2 seeds)"
    return f"{level['k']:.2f}{span} ({level['small_epochs']:.1f} small-batch epochs)"


def _seeds(count: int) -> str:
    return f"{count} seed" + ("" if count == 1 else "s")


def results_section(design: MultiplierDesign, summary: dict) -> str:
    d = design
    lines = ["## Third design: results", ""]
    curves = summary["curves"]
    lines += [
        "| batch | epochs | seeds | end-of-schedule test top-1 (each seed) | mean |",
        "| --- | --- | --- | --- | --- |",
    ]
    for batch, curve in curves.items():
        for epochs, values in curve.items():
            each = ", ".join(f"{v:.4f}" for v in values)
            lines.append(f"| {batch} | {epochs} | {len(values)} | {each} | {np.mean(values):.4f} |")
    lines += [
        "",
        f"| LARS-{d.large_batch} level | its mean top-1 | k (its {d.interval:.0%} interval) |",
        "| --- | --- | --- |",
    ]
    for level in summary["levels"]:
        lines.append(
            f"| {level['large_epochs']} epochs ({_seeds(level['seeds'])}) | {level['top1_mean']:.4f} | {_k_text(level)} |"
        )
    for level in summary["middle_batch"]:
        lines.append(
            f"| LARS-{d.middle_batch} at {level['epochs']} epochs ({_seeds(level['seeds'])}) | {level['top1_mean']:.4f} | {_k_text(level)} |"
        )
    lines += ["", f"**Finding** (computed by the script, at {summary['at_large_epochs']} large-batch epochs): **{summary['finding']}**"
              + ("" if summary["complete"] else " (not every planned run is in yet).")]  # fmt: skip
    if summary["finding"] == FINDINGS[1] and summary["k"] is not None:
        k = summary["k"]
        lines.append(
            f"- At {d.large_batch // d.small_batch}x the batch, LARS here needs about {k:.1f} times the epochs, so "
            f"the paper's equal-epoch claim is tied to a budget of at least {k * 72:.0f} epochs ({k:.1f} x 72) on "
            "this data."
        )
    steps = summary["steps_to_target"]
    lines += ["", f"Steps to top-1 {steps['target_top1']:g} from end-of-schedule results:"]
    for batch, entry in steps["by_batch"].items():
        if entry["steps"] is not None:
            text = f"{entry['steps']:.0f} steps ({entry['epochs']:.1f} epochs)"
        elif entry["bound_steps"]:
            text = f"{entry['bound_steps'][0]} {entry['bound_steps'][1]:.0f} steps (the target lies outside its budgets)"
        else:
            text = "no run yet"
        lines.append(f"- batch {batch}: {text}")
    lines += [
        "",
        "![end-of-schedule top-1 against epochs by batch; steps to the target by batch](large_batch_study_multiplier.png)",
        "",
    ]
    return "\n".join(lines)


def plot(design: MultiplierDesign, summary: dict, path: str) -> None:
    """End-of-schedule top-1 against epochs (log), a line per batch with every seed's point; steps to the
    target by batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_epochs, to_target) = plt.subplots(1, 2, figsize=(13, 4.8))
    colours = {
        str(design.small_batch): "tab:blue",
        str(design.middle_batch): "tab:green",
        str(design.large_batch): "tab:red",
    }
    values = []
    for batch, curve in summary["curves"].items():
        if not curve:
            continue
        epochs = [int(e) for e in curve]
        means = [float(np.mean(v)) for v in curve.values()]
        values += [x for v in curve.values() for x in v]
        by_epochs.plot(epochs, means, "-o", color=colours[batch], label=f"batch {batch} (mean of seeds)")
        for e, v in curve.items():
            by_epochs.scatter([int(e)] * len(v), v, color=colours[batch], s=10, alpha=0.5)
    for level in summary["levels"]:
        if level["small_epochs"]:
            by_epochs.annotate(
                f"k={level['k']:.2f}",
                xy=(level["small_epochs"], level["top1_mean"]),
                xytext=(level["large_epochs"], level["top1_mean"]),
                arrowprops={"arrowstyle": "->", "color": "grey"},
                fontsize=8,
                va="center",
            )
    by_epochs.set_xscale("log", base=2)
    by_epochs.set_xlabel("epochs of the schedule (log)")
    by_epochs.set_ylabel("test top-1 at the end of the schedule")
    if values:
        low, high = min(values), max(values)
        by_epochs.set_ylim(low - 0.02 * (high - low + 0.01), high + 0.1 * (high - low + 0.01))
    by_epochs.grid(alpha=0.3)
    by_epochs.legend(fontsize=8)
    steps = summary["steps_to_target"]["by_batch"]
    points = [(int(b), e["steps"]) for b, e in steps.items() if e["steps"] is not None]
    bounds = [
        (int(b), e["bound_steps"][1]) for b, e in steps.items() if e["steps"] is None and e["bound_steps"]
    ]
    if points:
        to_target.scatter(*zip(*points, strict=True), color="k", label="interpolated")
        first = min(points)
        batches = sorted(int(b) for b in steps)
        to_target.plot(
            batches, [first[1] * first[0] / b for b in batches], "k:", linewidth=1, label="perfect scaling"
        )
    if bounds:
        to_target.scatter(
            *zip(*bounds, strict=True), color="grey", marker="v", label="bound (outside the budgets)"
        )
    to_target.set_xscale("log", base=2)
    to_target.set_yscale("log")
    to_target.set_xlabel("global batch")
    to_target.set_ylabel(f"steps to end at top-1 {summary['steps_to_target']['target_top1']:g}")
    to_target.grid(alpha=0.3)
    if points or bounds:
        to_target.legend(fontsize=8)
    fig.suptitle(f"LARS at peak LR {design.lr:g}: where each batch ends, by schedule length")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
