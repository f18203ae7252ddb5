"""The large-batch study's decision rule and bookkeeping, on made-up runs.

The study itself takes CPU-hours (benchmarks/large_batch_study.py); what it concludes from its runs is pure
Python and is checked here: the Welch interval, each branch of the verdict, the grid's extension at an edge, the
runs' settings as the trainer resolves them, steps to target, resuming from the JSON and the report.
"""

import dataclasses
import importlib.util
import json
import os
import sys

import numpy as np
import pytest
from scipy import stats

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The sizes of the study's two splits (tuning: 10,000 held out of the training images; finals: the test images).
SPLITS = {
    "tune": {"num_train": 50000, "num_eval": 10000},
    "final": {"num_train": 60000, "num_eval": 10000},
}


def _committed_results() -> dict:
    with open(os.path.join(REPO, "docs", "large_batch_study.json")) as f:
        return json.load(f)


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


def test_welch_interval_matches_scipys_welch_test(study):
    large, small = [0.861, 0.874, 0.869], [0.882, 0.879, 0.888]
    delta, low, high = study.welch_interval(large, small, 0.90)
    expected = stats.ttest_ind(large, small, equal_var=False).confidence_interval(0.90)
    assert delta == pytest.approx(np.mean(large) - np.mean(small))
    assert (low, high) == pytest.approx((expected.low, expected.high))


BASE = [0.880, 0.884, 0.882]


def _verdict(study, large, half=(0.881, 0.882, 0.880), long_run=0.860, inside=True):
    return study.verdict(study.DESIGN, BASE, list(large), list(half), long_run, inside)


def test_a_large_batch_level_with_the_baseline_reproduces(study):
    result = _verdict(study, [0.878, 0.880, 0.879])
    assert result["verdict"] == "reproduces"
    assert result["delta"] == pytest.approx(-0.003)
    assert result["delta_ci90"][0] >= -0.015


def test_a_mean_within_a_point_with_too_wide_an_interval_is_budget_limited(study):
    result = _verdict(study, [0.905, 0.845, 0.870])  # mean -0.82 pt, lower end far below -1.5 pt
    assert result["delta"] > -0.01 and result["delta_ci90"][0] < -0.015
    assert result["verdict"] == "budget-limited"


def test_a_clear_shortfall_refutes_only_with_every_condition_met(study):
    short = [0.850, 0.852, 0.848]
    assert _verdict(study, short)["verdict"] == "refutes"
    # The baseline still improving: at half the epochs 1 point lower.
    assert _verdict(study, short, half=(0.870, 0.871, 0.873))["verdict"] == "budget-limited"
    # Twice the epochs close the gap to within a point.
    assert _verdict(study, short, long_run=0.878)["verdict"] == "budget-limited"
    assert _verdict(study, short, long_run=None)["verdict"] == "budget-limited"
    # A pick on the edge of its grid.
    assert _verdict(study, short, inside=False)["verdict"] == "budget-limited"


def test_the_verdict_names_each_condition_of_both_rules_and_which_failed(study):
    result = _verdict(study, [0.850, 0.852, 0.848], half=(0.870, 0.871, 0.873))
    assert result["verdict"] == "budget-limited"
    refutes = result["conditions"]["refutes"]
    assert refutes["baseline saturated"] is False
    assert [met for c, met in refutes.items() if c != "baseline saturated"] == [True, True, True]
    assert not all(result["conditions"]["reproduces"].values())


def test_no_verdict_before_every_seed_is_in(study):
    two = study.verdict(study.DESIGN, BASE[:2], [0.878, 0.880], [0.881, 0.882, 0.880], 0.86, True)
    assert two["delta_ci90"] is not None and all(two["conditions"]["reproduces"].values())
    assert two["verdict"] == "budget-limited"
    # Saturation is judged on the half-epoch check's every seed.
    assert _verdict(study, [0.850, 0.852, 0.848], half=(0.881,))["saturated"] is None
    assert _verdict(study, [0.850, 0.852, 0.848], half=(0.881,))["verdict"] == "budget-limited"
    waiting = _verdict(study, [0.850, 0.852, 0.848], half=(), long_run=None)["conditions"]["refutes"]
    assert (
        waiting["baseline saturated"] is None
        and waiting["twice the epochs also more than 1 pt short"] is None
    )


