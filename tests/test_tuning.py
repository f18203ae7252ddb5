"""Hyperparameter tuning through the trainer's own loop: the space and its checks, truncated runs that resume
bit for bit, Hyperband continuing trials from their checkpoints, a search killed and resumed, the CLI's
refusals. TFX's Tuner and Trainer executors running ``tuner_fn`` and ``run_fn`` are tests/test_pipeline.py's
``--tune`` pipeline."""

import contextlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import time

import keras_tuner
import numpy as np
import pytest
import tensorflow as tf

from trainer_module import presets, resolve, run, train, tuning
from trainer_module.__main__ import main, parse_args
from trainer_module.config import replace, with_overrides
from trainer_module.recorder import read_run_log
from trainer_module.resolve import ResolvedRun
from trainer_module.tuning import Dimension
from trainer_module.tuning import trials as trial_files

# 400 training digits at batch 32 (12.5 steps an epoch), 16 px, deterministic ops: a trial is mostly start-up.
SMALL = (
    "data.num_train_examples=400",
    "data.global_batch_size=32",
    "model.image_size=16",
    "loop.deterministic=true",
)


@pytest.fixture
def digits(digit_shards):
    """The shared digit shards (tests/conftest.py): 400 training / 100 validation digits in TFX's Examples
    layout (``Split-<name>/``), which the Tuner and Trainer executors read."""
    return digit_shards


# ---------------------------------------------------------------------------------------------- the space


SPACE_ERRORS = {
    "not a setting": (Dimension("foo.bar", "log", 1, 2), "foo.bar: unknown config section 'foo'"),
    "unknown field": (Dimension("schedule.nope", "log", 1, 2), "schedule.nope: unknown config field"),
    "unknown kind": (Dimension("schedule.lr_per_256", "cubic", 1, 2), "kind 'cubic' is not one of"),
    "log from zero": (Dimension("schedule.lr_per_256", "log", 0, 1), "a log range needs LOW > 0"),
    "bounds reversed": (
        Dimension("schedule.warmup_epochs", "linear", 2, 1),
        "bounds 2:1 must satisfy LOW < HIGH",
    ),
    "bound out of range": (
        Dimension("optimizer.label_smoothing", "linear", 0, 1.5),
        "optimizer.label_smoothing: bound 1.5 is refused (optimizer.label_smoothing=1.5 is outside [0.0, 1.0))",
    ),
    "not read here": (
        Dimension("optimizer.lars_eeta", "log", 1e-4, 1e-2),
        "optimizer.lars_eeta: read only with optimizer.name='lars', and this config has 'rmsprop'",
    ),
    "wrong type": (
        Dimension("model.variant", "log", 1, 2),
        "model.variant: a str setting cannot be tuned as log",
    ),
    "fractional int": (Dimension("augment.num_layers", "int", 1, 2.5), "int bounds must be whole numbers"),
    "owned by the search": (Dimension("loop.train_epochs", "int", 1, 5), "set by the search itself"),
    "bad choice": (Dimension("model.variant", "choice", choices=("tiny", "b9")), "choice 'b9' is refused"),
    "choice text of the wrong type": (
        Dimension("loop.deterministic", "choice", choices=("true", "maybe")),
        "loop.deterministic: choice 'maybe' is refused (override loop.deterministic='maybe': expected a bool",
    ),
    "typed choice of the wrong type": (
        Dimension("optimizer.label_smoothing", "choice", choices=(0.1, True)),
        "optimizer.label_smoothing: choice True is refused (optimizer.label_smoothing=True must be float",
    ),
    "none beside values": (
        Dimension("model.dropout_rate", "choice", choices=("none", "0.2")),
        "model.dropout_rate: 'none' cannot be a choice beside values",
    ),
}


@pytest.mark.parametrize("case", sorted(SPACE_ERRORS))
def test_a_bad_dimension_fails_in_one_line_naming_it(case):
    dimension, message = SPACE_ERRORS[case]
    config = presets.get_preset("b2-rmsprop-128x4096")
    with pytest.raises(ValueError) as error:
        tuning.check_space((dimension,), config)
    assert message in str(error.value)
    assert "\n" not in str(error.value) and str(error.value).startswith(dimension.key)


