"""The large-batch study's third design (benchmarks/epoch_multiplier.py): k, its rule and its runs, on made-up
runs (the study's own runs take CPU-hours)."""

import dataclasses
import importlib.util
import math
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_IMAGES = 60000


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def em():
    module = _load("epoch_multiplier")
    yield module
    sys.modules.pop("epoch_multiplier", None)


@pytest.fixture(scope="module")
def study(em):
    module = _load("large_batch_study")
    yield module
    sys.modules.pop("large_batch_study", None)


def _run(kind, batch, epochs, seed, top1, lr=4.0):
    return {
        "kind": kind,
        "batch": batch,
        "lr": lr,
        "epochs": epochs,
        "seed": seed,
        "final_top1": top1,
        "diverged": False,
        "steps": int(epochs * TRAIN_IMAGES / batch),
        "name": f"{kind}-{batch}-e{epochs}-seed{seed}",
    }


def _runs(*entries):
    return {r["name"]: r for r in (_run(*e) for e in entries)}


def test_epochs_to_reach_interpolates_in_log_epochs_between_the_bracketing_budgets(em):
    curve = {4: 0.80, 8: 0.84, 16: 0.86}
    epochs, where = em.epochs_to_reach(curve, 0.82)
    assert where == "inside" and epochs == pytest.approx(4 * math.sqrt(2))
    assert em.epochs_to_reach(curve, 0.86) == (pytest.approx(16.0), "inside")
    assert em.epochs_to_reach(curve, 0.80) == (None, "below")  # the shortest budget ends there already
    assert em.epochs_to_reach(curve, 0.87) == (None, "above")
    # Not monotone: the first crossing counts.
    assert em.epochs_to_reach({4: 0.80, 8: 0.85, 16: 0.84, 32: 0.86}, 0.845)[0] < 8


def test_k_is_the_large_batchs_epochs_over_the_small_batchs_and_a_bound_outside_the_budgets(em):
    curve = {4: 0.80, 8: 0.84, 16: 0.86}
    assert em.multiplier(72, curve, 0.82)["k"] == pytest.approx(72 / (4 * math.sqrt(2)))
    assert em.multiplier(72, curve, 0.79) == {"k": None, "small_epochs": None, "bound": [">", 18.0]}
    assert em.multiplier(8, curve, 0.9) == {"k": None, "small_epochs": None, "bound": ["<", 0.5]}


@pytest.mark.parametrize(
    "level, finding",
    [
        ({"k": 1.3, "bound": None}, "equal-epoch scaling holds"),
        ({"k": 1.31, "bound": None}, "undecided"),
        ({"k": 1.99, "bound": None}, "undecided"),
        ({"k": 2.0, "bound": None}, "needs more epochs"),
        ({"k": None, "bound": [">", 2.5]}, "needs more epochs"),
        ({"k": None, "bound": [">", 1.5]}, "undecided"),
        ({"k": None, "bound": ["<", 1.2]}, "equal-epoch scaling holds"),
        ({"k": None, "bound": ["<", 3.0]}, "undecided"),
        (None, "undecided"),
    ],
)
def test_the_rule_fixed_before_the_runs(em, level, finding):
    assert em.finding(em.MULTIPLIER, level) == finding


def _third_design_runs(large_288=(0.87, 0.88)):
    """The second design's reused runs, the new budgets, the 288-epoch large batch and the middle batch."""
    entries = [("final", 256, 72, s, t) for s, t in enumerate((0.900, 0.899, 0.901))]
    entries += [("half", 256, 36, s, t) for s, t in enumerate((0.890, 0.891, 0.888))]
    entries += [
        ("budget", 256, e, s, t + 0.002 * s) for e, t in ((4, 0.83), (8, 0.86), (16, 0.875)) for s in range(3)
    ]
    entries += [("final", 4096, 72, s, t) for s, t in enumerate((0.845, 0.838, 0.852))]
    entries += [("long", 4096, 144, 0, 0.8725)]
    entries += [("budget", 4096, 288, s, t) for s, t in enumerate(large_288)]
    entries += [("budget", 1024, 72, s, t) for s, t in enumerate((0.885, 0.887, 0.886))]
    entries += [("grid", 256, 72, 0, 0.95, 8.0)]  # held-out, another LR: never part of a curve
    return _runs(*entries)


def test_summary_gives_k_at_every_level_the_finding_at_the_highest_and_steps_to_target(em):
    runs = _third_design_runs()
    summary = em.summarise(em.MULTIPLIER, runs, lambda batch: TRAIN_IMAGES / batch)

    assert [level["large_epochs"] for level in summary["levels"]] == [72, 144, 288]
    small_means = {epochs: sum(v) / len(v) for epochs, v in em.end_of_schedule(runs, 256, 4.0).items()}
    top = summary["levels"][-1]
    expected = 288 / em.epochs_to_reach(small_means, 0.875)[0]
    assert summary["k"] == pytest.approx(expected, rel=1e-3) and summary["at_large_epochs"] == 288
    assert summary["finding"] == "needs more epochs" and summary["complete"]
    low, high = summary["k_interval"]
    assert low <= top["k"] <= high
    assert summary["middle_batch"][0]["k"] == pytest.approx(
        72 / em.epochs_to_reach(small_means, 0.886)[0], rel=1e-3
    )
    by_batch = summary["steps_to_target"]["by_batch"]
    assert by_batch["256"]["steps"] == pytest.approx(
        em.epochs_to_reach(small_means, 0.85)[0] * TRAIN_IMAGES / 256
    )
    assert by_batch["1024"]["bound_steps"] == ["<=", 72 * TRAIN_IMAGES / 1024]
    assert "held-out" not in str(summary["curves"]) and 0.95 not in summary["curves"]["256"].get("72", [])


