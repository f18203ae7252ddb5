"""The whole pipeline with the LocalDagRunner on the embedded data, and its compilation for Vertex / Kubeflow."""

import dataclasses
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest
import suite_env
from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

from effnet_common import console, goodput
from pipeline import local_runner, presets, runs_page

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The demo made short: 4 epochs reach about 0.4 top-1 on the embedded digits (chance is 0.1), an evaluation every
# epoch. Its target, 0.3, is one that no evaluation before the Ctrl-C below (epoch 1, near chance) can reach.
SHORT = ["--preset", "demo", "--set", "loop.train_epochs=4", "--set", "loop.eval_every_epochs=1"]
TARGET = ["--target-top1", "0.3"]
# Each pipeline (one per preset) pushes to a directory of its own.
SERVING = pathlib.Path("serving_model", "effnet-demo")


def _store(root):
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = str(root / "metadata.sqlite")
    return metadata_store.MetadataStore(config)


def _executions(store, component):
    """Executions of a component, oldest first (execution types are named by component class)."""
    return [
        e
        for e in store.get_executions()
        if store.get_execution_types_by_id([e.type_id])[0].name.endswith(f".{component}")
    ]


def result_report_path(out: str) -> str:
    return next(line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("run report: "))


def _run_cli(*args):
    """``python -m pipeline.local_runner`` as a person runs it."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline.local_runner", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=1800,
        env=suite_env.child(),
    )


def _console_lines(result) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]


def _runs(root: pathlib.Path, out: str) -> tuple[list[runs_page.Row], str]:
    """The root's runs, newest first, and its page, which the console names."""
    page = root / runs_page.RUNS_DIR / runs_page.PAGE_FILE
    assert f"runs of this root: {page}" in out.splitlines()
    rows, skipped = runs_page.parse_rows((page.parent / runs_page.ROWS_FILE).read_text())
    assert not skipped
    return runs_page.newest_first(rows), page.read_text()