def test_dimensions_parse_and_the_default_space_fits_every_preset():
    assert Dimension.parse("schedule.lr_per_256=log:0.01:1") == Dimension(
        "schedule.lr_per_256", "log", 0.01, 1.0
    )
    checked = Dimension.parse("model.variant=choice:tiny,b0").checked(presets.get_preset("demo"))
    assert checked.choices == ("tiny", "b0")
    with pytest.raises(ValueError, match="bounds must be numbers"):
        Dimension.parse("schedule.lr_per_256=log:a:b")
    with pytest.raises(ValueError, match="expected KEY=KIND:LOW:HIGH"):
        Dimension.parse("schedule.lr_per_256")
    for name in presets.preset_names():
        config = presets.get_preset(name)
        keys = [d.key for d in tuning.check_space(tuning.default_space(config), config)]
        assert keys[:4] == [
            "schedule.lr_per_256",
            "schedule.warmup_epochs",
            "optimizer.weight_decay",
            "optimizer.label_smoothing",
        ]
        lars, polynomial = config.optimizer.name == "lars", config.schedule.kind == "polynomial"
        assert ("optimizer.lars_eeta" in keys, "schedule.end_lr" in keys) == (lars, polynomial), name


def _search(config=None, **settings) -> tuning.Search:
    config = config or with_overrides(presets.get_preset("smoke"), SMALL)
    return tuning.search_of_config(config, ("train-*",), ("eval-*",), **settings)


def test_the_runners_search_flag_lists_the_registrys_names_without_loading_tensorflow():
    code = (
        "import argparse, sys\n"
        "from pipeline.tune_flags import add_tune_flags\n"
        "parser = argparse.ArgumentParser()\n"
        "add_tune_flags(parser, 'tuning', 9, 'epochs', 4)\n"
        "print(' '.join(parser.format_help().split()))\n"
        "print('tensorflow' in sys.modules)\n"
    )
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True)
    help_text, loaded = out.stdout.strip().rsplit("\n", 1)
    assert tuning.SEARCHES.names() == ("hyperband", "bayesian", "random")
    assert "--tune-search TUNE_SEARCH one of hyperband, bayesian, random" in help_text
    assert loaded == "False"


def test_a_trial_is_handed_the_search_config_with_its_values_and_stop_as_typed_settings():
    search = _search(max_epochs=4)
    values = {
        "schedule.lr_per_256": 1.0,
        "schedule.warmup_epochs": 1.0,
        tuning.SCHEDULE_EPOCHS: 4,
        "tuner/epochs": 2,
        "tuner/initial_epoch": 0,
        "tuner/bracket": 1,
        "tuner/round": 0,
    }
    trial = search.trial_run(values)
    # The search's settings: its schedule, an evaluation every epoch, no target; Hyperband's stop at epoch 2.
    assert trial.config == replace(
        search.config,
        {
            "loop.train_epochs": 4,
            "loop.eval_every_epochs": 1,
            "loop.target_top1": None,
            "loop.stop_at_epoch": 2,
            "schedule.lr_per_256": 1.0,
            "schedule.warmup_epochs": 1.0,  # the search's own schedule: nothing to scale
        },
    )
    assert dict(trial.tuned) == {"schedule.lr_per_256": 1.0, "schedule.warmup_epochs": 1.0}
    # The last round trains to the end of the schedule: no stop.
    assert search.trial_run({**values, "tuner/epochs": 4}).config.loop.stop_at_epoch is None
    # Values the whole config refuses (smoke's end LR above this trial's peak) fail the trial, naming why.
    with pytest.raises(ValueError, match=r"^schedule.end_lr=0.1 exceeds the peak learning rate 0.0625"):
        search.trial_run({"schedule.lr_per_256": 0.5})


def test_the_search_starts_from_the_config_it_is_given_never_a_preset_guessed_from_its_name():
    config = replace(presets.get_preset("demo"), {"name": "custom", "schedule.lr_per_256": 0.123})
    search = _search(config)
    assert search.config == config and search.base_config().schedule.lr_per_256 == 0.123
    assert search.identity()["config"] == search.base_config().to_dict()
    other = _search(replace(config, {"optimizer.weight_decay": 2e-5}))
    assert tuning.search_digest(other) != tuning.search_digest(search)
    assert tuning.search_digest(_search(config)) == tuning.search_digest(search)