def test_the_interval_needs_two_seeds_everywhere_and_is_reproducible(em):
    small = {4: [0.83, 0.832, 0.834], 8: [0.86, 0.862, 0.864]}
    assert em.bootstrap_interval(em.MULTIPLIER, 72, [0.845], small) is None
    first = em.bootstrap_interval(em.MULTIPLIER, 72, [0.845, 0.85], small)
    assert first == em.bootstrap_interval(em.MULTIPLIER, 72, [0.845, 0.85], small)
    assert first[0] < first[1]


def test_budgets_extend_below_and_above_only_once_the_runs_they_depend_on_are_in(em):
    design = em.MULTIPLIER
    runs = _third_design_runs()
    assert em.small_budgets_needed(design, runs) == [4, 8, 16, 36, 72]
    # The shortest budget already ends above the lowest large-batch level: halve it, and once those runs are
    # in and end above it too, halve again (twice at most).
    high_start = {
        n: dict(r, final_top1=0.85) for n, r in runs.items() if r["batch"] == 256 and r["epochs"] == 4
    }
    assert em.small_budgets_needed(design, {**runs, **high_start}) == [2, 4, 8, 16, 36, 72]
    two = _runs(*[("budget", 256, 2, s, 0.847) for s in range(3)])
    assert em.small_budgets_needed(design, {**runs, **high_start, **two}) == [1, 2, 4, 8, 16, 36, 72]
    one = _runs(*[("budget", 256, 1, s, 0.846) for s in range(3)])
    assert (
        em.small_budgets_needed(design, {**runs, **high_start, **two, **one})[0] == 1
    )  # two extensions at most
    # A large-batch level above the longest budget's mean: double it.
    above = _third_design_runs(large_288=(0.905, 0.906))
    assert em.small_budgets_needed(design, above) == [4, 8, 16, 36, 72, 144]
    # No extension from a budget while its seeds are missing.
    partial = {n: r for n, r in above.items() if n != "final-256-e72-seed2"}
    assert em.small_budgets_needed(design, partial) == [4, 8, 16, 36, 72]


def test_the_study_trains_only_the_runs_missing_and_reuses_the_second_designs(study, em):
    runs = _third_design_runs()
    assert study.multiplier_runs(em.MULTIPLIER, runs) == []
    del runs["budget-4096-e288-seed1"], runs["budget-256-e8-seed0"]
    missing = study.multiplier_runs(em.MULTIPLIER, runs)
    assert [r.name for r in missing] == ["budget-4096-e288-seed1", "budget-256-e8-seed0"]
    second_only = {n: r for n, r in runs.items() if r["kind"] != "budget"}
    names = [r.name for r in study.multiplier_runs(em.MULTIPLIER, second_only)]
    assert "budget-256-e72-seed0" not in names and "budget-4096-e72-seed0" not in names
    assert len(names) == 2 + 9 + 3


def test_the_third_designs_runs_evaluate_less_often_on_one_core_and_the_others_are_unchanged(study):
    data = {
        split: dict(sizes, train="t", eval="e")
        for split, sizes in {
            "final": {"num_train": 60000, "num_eval": 10000},
            "tune": {"num_train": 50000, "num_eval": 10000},
        }.items()
    }
    budget = study.Run("budget", 4096, 4.0, 288, 1).settings(study.DESIGN, data)
    assert (budget["loop.eval_every_epochs"], budget["loop.cpu_threads"]) == (8, 1)
    assert study.Run("budget", 256, 4.0, 4, 0).settings(study.DESIGN, data)["loop.eval_every_epochs"] == 1
    final = study.Run("final", 256, 4.0, 72, 0).settings(study.DESIGN, data)
    assert final["loop.eval_every_epochs"] == 1 and "loop.cpu_threads" not in final
    assert study.Run("budget", 256, 4.0, 16, 2).name == "budget-256-e16-seed2"
    study.Run("budget", 4096, 4.0, 288, 1).config(study.DESIGN, data)  # the trainer's config takes it


def test_a_results_file_of_another_multiplier_design_stops_the_study(study, em, tmp_path):
    path = tmp_path / "large_batch_study.json"
    other = dataclasses.replace(em.MULTIPLIER, large_epochs=576)
    path.write_text(
        __import__("json").dumps(
            {"design": study.DESIGN.to_dict(), "epoch_multiplier_design": other.to_dict()}
        )
    )
    results = study.Results(str(path), study.DESIGN)
    with pytest.raises(
        SystemExit, match="epoch multiplier's runs of another design .differs in large_epochs"
    ):
        study._check_same_multiplier(results, em.MULTIPLIER)