@dataclasses.dataclass(frozen=True)
class DemoRuns:
    """The short demo run three times on one root, as a person runs it (``demo_runs``)."""

    root: pathlib.Path
    stopped_status: int  # the exit status of the run stopped by Ctrl-C
    before_stop: list[str]  # its console lines up to its first evaluation's
    after_stop: list[str]  # its non-empty console lines after the Ctrl-C
    left_by_stop: list[str]  # what it left half-done under the root (``_leftovers``)
    resumed: subprocess.CompletedProcess  # the same command again: resumes, blesses, pushes
    again: subprocess.CompletedProcess  # and once more: every step reused
    wall: tuple[float, float]  # the stopped run's start and the resumed run's end, by this process's clock


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory) -> DemoRuns:
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) while the demo trains, just after its first
    evaluation's checkpoint; then the same command, which resumes from that checkpoint, blesses and pushes; then
    the same command once more. The tests below read what these runs printed and left; one pipeline run more
    than a plain blessed run costs, where separate runs would cost three."""
    root = tmp_path_factory.mktemp("local_pipeline")
    args = ["--pipeline-root", root, *SHORT, *TARGET]
    command = [sys.executable, "-m", "pipeline.local_runner", *map(str, args)]
    started = time.time()
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        start_new_session=True,
        env=suite_env.child(),
    )
    try:
        before = []
        for line in process.stdout:
            before.append(line)
            if line.startswith("epoch "):
                break
        assert process.poll() is None, "".join(before)
        # The first evaluation's checkpoint (written just after its line).
        states = root / "checkpoints" / "effnet-demo"
        while not list(states.glob("*/checkpoint")) and process.poll() is None:
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGINT)
        after = [line for line in process.stdout.read().splitlines() if line.strip()]
        status = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    left = _leftovers(root)  # read before the next run, which might tidy up what this one left
    resumed = _run_cli(*args)
    ended = time.time()
    return DemoRuns(root, status, before, after, left, resumed, _run_cli(*args), (started, ended))


@pytest.mark.slow
def test_local_pipeline_trains_evaluates_blesses_and_pushes(demo_runs):
    root, result = demo_runs.root, demo_runs.resumed
    assert result.returncode == 0, result.stderr[-3000:]
    store = _store(root)
    types = {store.get_artifact_types_by_id([a.type_id])[0].name for a in store.get_artifacts()}
    assert {"Examples", "Model", "ModelRun", "ModelEvaluation", "ModelBlessing", "PushedModel"} <= types
    assert os.listdir(root / "serving_model") == [SERVING.name]
    pushed = os.listdir(root / SERVING)
    assert len(pushed) == 1
    assert os.path.exists(root / SERVING / pushed[0] / "saved_model.pb")
    examples = [a for a in store.get_artifacts_by_type("Examples")][0]
    assert examples.custom_properties["train_records"].int_value == 1438
    assert examples.custom_properties["validation_records"].int_value == 359
    # The run report of the Trainer's model directory carries the pipeline's verdict, and the runner names it.
    model_run = max(store.get_artifacts_by_type("ModelRun"), key=lambda a: a.id)
    page = (pathlib.Path(model_run.uri) / "report.html").read_text()
    assert "TFMA top-1 (validation split)" in page and "blessed by the Evaluator" in page
    # The page of the root's runs lists the run: its top-1, its blessing, its version, a link to its report.
    # (The run after it, which reused every step, rewrote the page: it is the first row.)
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    (_, row, _), runs = _runs(root, demo_runs.again.stdout)
    assert (row.preset, row.target_top1, row.state, row.blessed) == ("demo", 0.3, runs_page.FINISHED, True)
    # The target is the trainer's stop: it ends at the first evaluation that reaches it, by epoch 4.
    assert row.top1 == outcome["top1"] and row.top5 == outcome["top5"] and 2 <= round(row.epochs) <= 4
    assert row.pushed_destination == str(root / SERVING / pushed[0]) and row.report == result_report_path(
        result.stdout
    )
    assert f"<td>{outcome['top1']:.4f}</td>" in runs and '<span class="blessed">blessed</span>' in runs
    assert f">{pushed[0]}</span>" in runs and f'href="../{os.path.relpath(row.report, root)}"' in runs


@pytest.mark.slow
def test_console_is_a_short_account_and_the_library_logs_go_to_a_file(demo_runs):
    root, result = demo_runs.root, demo_runs.resumed
    out, lines = result.stdout, _console_lines(result)
    evaluations = [line for line in lines if line.startswith("epoch ")]
    assert evaluations and all("top-1 " in e and "img/s" in e and "ETA " in e for e in evaluations), lines
    # The full demo evaluates every 5 of its 30 epochs: with its evaluation lines instead of this run's, the
    # account must fit in 40 lines too.
    demo = presets.get("demo").trainer_config().loop
    assert len(lines) - len(evaluations) + demo.train_epochs // demo.eval_every_epochs <= 40, "\n".join(lines)
    assert not result.stderr.strip()  # TensorFlow's import messages, Beam, TFX: all in the log file
    for step in ("ImageNetShardGen", "Trainer", "Evaluator", "Pusher"):
        assert re.search(rf"^\[\d/\d\] {step}: (running|CACHED)", out, re.M), step
    for step in ("Trainer", "Evaluator", "Pusher"):
        assert re.search(rf"^\[\d/\d\] {step}: running$", out, re.M), step
        assert re.search(rf"^\[\d/\d\] {step}: done in [\dhms.]+$", out, re.M), step
    assert "model BLESSED by the Evaluator" in out and f"pushed to {root / SERVING}" in out
    assert re.search(
        rf"^TensorBoard: {re.escape(console.program_command('tensorboard'))} --logdir {re.escape(str(root))}/artifacts/\S+/tensorboard$",
        out,
        re.M,
    )
    (log_line,) = [line for line in lines[:3] if line.startswith("full log: ")]
    log = pathlib.Path(log_line.split(": ", 1)[1])
    assert log.parent == root / "logs"
    text = log.read_text()
    assert "Going to run a new execution" in text and "Component Pusher is finished" in text  # TFX
    assert "trainer_module: train step" in text  # this project's own INFO records
    # Beam's records: the sharding step ran in the first (stopped) run, whose log has them.
    stopped_log = next(line for line in demo_runs.before_stop if line.startswith("full log: "))
    assert "apache_beam" in pathlib.Path(stopped_log.split(": ", 1)[1].strip()).read_text()


@pytest.mark.slow
def test_ctrl_c_during_training_stops_in_one_line_and_the_next_run_resumes_then_reuses_everything(demo_runs):
    """SIGINT to the demo's process group while it trains, as a terminal's Ctrl-C sends it: no traceback, a
    few lines, nothing temporary left under the root, the checkpoint kept; the next run resumes the training
    from it and pushes; a run after that reuses every step and pushes no second version."""
    root, after = demo_runs.root, demo_runs.after_stop
    assert demo_runs.stopped_status == 130, "".join(demo_runs.before_stop) + "\n".join(after)
    assert len(after) <= 5 and not [line for line in after if "Traceback" in line], after
    (stopped,) = [line for line in after if line.startswith("stopped by the user: ")]
    assert (
        "the Trainer stopped: its checkpoint of step" in stopped and "run the same command again" in stopped
    )
    step = int(re.search(r"checkpoint of step (\d+)", stopped).group(1))
    assert not demo_runs.left_by_stop, demo_runs.left_by_stop

    resumed = demo_runs.resumed
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"training: resumed at step {step} of " in resumed.stdout
    assert re.search(r"^\[\d/\d\] ImageNetShardGen: CACHED", resumed.stdout, re.M)
    again = demo_runs.again
    assert again.returncode == 0, again.stderr[-3000:]
    for component in ("ImageNetShardGen", "Trainer", "Evaluator", "Pusher"):
        assert re.search(rf"^\[\d/\d\] {component}: CACHED", again.stdout, re.M), again.stdout
    assert "already pushed to " in again.stdout and len(os.listdir(root / SERVING)) == 1
    store = _store(root)
    assert len(store.get_artifacts_by_type("PushedModel")) == 1
    # The stopped run has its row too, added by the stop; the last run's push is the resumed run's.
    rows, runs = _runs(root, again.stdout)
    assert [row.state for row in rows] == [runs_page.FINISHED, runs_page.FINISHED, runs_page.STOPPED]
    assert rows[0].pushed_before and rows[0].pushed_destination == rows[1].pushed_destination
    assert not rows[1].pushed_before and rows[2].top1 is None and "(pushed before)" in runs


def _account(model_run_uri: str) -> goodput.TimeAccount:
    with open(pathlib.Path(model_run_uri) / "metrics.json") as f:
        return goodput.TimeAccount.from_dict(json.load(f)["time_account"])


def _assert_adds_up(account: goodput.TimeAccount, measured_seconds: float) -> None:
    """The account's parts add up to its wall time, which is the wall time this process measured around the
    commands within 5%, and next to nothing of it is unaccounted."""
    assert sum(account.parts.values()) == pytest.approx(account.wall_seconds, rel=1e-6)
    assert account.wall_seconds == pytest.approx(measured_seconds, rel=0.05), (
        account.parts,
        measured_seconds,
    )
    assert account.parts.get(goodput.UNACCOUNTED, 0.0) < 0.01 * account.wall_seconds, account.parts


@pytest.mark.slow
def test_a_stopped_and_resumed_run_accounts_for_its_wall_time_across_both_commands(demo_runs):
    """The resumed run's account (its metrics.json, its report, its row, its console line) starts with the
    stopped command: the time between the two commands, the steps trained again and the recovery are parts of
    their own, beside the training steps, the trace and compile, the evaluations and the other steps."""
    root, resumed = demo_runs.root, demo_runs.resumed
    outcome = json.loads(resumed.stdout.strip().splitlines()[-1])
    account = _account(outcome["model_run_uri"])
    _assert_adds_up(account, demo_runs.wall[1] - demo_runs.wall[0])
    parts = account.parts
    assert account.disruptions == 1 and parts["STOPPED"] > 0, parts
    assert (
        parts.get("WASTED_PROGRESS_FROM_DISRUPTION", 0) + parts["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] > 0
    )
    for part in (
        goodput.GOODPUT,
        "PROGRAM_STARTUP",
        "EVAL",
        "CHECKPOINT_SAVE",
        "COMMAND_STARTUP",
        "Evaluator",
    ):
        assert parts[part] > 0, part
    assert "goodput" not in "".join(demo_runs.after_stop)  # the stopped command did not end its run
    assert account.one_line() in resumed.stdout.splitlines()
    page = (pathlib.Path(outcome["model_run_uri"]) / "report.html").read_text()
    assert "goodput (training steps that count" in page and 'src="report_time.png"' in page
    assert (pathlib.Path(outcome["model_run_uri"]) / "report_time.png").stat().st_size > 0
    (again_row, resumed_row, _), runs = _runs(root, demo_runs.again.stdout)
    assert resumed_row.goodput == pytest.approx(account.goodput, abs=1e-4)
    assert f">{account.goodput:.0%}<" in runs
    # The run after it reused every step: an account of its own, without a Trainer's parts.
    (again_line,) = [line for line in demo_runs.again.stdout.splitlines() if line.startswith("goodput ")]
    assert again_line == again_row.time_account_line and "training steps" not in again_line


@pytest.mark.slow
def test_unreachable_target_stops_nothing_early_blesses_nothing_and_pushes_nothing(demo_runs):
    root = demo_runs.root
    logs_before = len(os.listdir(root / "logs"))
    # --verbose: the same short account on stdout, the libraries' logs live on stderr instead of in a file.
    started = time.time()
    result = _run_cli("--pipeline-root", root, *SHORT, "--target-top1", "0.999", "--verbose")
    took = time.time() - started
    out = result.stdout
    assert result.returncode == local_runner.NOT_BLESSED_EXIT, result.stderr[-3000:]
    assert re.search(r"^model NOT blessed: top-1 0\.\d{4} is below the target 0\.9990$", out, re.M), out
    assert "nothing pushed" in out
    outcome = json.loads(out.strip().splitlines()[-1])
    assert outcome["model_run_uri"] and result_report_path(out) == f"{outcome['model_run_uri']}/report.html"
    assert outcome["blessed"] is False and outcome["pushed"] is False and 0.0 < outcome["top1"] < 0.999
    assert len(os.listdir(root / SERVING)) == 1  # only the first runs' model
    store = _store(root)
    cached, complete = metadata_store_pb2.Execution.CACHED, metadata_store_pb2.Execution.COMPLETE
    assert [e.last_known_state for e in _executions(store, "ImageNetShardGen")][-1] == cached
    assert re.search(r"^\[\d/\d\] ImageNetShardGen: CACHED", out, re.M)
    # The target is the trainer's stop as well as the gate (as on Vertex): the Trainer runs again with it,
    # to the end of its epochs.
    for component in ("Trainer", "Evaluator"):
        assert [e.last_known_state for e in _executions(store, component)][-1] == complete, component
    model_run = max(store.get_artifacts_by_type("ModelRun"), key=lambda a: a.id)
    with open(pathlib.Path(model_run.uri) / "config.json") as f:
        assert json.load(f)["config"]["loop"]["target_top1"] == 0.999
    assert "Going to run a new execution" in result.stderr and "apache_beam" in result.stderr
    assert "full log: " not in out and len(os.listdir(root / "logs")) == logs_before  # no log file of its own
    # The page lists every run, this one first, with why it was not blessed.
    (row, latest, *_), runs = _runs(root, out)
    assert (row.target_top1, row.blessed, row.top1, row.pushed_destination) == (
        0.999,
        False,
        outcome["top1"],
        None,
    )
    assert round(row.epochs) == 4  # no evaluation reached the target: the training went on to its end
    # Its account: this command alone. The training it continues ended (no disruption) at its last epoch: the
    # Trainer restores it, trains no step, evaluates and exports again.
    account = _account(outcome["model_run_uri"])
    _assert_adds_up(account, took)
    assert (
        account.disruptions == 0 and "STOPPED" not in account.parts and goodput.GOODPUT not in account.parts
    )
    assert account.parts["TRAINING_PREP"] > 0 and account.parts["EXPORT"] > 0 and account.goodput == 0
    assert row.goodput == 0
    assert row.why_not.startswith("top-1 ") and latest.target_top1 == 0.3 and latest.blessed
    assert runs.index(f"<td>{outcome['top1']:.4f}</td>") < runs.index('<span class="blessed">blessed</span>')
    assert f'<span class="refused">not blessed: {row.why_not}</span>' in runs


def test_paper_presets_shard_for_their_hosts():
    preset = presets.get("b5-lars-1024x65536")
    assert (preset.num_hosts, preset.train_shards % 128, preset.val_shards % 128) == (128, 0, 0)
    assert preset.resolve(inputs={"train_dir": "t", "val_dir": "v"}).target_top1 == 0.830


def test_a_pipeline_run_is_resolved_once_with_its_target_in_the_trainer_config():
    """The target comes from the trainer preset, a --set setting or --target-top1 (each winning over the
    one before); the pipeline's smoke preset gates at 0; a run without a target is refused in one line."""
    inputs = {"train_archive": "train.tar", "val_archive": "val.tar"}
    demo = presets.get("demo")
    assert demo.resolve(inputs=inputs).target_top1 == 0.95
    run = demo.resolve({"loop.target_top1": 0.5, "loop.train_epochs": 30}, inputs=inputs)
    assert (run.target_top1, run.trainer_config.loop.target_top1, run.trainer_config.loop.train_epochs) == (
        0.5,
        0.5,
        30,
    )
    assert demo.resolve({"loop.target_top1": 0.5}, target_top1=0.7, inputs=inputs).target_top1 == 0.7
    assert presets.get("smoke").resolve(inputs=inputs).target_top1 == 0.0
    with pytest.raises(ValueError, match="no target top-1"):
        demo.resolve(target_top1=None, inputs=inputs)
    with pytest.raises(ValueError, match=r"loop.target_top1=1.5 is outside"):
        demo.resolve(target_top1=1.5, inputs=inputs)
    sharding = demo.resolve(inputs=inputs).sharding
    assert (sharding.num_hosts, sharding.train_shards, sharding.train_archive) == (2, 8, "train.tar")