def test_one_seed_forms_no_interval(study):
    result = study.verdict(study.DESIGN, BASE[:1], [0.88], [], None, True)
    assert result["verdict"] == "budget-limited" and result["delta_ci90"] is None


def test_a_tie_in_the_grid_goes_to_the_lower_lr_whatever_the_order_of_runs(study):
    design = dataclasses.replace(study.DESIGN, lr_grids=((256, (1.0, 2.0, 4.0, 8.0)),))
    ordered = {1.0: 0.86, 2.0: 0.87, 4.0: 0.87, 8.0: 0.85}
    shuffled = {8.0: 0.85, 4.0: 0.87, 1.0: 0.86, 2.0: 0.87}
    assert study.grid_state(design, 256, ordered)[1] == study.grid_state(design, 256, shuffled)[1] == 2.0


def test_a_pick_at_an_edge_extends_the_grid_beyond_it(study):
    design = dataclasses.replace(study.DESIGN, lr_grids=((256, (1.0, 2.0, 4.0)), (4096, (4.0, 8.0))))
    assert study.grid_state(design, 256, {1.0: 0.87}) == ([1.0, 2.0, 4.0], None)  # points still missing
    assert study.grid_state(design, 256, {1.0: 0.87, 2.0: 0.88, 4.0: 0.86}) == ([1.0, 2.0, 4.0], 2.0)
    grid, picked = study.grid_state(design, 256, {1.0: 0.87, 2.0: 0.88, 4.0: 0.89})
    assert (grid, picked) == ([1.0, 2.0, 4.0, 8.0], None)
    grid, picked = study.grid_state(design, 256, {1.0: 0.89, 2.0: 0.88, 4.0: 0.86})
    assert (grid, picked) == ([0.5, 1.0, 2.0, 4.0], None)
    # A diverged point above the best brackets it.
    assert study.grid_state(design, 4096, {4.0: 0.86, 8.0: None}) == ([2.0, 4.0, 8.0], None)
    assert study.grid_state(design, 4096, {2.0: 0.85, 4.0: 0.86, 8.0: None})[1] == 4.0


def test_extensions_stop_at_the_designs_limit_and_the_pick_is_then_not_inside(study):
    design = dataclasses.replace(
        study.DESIGN, lr_grids=((256, (1.0, 2.0)), (4096, (4.0, 8.0))), max_extensions=1
    )
    grid, picked = study.grid_state(design, 256, {1.0: 0.80, 2.0: 0.85, 4.0: 0.86})
    assert (grid, picked) == ([1.0, 2.0, 4.0], 4.0)
    assert not study.inside(grid, picked)
    assert study.inside([1.0, 2.0, 4.0], 2.0)


def test_a_runs_config_gives_the_trainer_its_absolute_peak_lr(study):
    for batch, lr in ((256, 1.5), (4096, 12.0)):
        run = study.Run("final", batch, lr, study.DESIGN.epochs, seed=2)
        config = run.config(study.DESIGN, SPLITS)
        plan = config.plan
        assert plan.peak_learning_rate == pytest.approx(lr)
        assert config.optimizer.name == "lars" and config.loop.seed == 2
        assert config.model.bn_virtual_batch == 128 and config.name == f"study-final-{batch}-seed2"
        assert plan.total_steps == int(study.DESIGN.epochs * 60000 / batch)
        assert plan.warmup_steps == pytest.approx(study.DESIGN.warmup_share * plan.total_steps, abs=1)
    grid = study.Run("grid", 4096, 8.0, study.DESIGN.epochs, seed=0)
    assert grid.split == "tune" and grid.name == "grid-4096-lr8"