def test_the_trial_file_round_trips_and_the_trainer_trains_what_it_holds(tmp_path, capsys):
    trial = _search(max_epochs=3).trial_run({"optimizer.weight_decay": 3e-5, "tuner/epochs": 1})
    path = trial_files.write_run_file(trial, str(tmp_path / "trial_0000"))
    assert ResolvedRun.from_json((tmp_path / "trial_0000" / trial_files.RUN_FILE).read_text()) == trial
    command = trial_files.trainer_command(path, "MODEL", ["T1", "T2"], ["E"], cpu_devices=2)
    assert command[1:] == [
        "-m", "trainer_module", "train", "--config", path, "--model-dir", "MODEL", "--no-export",
        "--train-files", "T1", "--train-files", "T2", "--eval-files", "E", "--cpu-devices", "2",
    ]  # fmt: skip
    args = parse_args(command[3:])
    assert (args.command, args.config, args.preset, args.overrides) == ("train", path, None, [])
    assert args.export is False  # a trial writes no SavedModel
    # The trainer reads the file whole: the config it plans is the trial's.
    assert main(["train", "--config", path, "--plan"]) == 0
    assert json.loads(capsys.readouterr().out)["config"] == trial.config.to_dict()


def test_a_choice_of_true_and_false_reaches_the_trial_as_booleans():
    search = _search(space=["loop.deterministic=choice:true,false", "model.variant=choice:tiny"], only=True)
    assert [d.choices for d in search.space] == [(True, False), ("tiny",)]
    hp = search.hyperparameters()
    assert hp.values["loop.deterministic"] is False and hp.values["model.variant"] == "tiny"
    assert search.trial_run(hp.values).config.loop.deterministic is False


class _CountingTuner(keras_tuner.Tuner):
    """Records the epochs each trial a real oracle schedules would train (from its start to its stop)."""

    def __init__(self, **kwargs):
        self.epochs = []
        super().__init__(**kwargs)

    def run_trial(self, trial, *args, **kwargs):
        values = trial.hyperparameters.values
        self.epochs.append(values["tuner/epochs"] - values["tuner/initial_epoch"])
        return {tuning.OBJECTIVE: random.Random(trial.trial_id).random()}


@pytest.mark.parametrize(
    "max_epochs, factor, iterations", [(2, 2, 1), (9, 3, 1), (10, 3, 1), (20, 3, 1), (4, 2, 2)]
)
def test_the_planned_hyperband_budget_is_what_kerastuner_schedules(tmp_path, max_epochs, factor, iterations):
    hp = keras_tuner.HyperParameters()
    hp.Float("schedule.lr_per_256", 1e-3, 1.0, sampling="log")
    oracle = keras_tuner.oracles.HyperbandOracle(
        keras_tuner.Objective(tuning.OBJECTIVE, "max"),
        max_epochs=max_epochs,
        factor=factor,
        hyperband_iterations=iterations,
        seed=1,
        hyperparameters=hp,
    )
    tuner = _CountingTuner(oracle=oracle, directory=str(tmp_path), project_name="count")
    tuner.oracle.verbose = 0
    with contextlib.redirect_stdout(io.StringIO()):
        tuner.search()
    scheduled = (len(tuner.epochs), sum(tuner.epochs))
    assert tuning.hyperband_budget(max_epochs, factor, iterations) == scheduled
    search = _search(max_epochs=max_epochs, factor=factor, iterations=iterations)
    assert search.planned_trials_and_epochs() == scheduled


def test_a_stop_must_fall_on_an_evaluation_within_the_budget():
    config = presets.get_preset("smoke")
    with pytest.raises(ValueError, match=r"loop.stop_at_epoch=3 is outside \[1, loop.train_epochs=2\]"):
        with_overrides(config, ["loop.train_epochs=2", "loop.stop_at_epoch=3"])
    with pytest.raises(ValueError, match="not a multiple of loop.eval_every_epochs=2"):
        with_overrides(config, ["loop.train_epochs=4", "loop.eval_every_epochs=2", "loop.stop_at_epoch=3"])
    config = with_overrides(config, [*SMALL, "loop.train_epochs=3", "loop.stop_at_epoch=2"])
    assert (config.plan.stop_step, config.plan.total_steps) == (25, 37)


# ---------------------------------------------------------------------------------------------- truncated runs