@pytest.mark.slow
def test_tuning_step_chooses_the_values_the_trainer_trains_with(tmp_path):
    """``--tune``: a Tuner step (TFX's, with KerasTuner) runs trials of the trainer on the shards, and the
    Trainer trains with the best trial's values; the console and the run's config.json say which. One trial:
    choosing among several is the search's own (tests/test_tuning.py, and the Vertex flock's two in
    tests/test_vertex_steps.py); what this pipeline adds is the step between the search and the Trainer."""
    tune = ["--tune", "--tune-search", "random", "--tune-max-trials", "1", "--tune-max-epochs", "1"]
    result = _run_cli("--pipeline-root", tmp_path, "--preset", "smoke", *tune)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert re.search(r"^\[\d/\d\] Tuner: done in ", out, re.M) and "Search space summary" not in out
    # A line per trial, as the standalone search prints them.
    assert len(re.findall(r"^trial \S+ completed .*top-1 0\.\d{4} at epoch 1 ", out, re.M)) == 1, out
    store = _store(tmp_path)
    (hyperparameters,) = store.get_artifacts_by_type("HyperParameters")
    with open(pathlib.Path(hyperparameters.uri) / "best_hyperparameters.txt") as f:
        best = json.load(f)["values"]
    model_run = max(store.get_artifacts_by_type("ModelRun"), key=lambda a: a.id)
    with open(pathlib.Path(model_run.uri) / "config.json") as f:
        saved = json.load(f)
    tuned = saved["tuned"]
    assert tuned and set(tuned) <= set(best)
    # The smoke trials' schedule is the run's own (1 epoch), so the values apply unscaled.
    assert {key: best[key] for key in tuned} == tuned
    assert saved["config"]["schedule"]["lr_per_256"] == best["schedule.lr_per_256"]
    (line,) = [line for line in out.splitlines() if line.startswith("trained with the Tuner's values: ")]
    assert "lr_per_256=" in line
    # The Tuner's other output (one score per trial) and the run report's account of the tuned values.
    (results,) = store.get_artifacts_by_type("TunerResults")
    with open(pathlib.Path(results.uri) / "tuner_results.json") as f:
        scores = [trial["score"] for trial in json.load(f)]
    assert len(scores) == 1 and all(0.0 <= score <= 1.0 for score in scores)
    page = (pathlib.Path(model_run.uri) / "report.html").read_text()
    assert "Settings from hyperparameter tuning" in page and "schedule.lr_per_256" in page


