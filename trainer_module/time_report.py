"""The run report's account of where the run's time went (``effnet_common.goodput.TimeAccount``): a figure of
its parts along the run and by size, the summary's lines, and the plan's figures beside the measured ones."""

from __future__ import annotations

import io

from effnet_common import console, goodput

PLOT = "report_time.png"
SMALL_SHARE = 0.005  # parts smaller than this share of the run are drawn as one bar
CAPTION = (
    "Where the run's wall time went. Top: the parts along the run. Bottom: "
    "each part's total; training steps that count toward the final model are goodput, the rest badput by "
    "cause (the terms of ml-goodput-measurement). A step's time is the gap between its start and the next "
    "step's start; the first step of each attempt beyond the attempt's mean step is trace and compile."
)


def _color(part: str):
    from matplotlib import colormaps

    if part == goodput.GOODPUT:
        return "#2ca02c"
    if part == goodput.UNACCOUNTED:
        return "#bbbbbb"
    # tab20 but its greens (goodput's).
    palette = [color for index, color in enumerate(colormaps["tab20"].colors) if index not in (4, 5)]
    order = [p for p in goodput.PARTS if p not in (goodput.GOODPUT, goodput.UNACCOUNTED)]
    index = order.index(part) if part in order else len(order) + sum(map(ord, part))  # a pipeline step
    return palette[index % len(palette)]


def _unit(seconds: float) -> tuple[float, str]:
    """The time axis's divisor and unit for a run this long."""
    if seconds < 180:
        return 1.0, "seconds"
    if seconds < 3 * 3600:
        return 60.0, "minutes"
    return 3600.0, "hours"


def time_plot(account: goodput.TimeAccount) -> bytes:
    """The account's figure: the spans along the run, and each part's seconds (goodput first, then the
    badput parts, largest first)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = account.parts
    order = [goodput.GOODPUT] * (goodput.GOODPUT in parts) + list(account.badput())
    # Parts under half a percent of the run are one bar.
    small = [part for part in order if parts[part] < SMALL_SHARE * account.wall_seconds]
    order = [part for part in order if part not in small]
    labels = [goodput.words(part) for part in order]
    seconds = [parts[part] for part in order]
    colors = [_color(part) for part in order]
    if small:
        labels.append(f"{len(small)} parts under {SMALL_SHARE:.1%} each")
        seconds.append(sum(parts[part] for part in small))
        colors.append("#dddddd")
    figure, (along, totals) = plt.subplots(
        2, 1, figsize=(11, 1.9 + 0.32 * len(labels)), gridspec_kw={"height_ratios": [1, max(2, len(labels))]}
    )
    divisor, unit = _unit(account.wall_seconds)
    for span in account.spans:
        left = (span.start - account.start) / divisor
        along.broken_barh([(left, span.seconds / divisor)], (0, 1), color=_color(span.part))
    along.set_xlim(0, account.wall_seconds / divisor)
    along.set_yticks([])
    along.set_xlabel(f"{unit} since the run started")
    along.set_title(account.one_line(parts=3), fontsize=10)
    totals.barh(range(len(labels)), seconds, color=colors)
    totals.set_yticks(range(len(labels)), labels)
    totals.invert_yaxis()
    totals.set_xlabel("seconds")
    for row, value in enumerate(seconds):
        share = value / account.wall_seconds if account.wall_seconds else 0.0
        totals.annotate(f" {console.duration(value)} ({share:.0%})", (value, row), va="center", fontsize=8)
    totals.set_xlim(0, max(seconds, default=1.0) * 1.25)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    return buffer.getvalue()


def summary_rows(account: goodput.TimeAccount) -> list[tuple[str, str]]:
    """The report summary's lines: goodput, the largest badput parts, the disruptions."""
    badput = list(account.badput().items())[:5]
    rows = [
        (
            "goodput (training steps that count, of the run's wall time)",
            f"{account.goodput:.1%}: {console.duration(account.goodput_seconds)} of "
            f"{console.duration(account.wall_seconds)}",
        ),
        (
            "largest badput parts",
            "; ".join(f"{goodput.words(part)} {console.duration(seconds)}" for part, seconds in badput),
        ),
    ]
    if account.disruptions:
        rows.append(
            (
                "disruptions",
                f"{account.disruptions}, {console.plural(account.redone_steps, 'step')} trained again",
            )
        )
    return rows


def plan_rows(plan: dict, account: goodput.TimeAccount, held_hours: float | None) -> list[tuple[str, str]]:
    """The plan's figures beside the measured ones.

    Args:
      plan: what ``--plan`` estimated (``components.accelerators.planned``: hours, accelerator-hours, their
        unit, the price of one and its source).
      account: the run's time account.
      held_hours: the hours the accelerators were held (billed), when the run knows them.
    """
    price, unit = plan.get("usd_per_unit_hour"), plan.get("unit", "accelerators")
    rows = [
        (
            "time: plan / measured",
            f"{console.duration(plan['hours'] * 3600)} of training at the nominal rate / "
            f"{console.duration(account.wall_seconds)} of wall time, "
            f"{console.duration(account.goodput_seconds)} of it goodput",
        )
    ]
    if held_hours is not None:
        units = plan["accelerator_hours"] / plan["hours"] if plan.get("hours") else 0.0
        measured_units = held_hours * units
        line = f"{_hours(plan['accelerator_hours'])} / {_hours(measured_units)} hours of {unit}"
        if price is not None:
            line += (
                f"; cost at ${price:.2f} an hour each ({plan.get('prices', 'the plan')}): "
                f"${plan['accelerator_hours'] * price:,.2f} / ${measured_units * price:,.2f}"
            )
        rows.append(("accelerators: plan / measured", line))
    largest = next(iter(account.badput().items()), None)
    if largest is not None:
        rows.append(
            (
                "the largest difference from the plan",
                f"{goodput.words(largest[0])}, {console.duration(largest[1])}: the plan counts the training "
                "steps alone",
            )
        )
    return rows


def _hours(value: float) -> str:
    """1,044 / 12.5 / 0.0246 hours: whole hours from 100, a tenth from 1, three figures below."""
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 1 else f"{value:.3g}"