@pytest.mark.slow
def test_a_truncated_run_resumed_to_the_end_equals_a_straight_run_bit_for_bit(digits, tmp_path):
    config = with_overrides(presets.get_preset("smoke"), [*SMALL, "loop.train_epochs=2"])

    def train_to(model_dir, stop):
        stopped = replace(config, {"loop.stop_at_epoch": stop})
        return run.run(
            ResolvedRun(stopped), [digits["train"]], [digits["eval"]], train.RunPaths(str(model_dir))
        )

    straight = train_to(tmp_path / "straight", None)
    first = train_to(tmp_path / "resumed", 1)
    assert (first.stopped_at_epoch, first.steps, first.export_dir) == (1, 12, "")
    assert not (tmp_path / "resumed" / "export").exists()  # its weights are not the end of their schedule
    with open(tmp_path / "resumed" / "metrics.json") as f:
        assert json.load(f)["stopped_at_epoch"] == 1
    stopped = [
        e for e in read_run_log(str(tmp_path / "resumed" / "run_log.jsonl")) if e["event"] == "stopped"
    ]
    assert [(e["step"], e["epoch"], e["train_epochs"]) for e in stopped] == [(12, 1, 2)]

    resumed = train_to(tmp_path / "resumed", None)
    assert resumed.stopped_at_epoch is None and resumed.export_dir
    assert [(h["step"], h["top1"], h["loss"]) for h in resumed.history] == [
        (h["step"], h["top1"], h["loss"]) for h in straight.history
    ]
    final = [
        tf.train.load_checkpoint(str(tmp_path / d / "checkpoints" / "ckpt-25"))
        for d in ("straight", "resumed")
    ]
    names = sorted(final[0].get_variable_to_shape_map())
    assert sorted(final[1].get_variable_to_shape_map()) == names
    for name in names:
        if not name.startswith(("save_counter", "elapsed", "_CHECKPOINTABLE")):
            np.testing.assert_array_equal(final[1].get_tensor(name), final[0].get_tensor(name), err_msg=name)


# ---------------------------------------------------------------------------------------------- the search


def _tune_command(digits, tune_dir):
    command = [
        sys.executable,
        "-m",
        "trainer_module",
        "tune",
        "--preset",
        "smoke",
        "--tune-dir",
        str(tune_dir),
    ]
    command += ["--train-files", digits["train"], "--eval-files", digits["eval"]]
    command += ["--max-epochs", "2", "--factor", "2"]  # brackets of 2 x 1 epoch -> 1 x 2, and 2 x 2 epochs
    for override in SMALL:
        command += ["--set", override]
    return command