def _leftovers(root: pathlib.Path) -> list[str]:
    """What a stopped run would leave half-done under the pipeline root: temporary or half-written files, a
    step's temporary or working directory with something in it, output directories no finished execution owns.
    (TFX leaves a finished execution's ``executor_execution/<id>`` directory empty.)"""
    found = [str(p) for p in root.rglob("*") if re.search(r"tmp|temp|\.inprogress", p.name)]
    for system in root.glob("artifacts/*/.system"):
        found += [str(p) for p in system.glob("executor_execution/*/*")]
        found += [str(p) for p in system.glob("stateful_working_dir/*")]
    store = _store(root)
    owned = {pathlib.Path(a.uri) for a in store.get_artifacts()}
    for output in root.glob("artifacts/*/[!.]*/*"):
        if output not in owned:
            found.append(str(output))
    return found


def test_the_local_baseline_is_the_latest_blessed_model_other_than_the_candidate():
    """A rerun's cached model is not compared with itself (its Evaluator and Pusher stay cached); a new model
    is compared with the latest model blessed before it."""
    from tfx.types import standard_artifacts

    from components.latest_blessed import LatestBlessedOtherModelStrategy

    def model(i):
        artifact = standard_artifacts.Model()
        artifact.id = i
        return artifact

    def blessing(model_id, blessed):
        artifact = standard_artifacts.ModelBlessing()
        artifact.id = 100 + model_id
        artifact.set_int_custom_property("current_model_id", model_id)
        artifact.set_int_custom_property("blessed", int(blessed))
        return artifact

    models, blessings = (
        [model(1), model(2), model(3)],
        [blessing(1, True), blessing(2, True), blessing(3, False)],
    )
    strategy = LatestBlessedOtherModelStrategy()

    def baseline(candidate):
        inputs = {"model": list(models), "model_blessing": list(blessings), "candidate": [candidate]}
        return [m.id for m in strategy.resolve_artifacts(None, inputs)["model"]]

    assert baseline(model(4)) == [2]  # a new model: the latest blessed one
    assert baseline(model(2)) == [1]  # the latest blessed model itself, again: the one blessed before it
    models, blessings = [model(1)], [blessing(1, True)]
    assert (
        baseline(model(1)) == []
    )  # the only blessed model, again: no baseline, as when it was first evaluated