def test_the_trainers_config_flag_reads_the_file_the_study_hands_it(study, tmp_path):
    from trainer_module.__main__ import parse_args, resolved_run

    run = study.Run("half", 256, 4.0, study.DESIGN.epochs // 2, seed=1)
    path = tmp_path / "config.json"
    path.write_text(run.config(study.DESIGN, SPLITS).to_json())
    args = parse_args(["--config", str(path), "--model-dir", str(tmp_path / "run")])
    assert resolved_run(args).config == run.config(study.DESIGN, SPLITS)


def test_every_committed_run_is_recorded_with_the_settings_the_script_gives_it(study):
    """The results file's runs are the design's: a setting changed in the script would train them again."""
    runs = _committed_results()["runs"]
    assert runs
    for name, entry in runs.items():
        run = study.Run(entry["kind"], entry["batch"], entry["lr"], entry["epochs"], entry["seed"])
        assert run.name == name
        assert entry["settings"] == {"config": run.settings(study.DESIGN, SPLITS), "split": run.split}


def test_a_setting_the_config_refuses_stops_the_study_in_one_line_before_any_directory(study, tmp_path):
    design = dataclasses.replace(study.DESIGN, bn_examples=-1)
    data = {"final": {**SPLITS["final"], "train": "x", "eval": "y"}}
    results = study.Results(str(tmp_path / "results.json"), design)
    runner = study.Runner(design, data, results, str(tmp_path), 1, lambda: None)
    run = study.Run("final", 256, 4.0, design.epochs, 0)
    with pytest.raises(
        SystemExit, match=r"^\[study\] final-256-seed0: the trainer's config refuses a setting: .*"
    ):
        runner(run)
    assert sorted(os.listdir(tmp_path)) == []


def test_the_warmup_is_recorded_to_six_significant_digits(study):
    assert study._significant(50 / 350 * 72, 6) == 10.2857
    assert study._significant(50 / 350 * 144, 6) == 20.5714
    assert study._significant(0.0123456789, 6) == 0.0123457
    assert study._significant(0.0, 6) == 0.0
    for value in np.geomspace(1e-4, 1e4, 97):
        assert study._significant(float(value), 6) == float(f"{value:.6g}")


def test_steps_to_target_is_the_first_evaluation_at_or_above_it(study):
    history = [{"step": 10, "top1": 0.70}, {"step": 20, "top1": 0.85}, {"step": 30, "top1": 0.84}]
    assert study.steps_to_target(history, 0.85) == 20
    assert study.steps_to_target(history, 0.90) is None


def _entry(study, run, top1, history_top1=None):
    history = [{"epoch": e, "step": e * 10, "top1": t} for e, t in enumerate(history_top1 or [top1], 1)]
    return {
        "settings": {},
        "name": run.name,
        **dataclasses.asdict(run),
        "final_top1": top1,
        "diverged": False,
        "history": history,
        "steps": history[-1]["step"],
        "cpu_seconds": 60.0,
    }


def _finished_runs(study, large_top1):
    d = study.DESIGN
    runs = {}
    scores = {256: dict(zip(d.grid(256), (0.86, 0.87, 0.865, 0.85), strict=True)),
              4096: dict(zip(d.grid(4096), (0.84, 0.86, 0.85, 0.83), strict=True))}  # fmt: skip
    for batch, points in scores.items():
        for lr, top1 in points.items():
            run = study.Run("grid", batch, lr, d.epochs, 0)
            runs[run.name] = _entry(study, run, top1)
    picks = {256: d.grid(256)[1], 4096: d.grid(4096)[1]}
    for run in study.planned_runs(d, picks):
        top1 = {"final-256": BASE, "final-4096": large_top1, "half-256": [0.881] * 3, "long-4096": [0.86]}[
            run.name.rsplit("-seed", 1)[0]
        ][run.seed]
        runs[run.name] = _entry(study, run, top1, [0.80, 0.851, top1])
    return runs


def test_the_committed_summary_and_the_performance_page_state_the_verdict_the_script_computes(study):
    """The verdict in the results file and on the performance page is the script's, recomputed here from the
    per-run figures."""
    results = _committed_results()
    third = study.epoch_multiplier.MULTIPLIER
    summary = study.report_figures(study.DESIGN, third, results["runs"], results["reference"])["summary"]
    assert json.loads(json.dumps(summary)) == results["summary"]  # as the file holds it (tuples as lists)
    with open(os.path.join(REPO, "docs", "performance.md")) as f:
        page = f.read()
    paragraph = page[page.index("`benchmarks/large_batch_study.py` tests") :].split("\n\n", 1)[0]
    stated = {v for v in ("reproduces", "refutes", "budget-limited") if f"**{v}**" in paragraph}
    assert stated == {summary["verdict"]}


def test_summary_carries_the_issues_keys_and_the_scripts_verdict(study):
    runs = _finished_runs(study, [0.878, 0.880, 0.879])
    report = study.summarise(study.DESIGN, runs, {"test_top1": 0.84, "image_size": 28})
    s = report["summary"]
    for key in (
        "small_batch", "large_batch", "epochs", "seeds", "baseline_top1", "lars_large_top1",
        "baseline_top1_mean", "lars_large_top1_mean", "delta_ci90", "verdict", "baseline_half_epochs_top1",
        "simple_reference_top1", "lr_grids",
    ):  # fmt: skip
        assert key in s, key
    assert s["baseline_top1"] == BASE and s["seeds"] == [0, 1, 2]
    assert s["verdict"] == "reproduces" and s["complete"]
    assert all(s["verdict_conditions"]["reproduces"].values())
    assert s["lr_grids"]["lars-256"] == {
        "grid": list(study.DESIGN.grid(256)),
        "picked": study.DESIGN.grid(256)[1],
    }
    assert len(s["delta_ci90"]) == 2 and s["delta_ci90"][0] < s["delta"] < s["delta_ci90"][1]
    assert s["steps_to_target"]["runs"]["final-4096-seed0"] == 20
    assert s["simple_reference_top1"] == 0.84


def test_resume_takes_runs_with_the_same_settings_only(study, tmp_path):
    d = study.DESIGN
    path = tmp_path / study.RESULTS
    run = study.Run("final", 256, 1.0, d.epochs, 0)
    entry = {**_entry(study, run, 0.88), "settings": {"config": {"a": 1}, "split": "final"}}
    path.write_text(json.dumps({"design": d.to_dict(), "runs": {run.name: entry}}))
    results = study.Results(str(path), d)
    assert results.get(run, {"config": {"a": 1}, "split": "final"}) == entry
    assert results.get(run, {"config": {"a": 2}, "split": "final"}) is None
    # The 20-epoch study's file (no design) is not resumed from.
    path.write_text(json.dumps({"runs": {run.name: entry}}))
    assert study.Results(str(path), d).runs == {}


def test_a_results_file_of_another_design_stops_the_study_with_one_line(study, tmp_path):
    d = study.DESIGN
    path = tmp_path / study.RESULTS
    path.write_text(json.dumps({"design": dataclasses.replace(d, epochs=36, seeds=5).to_dict(), "runs": {}}))
    with pytest.raises(SystemExit, match=r"holds runs of another design \(differs in epochs, seeds\)"):
        study.Results(str(path), d)
    assert study.Results(str(tmp_path / "absent.json"), d).runs == {}


def test_report_writes_the_design_before_any_run_and_the_verdict_after(study, tmp_path):
    (tmp_path / study.REPORT).write_text("# old\n\n## Superseded: the 20-epoch study\n\nkept text\n")
    assert study.main(["--out-dir", str(tmp_path), "--design-only"]) == 0
    text = (tmp_path / study.REPORT).read_text()
    assert text.index("## Design (fixed before the runs)") < text.index("## Results")
    assert "**refutes** if" in text and "kept text" in text
    saved = json.loads((tmp_path / study.RESULTS).read_text())
    assert saved["summary"]["verdict"] == "budget-limited" and saved["runs"] == {}

    saved["runs"] = _finished_runs(study, [0.850, 0.852, 0.848])
    (tmp_path / study.RESULTS).write_text(json.dumps(saved))
    assert study.main(["--out-dir", str(tmp_path), "--report-only"]) == 0
    saved = json.loads((tmp_path / study.RESULTS).read_text())
    assert saved["summary"]["verdict"] == "refutes"
    text = (tmp_path / study.REPORT).read_text()
    assert "- **refutes**" in text and (tmp_path / study.PLOT).exists()
    assert "refutes needs all of: interval's upper end < -1 pt: yes; baseline saturated: yes;" in text


def test_the_saturation_line_makes_no_call_before_every_half_epoch_seed_is_in(study):
    assert study._saturation_call(None, 2, 3) == "no call before all 3 seeds are in (2 so far)"
    assert study._saturation_call(False, 3, 3) == "not saturated"
    assert study._saturation_call(True, 3, 3) == "saturated"


def test_a_stopped_run_resumes_only_in_a_directory_started_with_its_settings(study, tmp_path):
    settings = {"config": {"a": 1}, "split": "final"}
    model_dir = str(tmp_path / "runs" / "final-256-seed0")
    assert study.prepare_model_dir(model_dir, settings) == 0.0  # new: started afresh, settings recorded
    checkpoints = tmp_path / "runs" / "final-256-seed0" / "checkpoints"
    checkpoints.mkdir()
    history = [{"epoch": 1.0, "step": 3}, {"epoch": 2.0, "step": 7}, {"epoch": 3.0, "step": 10}]
    (checkpoints / "history.json").write_text(json.dumps(history))
    # Killed between writing the history and the checkpoint of epoch 3: it resumes after epoch 2.
    (checkpoints / "ckpt-7.index").write_text("x")
    (checkpoints / "checkpoint").write_text(
        'model_checkpoint_path: "ckpt-7"\nall_model_checkpoint_paths: "ckpt-7"\n'
    )
    assert study.prepare_model_dir(model_dir, settings) == 2.0
    assert (checkpoints / "ckpt-7.index").exists()
    # Other settings: the checkpoints are not theirs, so the directory starts afresh.
    assert study.prepare_model_dir(model_dir, {**settings, "config": {"a": 2}}) == 0.0
    assert not checkpoints.exists()
    # A history cut short by a kill, or none: nothing to resume from.
    for history_text in ('[{"epoch": 1.0, "st', None):
        checkpoints.mkdir()
        (checkpoints / "checkpoint").write_text('model_checkpoint_path: "/abs/checkpoints/ckpt-7"\n')
        if history_text is not None:
            (checkpoints / "history.json").write_text(history_text)
        assert study.prepare_model_dir(model_dir, {**settings, "config": {"a": 2}}) == 0.0
        assert not checkpoints.exists()
    # Killed before its first checkpoint (the history may be written already): nothing to resume from.
    checkpoints.mkdir()
    (checkpoints / "history.json").write_text(json.dumps(history[:1]))
    assert study.prepare_model_dir(model_dir, {**settings, "config": {"a": 2}}) == 0.0
    assert not checkpoints.exists()


def test_only_a_trainer_that_says_so_diverged_and_any_other_failure_stops_the_study(study, tmp_path):
    run = study.Run("final", 4096, 4.0, study.DESIGN.epochs, 0)
    model_dir = tmp_path / "runs" / run.name
    model_dir.mkdir(parents=True)
    log = tmp_path / "runs" / f"{run.name}.log"
    history = [{"epoch": 1.0, "step": 14, "top1": 0.61}, {"epoch": 2.0, "step": 29, "top1": 0.72}]
    (model_dir / "metrics.json").write_text(json.dumps({"history": history, "steps": 29}))
    log.write_text("epoch 2.00  step 29/29  top-1 0.7200\n")
    assert study._outcome(run, str(model_dir), 0) == {
        "history": history, "final_top1": 0.72, "steps": 29, "diverged": False,
    }  # fmt: skip
    # Killed or failed after its last evaluation (metrics written, export not): not a divergence.
    with pytest.raises(SystemExit, match=rf"{run.name} failed \(exit -9\); see .*{run.name}\.log"):
        study._outcome(run, str(model_dir), -9)
    (model_dir / "metrics.json").unlink()
    log.write_text("training loss became nan between steps 14 and 29; the last good checkpoint ...\n")
    assert study._outcome(run, str(model_dir), 1) == {
        "history": [], "final_top1": None, "steps": None, "diverged": True,
    }  # fmt: skip