def _running_trial(tune_dir, trial_id) -> list[int]:
    """Live (not zombie) processes training ``trial_id``."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if f"{tune_dir}/trials/trial_{trial_id}/run" in command and state != "Z":
            pids.append(int(pid))
    return pids


@pytest.mark.slow
def test_hyperband_continues_trials_from_their_checkpoints_and_a_killed_search_resumes(
    digits, tmp_path, capsys
):
    tune_dir = tmp_path / "tune"
    trials = tune_dir / "trials"
    # A killed process removes none of its temporary files (TensorFlow's generated autograph sources): the
    # search and its trials keep theirs in a directory of the test's.
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(tmp_path / "tmp")}
    search = subprocess.Popen(_tune_command(digits, tune_dir), env=env, stdout=subprocess.PIPE, text=True)
    # Kill the search (SIGKILL) in the middle of trial 0003, a 2-epoch trial, once its epoch-1 checkpoint is in:
    # recorded in the checkpoint manager's state file (written after the checkpoint's files, by a rename).
    state = trials / "trial_0003" / "run" / "checkpoints" / "checkpoint"

    def checkpointed() -> bool:
        return state.exists() and '"ckpt-12"' in state.read_text()

    deadline = time.time() + 1800  # three trials; minutes each on a loaded machine
    while time.time() < deadline and search.poll() is None and not checkpointed():
        time.sleep(0.2)
    assert search.poll() is None, "the search ended before it could be killed"
    search.send_signal(signal.SIGKILL)
    first_lines = search.communicate()[0].splitlines()
    time.sleep(1)
    assert _running_trial(tune_dir, "0003") == []  # the trial's trainer died with the search
    assert [line.split()[:3] for line in first_lines if line.startswith("trial ")] == [
        ["trial", "0000", "completed"],
        ["trial", "0001", "completed"],
        ["trial", "0002", "completed"],
    ]
    assert (
        "hyperband search (factor 2) of schedules of 2 epochs over 6 settings: about 5 trials"
        in first_lines[1]
    )

    again = subprocess.run(
        _tune_command(digits, tune_dir), env=env, capture_output=True, text=True, timeout=1800
    )
    assert again.returncode == 0, again.stderr[-3000:]
    lines = again.stdout.splitlines()
    # The finished trials are kept; the killed one resumes from its checkpoint, then the search goes on.
    assert [line.split()[1] for line in lines if line.startswith("trial ")] == ["0003", "0004"]
    assert lines[-2].startswith("best top-1 ") and lines[-1] == f"wrote {tune_dir}/best_hyperparameters.json"
    starts = [
        e for e in read_run_log(str(trials / "trial_0003" / "run" / "run_log.jsonl")) if e["event"] == "start"
    ]
    assert [(s["resumed"], s["step"]) for s in starts] == [(False, 0), (True, 12)]

    summary = json.loads((tune_dir / "trials.json").read_text())
    by_id = {t["trial_id"]: t for t in summary["trials"]}
    assert sorted(by_id) == ["0000", "0001", "0002", "0003", "0004"]
    assert {t["status"] for t in by_id.values()} == {"completed"}
    assert [by_id[i]["attempts"] for i in sorted(by_id)] == [
        1,
        1,
        1,
        1,
        1,
    ]  # the killed attempt left no record
    assert all(t["cpu_seconds"] > 0 and t["history"] for t in by_id.values())
    assert [(by_id[i]["initial_epoch"], by_id[i]["epochs"]) for i in sorted(by_id)] == [
        (0, 1),
        (0, 1),
        (1, 2),
        (0, 2),
        (0, 2),
    ]

    # Each trial was handed its resolved run as a file (its values as the search's, Hyperband's stop) and
    # trained just that: the run's config.json reads back as the same run.
    for trial_id, trial in by_id.items():
        trial_dir = trials / f"trial_{trial_id}"
        handed = ResolvedRun.from_json((trial_dir / trial_files.RUN_FILE).read_text())
        assert dict(handed.tuned) == trial["values"]
        assert handed.config.loop.stop_at_epoch == (None if trial["epochs"] == 2 else trial["epochs"])
        assert ResolvedRun.from_json((trial_dir / "run" / "config.json").read_text()) == handed
        command = (trial_dir / "trainer.out").read_text().splitlines()[0]
        assert f"trainer_module train --config {trial_dir / trial_files.RUN_FILE} " in command
        # A trial's result is its evaluations: it writes no SavedModel, even at the end of its schedule.
        assert "--no-export" in command.split() and not (trial_dir / "run" / "export").exists()

    # Trial 0002 continues the better of 0000 and 0001 from a copy of its checkpoint at epoch 1.
    source = by_id["0002"]["continued_from"]
    assert source in ("0000", "0001") and by_id["0002"]["values"] == by_id[source]["values"]
    starts = [
        e for e in read_run_log(str(trials / "trial_0002" / "run" / "run_log.jsonl")) if e["event"] == "start"
    ]
    assert [(s["resumed"], s["step"]) for s in starts] == [
        (False, 0),
        (True, 12),
    ]  # the source's start, then its
    assert by_id["0002"]["history"][0] == by_id[source]["history"][0]
    for name in ("ckpt-12.index", "ckpt-12.data-00000-of-00001"):
        copied = trials / "trial_0002" / "run" / "checkpoints" / name
        assert copied.read_bytes() == (trials / f"trial_{source}" / "run" / "checkpoints" / name).read_bytes()

    best = json.loads((tune_dir / "best_hyperparameters.json").read_text())
    searched_with = {"optimizer.name": "lars", "schedule.kind": "polynomial"}
    assert resolve.searched_with(presets.get_preset("smoke")) == searched_with
    assert best == {
        **by_id[summary["best_trial"]]["values"],
        tuning.SCHEDULE_EPOCHS: 2,
        resolve.SEARCHED_WITH_KEY: searched_with,
    }
    # Training with them: applied before --set, warmup scaled from the search's 2 epochs to the run's 4.
    argv = ["--preset", "smoke", "--plan", "--hyperparameters", str(tune_dir / "best_hyperparameters.json")]
    assert main([*argv, "--set", "loop.train_epochs=4", "--set", "optimizer.label_smoothing=0.05"]) == 0
    planned = json.loads(capsys.readouterr().out)["config"]
    assert planned["schedule"]["lr_per_256"] == best["schedule.lr_per_256"]
    assert planned["schedule"]["warmup_epochs"] == pytest.approx(best["schedule.warmup_epochs"] * 4 / 2)
    assert planned["optimizer"]["label_smoothing"] == 0.05


# ---------------------------------------------------------------------------------------------- the CLI


def _refused(capsys, argv) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.out + captured.err
    return lines[0]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--space", "schedule.nope=log:1:2"], "error: schedule.nope: unknown config field"),
        (
            ["--space", "schedule.lr_per_256=log:1:0.5"],
            "error: schedule.lr_per_256: bounds 1.0:0.5 must satisfy",
        ),
        (
            ["--space", "schedule.lr_per_256=log"],
            "error: --space: schedule.lr_per_256=log: expected KEY=KIND",
        ),
        (
            ["--set", "optimizer.name=rmsprop", "--space", "optimizer.lars_eeta=log:1e-4:1e-2"],
            "error: optimizer.lars_eeta: read only with optimizer.name='lars'",
        ),
        (["--search", "grid"], "error: --search='grid' is not one of 'hyperband', 'bayesian', 'random'"),
        (["--set", "loop.nope=1"], "'loop.nope'"),
    ],
)
def test_tune_refuses_bad_input_in_one_line_and_creates_nothing(digits, tmp_path, capsys, extra, message):
    tune_dir = tmp_path / "tune"
    argv = ["tune", "--preset", "smoke", "--tune-dir", str(tune_dir), "--train-files", digits["train"]]
    argv += ["--eval-files", digits["eval"], *extra]
    assert message in _refused(capsys, argv)
    assert not tune_dir.exists()


def test_tune_refuses_a_directory_holding_another_search_and_training_a_bad_hyperparameters_file(
    digits, tmp_path, capsys
):
    tune_dir = tmp_path / "tune"
    common = ["--preset", "smoke", "--train-files", digits["train"], "--eval-files", digits["eval"]]
    # The search the command would make (the preset resolved against the shards), but for its epochs.
    sizes = resolve.data_sizes([digits["train"]], [digits["eval"]])
    config = resolve.resolve_run(presets.get_preset("smoke"), data=sizes).config
    search = tuning.with_space(tuning.Search(config, (digits["train"],), (digits["eval"],), max_epochs=3))
    tune_dir.mkdir()
    tuning.claim_directory(search, str(tune_dir))
    line = _refused(capsys, ["tune", *common, "--tune-dir", str(tune_dir), "--max-epochs", "2"])
    assert line == (
        f"error: --tune-dir: {tune_dir} holds another search "
        "(its config.loop.train_epochs, max_epochs, space differ); give a new directory"
    )

    model_dir, bad = tmp_path / "run", tmp_path / "best.json"
    train_args = [*common, "--model-dir", str(model_dir), "--hyperparameters"]
    assert "error: --hyperparameters" in _refused(capsys, [*train_args, str(tmp_path / "missing.json")])
    bad.write_text(json.dumps({"schedule.nope": 1}))
    assert "'schedule.nope': unknown config field" in _refused(capsys, [*train_args, str(bad)])
    bad.write_text("[1, 2]")
    assert "must be a JSON object" in _refused(capsys, [*train_args, str(bad)])
    assert not model_dir.exists()


@pytest.mark.parametrize("recorded", [True, False])
def test_a_searchs_values_are_refused_on_a_run_of_another_optimizer_as_its_space_is(
    tmp_path, capsys, recorded
):
    """A LARS search's peak LR and warmup are no RMSProp values: applied to an RMSProp preset they are refused
    in one line, as ``--space`` refuses a LARS dimension there (a file written before searches recorded what
    they searched with is refused by the LARS-only setting it holds); a LARS preset takes them."""
    values = {
        "schedule.lr_per_256": 0.8,
        "schedule.warmup_epochs": 2.7,
        "optimizer.weight_decay": 1e-4,
        "optimizer.lars_eeta": 0.002,
        tuning.SCHEDULE_EPOCHS: 30,
    }
    if recorded:
        values[resolve.SEARCHED_WITH_KEY] = {"optimizer.name": "lars", "schedule.kind": "polynomial"}
    path = tmp_path / "best_hyperparameters.json"
    path.write_text(json.dumps(values))
    line = _refused(capsys, ["--preset", "b0-rmsprop-8x2048", "--plan", "--hyperparameters", str(path)])
    expected = (
        "found by a search with optimizer.name='lars', and this run has 'rmsprop'"
        if recorded
        else "found by a search of another optimizer or schedule: optimizer.lars_eeta: read only with "
        "optimizer.name='lars', and this config has 'rmsprop'"
    )
    assert line.startswith(f"error: --hyperparameters {path}: {expected}"), line
    assert main(["--preset", "b5-lars-1024x65536", "--plan", "--hyperparameters", str(path)]) == 0
    planned = json.loads(capsys.readouterr().out)["config"]
    assert planned["optimizer"]["lars_eeta"] == 0.002 and planned["schedule"]["lr_per_256"] == 0.8