def test_the_verdict_says_which_blessing_condition_failed():
    from tensorflow_model_analysis.proto import validation_result_pb2

    from components.evaluation_results import refusals
    from pipeline import outcome

    validation = validation_result_pb2.ValidationResult(validation_ok=False)
    per_slice = validation.metric_validations_per_slice.add()
    below = per_slice.failures.add()
    below.metric_key.name = "sparse_categorical_accuracy"
    below.metric_value.double_value.value = 0.9412
    below.metric_threshold.value_threshold.lower_bound.value = 0.95
    worse = per_slice.failures.add()
    worse.metric_key.name = "sparse_categorical_accuracy"
    worse.metric_key.is_diff = True
    worse.metric_value.double_value.value = -0.0125
    assert refusals(validation) == (
        "top-1 0.9412 is below the target 0.9500",
        "its top-1 is 0.0125 below the last blessed model's",
    )
    verdict = outcome.Outcome(0.95, 0.9412, None, False, False, None, None, refusals=refusals(validation))
    assert (
        "model NOT blessed: top-1 0.9412 is below the target 0.9500; its top-1 is 0.0125 below"
        in verdict.report()
    )


def _record(message, *args):
    import logging

    return logging.LogRecord("absl", logging.INFO, __file__, 0, message, args, None)


