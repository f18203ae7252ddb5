"""The large-batch study's bookkeeping: transfer rows, the claim's verdict and resuming from its JSON.

The study itself takes CPU-hours (benchmarks/large_batch_study.py); what it concludes from its runs is pure
Python and is checked here on made-up runs.
"""

import argparse
import importlib.util
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location(
        "large_batch_study", os.path.join(REPO, "benchmarks", "large_batch_study.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def _args(**changes):
    values = dict(small_batch=256, large_batch=4096, seeds=2, extra_seeds=1, epochs=20, tune_epochs=4)
    values.update(factor=3, image_size=16, replicas=2)
    values.update(changes)
    return argparse.Namespace(**values)


def _search(values: dict, top1: float) -> dict:
    return {"best_values": values, "best": {"top1": top1}, "cpu_seconds": 600.0}


def _run(cell: str, seed: int, top1: float, steps: int) -> dict:
    return {
        "cell": cell,
        "seed": seed,
        "final_top1": top1,
        "peak_top1": top1,
        "steps": steps,
        "diverged": False,
        "cpu_seconds": 60.0,
    }


def test_transfer_keeps_per_256_values_and_scales_the_absolute_end_lr(study):
    values = {
        "schedule.lr_per_256": 0.24,
        "schedule.warmup_epochs": 1.15,
        "optimizer.lars_eeta": 0.007,
        "schedule.end_lr": 0.0137,
        "tuning/schedule_epochs": 4,
    }
    moved = study.transferred(values, 16)
    assert moved["schedule.end_lr"] == pytest.approx(0.0137 * 16)
    assert {k: v for k, v in moved.items() if k != "schedule.end_lr"} == {
        k: v for k, v in values.items() if k != "schedule.end_lr"
    }
    cell = study.Cell("lars", 4096, tuned_at=256)
    assert cell.name == "lars-4096-from-256"
    assert cell.searched == study.Cell("lars", 256)
    assert cell.values({"best_values": values}) == moved
    assert study.Cell("lars", 4096).searched == study.Cell("lars", 4096)
    assert study.Cell("lars", 4096).values({"best_values": values}) == values
    paper = study.Cell("lars", 4096, paper=True)
    assert (paper.name, paper.searched, paper.values(None)) == ("lars-4096-paper", None, {})


def test_claim_is_judged_on_searched_cells_and_other_rows_reported_beside_it(study):
    cells = [study.Cell(o, b) for b in (256, 4096) for o in study.RECIPES]
    cells += study.beside_claim_cells(256, 4096)
    lars_256 = {"schedule.lr_per_256": 0.24, "optimizer.lars_eeta": 0.007, "schedule.end_lr": 0.01}
    searches = {
        "lars-256": _search(lars_256, 0.77),
        "rmsprop-256": _search({"schedule.lr_per_256": 0.005}, 0.75),
        "lars-4096": _search({"schedule.lr_per_256": 0.1, "schedule.end_lr": 0.06}, 0.29),
        "rmsprop-4096": _search({"schedule.lr_per_256": 0.008}, 0.44),
    }
    runs = {}
    for seed in (0, 1):
        for cell, top1, steps in (
            ("lars-256", 0.82 + seed * 0.002, 4687),
            ("rmsprop-256", 0.79, 4687),
            ("lars-4096", 0.69, 292),
            ("rmsprop-4096", 0.70, 292),
            ("lars-4096-from-256", 0.815, 292),  # better than the baseline's -1 pt would be
            ("rmsprop-256-paper", 0.86, 4687),  # better than the baseline: not a claim cell either
        ):
            runs[f"{cell}-seed{seed}"] = _run(cell, seed, top1, steps)
    report = study.summarise({"searches": searches, "runs": runs}, cells, _args())
    summary = report["summary"]
    assert summary["baseline_cell"] == "lars-256"
    assert summary["baseline_top1_mean"] == pytest.approx(0.821)
    assert summary["lars_large_top1_mean"] == pytest.approx(0.69)
    assert summary["lars_within_1pt"] is False  # the searched cell decides, not the transfer row
    assert summary["rmsprop_3pt_short"] is True
    assert summary["beside_claim"] == pytest.approx({"lars-4096-from-256": 0.815, "rmsprop-256-paper": 0.86})
    assert summary["complete"] is True  # every claim cell has its 2 seeds; the rows beside it do not count
    rows = {r["cell"]: r for r in report["cells"]}
    assert rows["lars-4096-from-256"]["tuned"]["schedule.end_lr"] == pytest.approx(0.16)
    assert rows["lars-4096-from-256"]["held_out_top1"] is None  # not searched at its batch
    assert rows["lars-4096-paper"]["tuned"] == {} and rows["lars-4096-paper"]["values_from"] == "paper"
    assert rows["lars-256"]["final_top1_std"] == pytest.approx(0.002 / 2**0.5)
    text = study.markdown(
        report, _args(), {"tune_train": 50000, "tune_eval": 10000, "train": 60000, "eval": 10000}
    )
    assert "beside the claim, lars-4096-from-256: 0.8150 (-0.60 pt)" in text
    assert "| lars-4096-paper | the paper's |" in text
    assert "the claim (within 1.0 point) does not hold" in text


def test_results_resume_only_runs_with_the_same_settings(study, tmp_path):
    path = tmp_path / "large_batch_study.json"
    entry = {"settings": {"overrides": ["a=1"]}, "cell": "lars-256", "seed": 0}
    path.write_text(json.dumps({"searches": {}, "runs": {"lars-256-seed0": entry}}))
    results = study.Results(str(path))
    assert results.get("runs", "lars-256-seed0", {"overrides": ["a=1"]}) == entry
    assert results.get("runs", "lars-256-seed0", {"overrides": ["a=2"]}) is None
    written = []
    results.put("runs", "lars-256-seed1", {**entry, "seed": 1}, written.append)
    assert set(written[-1]["runs"]) == {"lars-256-seed0", "lars-256-seed1"}


def test_report_only_rewrites_the_report_from_the_saved_results(study, tmp_path):
    run = _run("lars-256", 0, 0.82, 4687)
    run["history"] = [{"epoch": e, "step": 234 * e, "top1": 0.6 + 0.01 * e} for e in (1, 2)]
    saved = {
        "args": {**vars(_args()), "extra_seeds": 0, "seeds": 1},
        "data": {"tune_train": 50000, "tune_eval": 10000, "train": 60000, "eval": 10000},
        "searches": {"lars-256": _search({"schedule.lr_per_256": 0.24}, 0.77)},
        "runs": {"lars-256-seed0": run},
    }
    (tmp_path / "large_batch_study.json").write_text(json.dumps(saved))
    assert study.main(["--out-dir", str(tmp_path), "--report-only"]) == 0
    text = (tmp_path / "large_batch_study.md").read_text()
    assert "| lars-256 | lr_per_256=0.24 | 0.7700 |" in text
    assert "-paper" not in text  # the saved study had no rows beside the claim
    assert (tmp_path / "large_batch_study.png").stat().st_size > 0
    rewritten = json.loads((tmp_path / "large_batch_study.json").read_text())
    assert rewritten["runs"] == saved["runs"] and rewritten["summary"]["baseline_cell"] == "lars-256"
    assert rewritten["args"] == saved["args"]  # what the study ran with, not this command's flags
    with pytest.raises(SystemExit):  # nothing saved there: one line from argparse, exit 2
        study.main(["--out-dir", str(tmp_path / "empty"), "--report-only"])