def test_a_stopped_step_leaves_none_of_its_directories_and_the_stop_line_says_what_was_kept(tmp_path):
    """What Ctrl-C in the middle of a step removes (its outputs, TFX's temporary and working directories for it,
    a Pusher's half-copied version) and keeps (finished steps, earlier versions, the Trainer's checkpoints)."""
    from pipeline import local_steps

    artifacts, serving = tmp_path / "artifacts", tmp_path / "serving"
    checkpoints = tmp_path / "checkpoints"
    steps = local_steps.StepLines(3, str(artifacts), str(checkpoints), str(tmp_path / "tuning"), str(serving))
    assert steps.stop_description() == "nothing ran yet; run the same command again"

    def run_step(node, execution, outputs):
        steps.emit(_record(steps.RUNNING, node))
        steps.emit(_record(steps.NEW_EXECUTION, execution))
        made = [artifacts / node / name / str(execution) for name in outputs]
        made += [artifacts / node / ".system" / "executor_execution" / str(execution) / ".temp"]
        made += [artifacts / node / ".system" / "stateful_working_dir" / f"uuid-{execution}"]
        for directory in made:
            directory.mkdir(parents=True)
        return made

    finished = run_step("ImageNetShardGen", 1, ["examples"])
    assert "ImageNetShardGen did not finish" in steps.stop_description()
    steps.emit(_record(steps.FINISHED, "ImageNetShardGen"))
    assert steps.unfinished_directories() == [] and "the finished steps are kept" in steps.stop_description()

    run_step("Trainer", 2, ["model", "model_run"])
    assert steps.stop_description().startswith("the Trainer stopped: no checkpoint yet")
    (checkpoints / "key").mkdir(parents=True)
    (checkpoints / "key" / "checkpoint").write_text('model_checkpoint_path: "ckpt-224"\n')
    assert steps.stop_description() == (
        f"the Trainer stopped: its checkpoint of step 224 is kept in {checkpoints}; run the same command again to "
        "resume the training"
    )
    steps.emit(_record(steps.FINISHED, "Trainer"))

    (serving / "1700000000").mkdir(parents=True)  # an earlier run's push
    pusher = run_step("Pusher", 3, ["pushed_model"])
    (serving / "1700000099").mkdir()  # this push, half-copied
    steps.remove_unfinished()
    assert not [path for path in pusher if path.exists()] and os.listdir(serving) == ["1700000000"]
    assert all(path.exists() for path in finished[:1]) and (artifacts / "Trainer" / "model" / "2").exists()
    assert "Pusher did not finish (its partial output was removed), the steps before it are cached" in (
        steps.stop_description()
    )


# The demo's data and shards with the plumbing tests' 3-block network, whose 16 replicas trace and export in a
# third of tiny's time: what is checked is the slice's life. At 8 images a replica the batch norm statistics let
# it learn: two evaluations, at steps 44 and 89 (top-1 0.10 and 0.68, measured); the target is first reached at
# the second, so the trainer resumed at the first trains on.
PREEMPTIBLE = [
    "--preset", "demo", "--set", "model.variant=micro", "--set", "data.global_batch_size=128",
    "--set", "loop.train_epochs=8", "--set", "loop.eval_every_epochs=4", "--target-top1", "0.3",
    # Calls of 5 steps: the goodput record is written after each, so the steps the preemption costs are on it.
    "--set", "loop.steps_per_loop=5",
]  # fmt: skip


@pytest.mark.slow
def test_a_rehearsed_pod_run_is_preempted_resumed_blessed_and_pushed_and_leaves_no_slice(
    tmp_path, local_images
):
    """``--rehearse-slice tpu-v4-32``: the Trainer trains through the TPU VM backend against the rehearsal Cloud
    TPU API; its 4 hosts report, worker 0 trains in the trainer-tpu image; preempted once past its first checkpoint,
    the slice is created again and the trainer resumes at a step > 0 (that a resumed training ends as an
    uninterrupted one does, bit for bit, is tests/test_train.py's); the model is blessed and pushed, and no slice
    is left."""
    root = tmp_path / "root"
    started = time.time()
    result = _run_cli(
        "--pipeline-root", root, *PREEMPTIBLE,
        "--rehearse-slice", "tpu-v4-32", "--rehearse-preempt-at-step", "40",
    )  # fmt: skip
    took = time.time() - started
    out = result.stdout
    assert result.returncode == 0, result.stderr[-3000:] + out[-3000:]
    (summary,) = [line for line in out.splitlines() if line.startswith("rehearsed tpu-v4-32: ")]
    assert re.fullmatch(
        r"rehearsed tpu-v4-32: 2 slices created \(\S+-0, \S+-1\), 1 preempted, 0 left", summary
    )
    assert "model BLESSED by the Evaluator" in out and len(os.listdir(root / SERVING)) == 1
    outcome = json.loads(out.strip().splitlines()[-1])
    model_run = pathlib.Path(outcome["model_run_uri"])
    attempts = sorted((model_run / "slice").glob("effnet-*"))
    assert [a.name[-2:] for a in attempts] == ["-0", "-1"]
    for attempt in attempts:  # worker 0 in the trainer image, with the TPU build; the others ran nothing
        reports = [json.loads((attempt / f"worker-{n}.json").read_text()) for n in range(4)]
        assert reports[0]["image"] == local_images["trainer-tpu"]
        assert "tensorflow-tpu==2.16.2" in reports[0]["tensorflow"]
        assert all(set(report) == {"worker", "setup", "host"} for report in reports[1:]), reports
    # Worker 0 of the second slice trained to the end, after resuming where the first one's checkpoint was.
    assert json.loads((attempts[1] / "trainer.json").read_text())["exit_code"] == 0
    starts = [e for e in _run_log(model_run) if e["event"] == "start"]
    assert [s["resumed"] for s in starts] == [False, True] and starts[1]["step"] > 0
    assert not (root / "tpu_rehearsal" / "hosts").exists() or not os.listdir(root / "tpu_rehearsal" / "hosts")

    # Where its time went: provisioning the two slices, their workers' set-up, the steps the preemption cost and
    # the recovery, each a part of its own; the plan's hours and cost beside the measured ones in the report.
    account = _account(outcome["model_run_uri"])
    _assert_adds_up(account, took)
    parts = account.parts
    assert account.disruptions == 1 and account.redone_steps > 0, parts
    for part in ("PROVISIONING", "WORKER_SETUP", "TEARDOWN", "WASTED_PROGRESS_FROM_DISRUPTION",
                 "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION", goodput.GOODPUT, "PROGRAM_STARTUP"):  # fmt: skip
        assert parts[part] > 0, (part, parts)
    assert account.one_line() in out.splitlines() and "lost to 1 disruption" in account.one_line()
    page = (model_run / "report.html").read_text()
    assert "time: plan / measured" in page and "hours of TPU v4 chips" in page and "an hour each" in page


def _run_log(model_run: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in (model_run / "run_log.jsonl").read_text().splitlines()]
