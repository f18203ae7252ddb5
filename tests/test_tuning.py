"""Hyperparameter tuning through the trainer's own loop: the space and its checks, truncated runs that resume
bit for bit, Hyperband continuing trials from their checkpoints, a search killed and resumed, the CLI's
refusals, and TFX's Tuner and Trainer executors running ``tuner_fn`` and ``run_fn``."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from beam_preprocess import sample_data
from beam_preprocess.config import ShardingConfig
from beam_preprocess.run import run as shard
from trainer_module import presets, run, train, tuning
from trainer_module.__main__ import main
from trainer_module.config import with_overrides
from trainer_module.recorder import read_run_log
from trainer_module.resolve import ResolvedRun
from trainer_module.tuning import Dimension

# 400 training digits at batch 32 (12.5 steps an epoch), 16 px, deterministic ops: a trial is mostly start-up.
SMALL = (
    "data.num_train_examples=400",
    "data.global_batch_size=32",
    "model.image_size=16",
    "loop.deterministic=true",
)


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """500 real digits (400 train / 100 validation) sharded in TFX's Examples layout (``Split-<name>/``)."""
    root = tmp_path_factory.mktemp("tuning_digits")
    archives = sample_data.write_archives(
        str(root / "archives"), sample_data.digit_samples(size=16)[:500], 0.2
    )
    uri = str(root / "examples")
    shard(
        ShardingConfig(
            output_dir=uri,
            train_archive=archives.train_archive,
            val_archive=archives.val_archive,
            num_hosts=1,
            train_shards=2,
            val_shards=1,
            split_dir_template="Split-{split}",
        )
    )
    return {"uri": uri, "train": f"{uri}/Split-train/*", "eval": f"{uri}/Split-validation/*"}


# ---------------------------------------------------------------------------------------------- the space


SPACE_ERRORS = {
    "not a setting": (Dimension("foo.bar", "log", 1, 2), "foo.bar: not a config setting"),
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
    "bad choice": (Dimension("model.variant", "choice", choices=("tiny", "b9")), "bound 'b9' is refused"),
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


def test_tuned_values_become_overrides_with_epochs_scaled_to_the_budget():
    values = {
        "schedule.lr_per_256": 0.5,
        "schedule.warmup_epochs": 1.0,
        "schedule.decay_epochs": 0.5,
        tuning.SCHEDULE_EPOCHS: 5,
        "tuner/epochs": 3,
    }
    overrides, tuned = tuning.hyperparameter_overrides(values, train_epochs=20)
    assert tuned == {"schedule.lr_per_256": 0.5, "schedule.warmup_epochs": 4.0, "schedule.decay_epochs": 2.0}
    assert overrides == ["schedule.lr_per_256=0.5", "schedule.warmup_epochs=4.0", "schedule.decay_epochs=2.0"]
    # TFX's Tuner writes a KerasTuner HyperParameters config: its values are read the same way.
    assert (
        tuning.hyperparameter_overrides({"space": [], "values": values}, 5)[1]["schedule.warmup_epochs"]
        == 1.0
    )


def test_a_stop_must_fall_on_an_evaluation_within_the_budget():
    config = presets.get_preset("smoke")
    with pytest.raises(ValueError, match=r"loop.stop_at_epoch=3 is outside \[1, loop.train_epochs=2\]"):
        with_overrides(config, ["loop.train_epochs=2", "loop.stop_at_epoch=3"])
    with pytest.raises(ValueError, match="not a multiple of loop.eval_every_epochs=2"):
        with_overrides(config, ["loop.train_epochs=4", "loop.eval_every_epochs=2", "loop.stop_at_epoch=3"])
    config = with_overrides(config, [*SMALL, "loop.train_epochs=3", "loop.stop_at_epoch=2"])
    assert (config.plan.stop_step, config.plan.total_steps) == (25, 37)


# ---------------------------------------------------------------------------------------------- truncated runs


def test_a_truncated_run_resumed_to_the_end_equals_a_straight_run_bit_for_bit(digits, tmp_path):
    config = with_overrides(presets.get_preset("smoke"), [*SMALL, "loop.train_epochs=2"])

    def train_to(model_dir, stop):
        stopped = with_overrides(config, [f"loop.stop_at_epoch={stop}"])
        return run.run(
            ResolvedRun(stopped), [digits["train"]], [digits["eval"]], train.RunPaths(str(model_dir))
        )

    straight = train_to(tmp_path / "straight", "none")
    first = train_to(tmp_path / "resumed", 1)
    assert (first.stopped_at_epoch, first.steps, first.export_dir) == (1, 12, "")
    assert not (tmp_path / "resumed" / "export").exists()  # its weights are not the end of their schedule
    with open(tmp_path / "resumed" / "metrics.json") as f:
        assert json.load(f)["stopped_at_epoch"] == 1
    stopped = [
        e for e in read_run_log(str(tmp_path / "resumed" / "run_log.jsonl")) if e["event"] == "stopped"
    ]
    assert [(e["step"], e["epoch"], e["train_epochs"]) for e in stopped] == [(12, 1, 2)]

    resumed = train_to(tmp_path / "resumed", "none")
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


def test_hyperband_continues_trials_from_their_checkpoints_and_a_killed_search_resumes(
    digits, tmp_path, capsys
):
    tune_dir = tmp_path / "tune"
    trials = tune_dir / "trials"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    search = subprocess.Popen(_tune_command(digits, tune_dir), env=env, stdout=subprocess.PIPE, text=True)
    # Kill the search (SIGKILL) in the middle of trial 0003, a 2-epoch trial, once its epoch-1 checkpoint is in.
    checkpoint = trials / "trial_0003" / "run" / "checkpoints" / "ckpt-12.index"
    deadline = time.time() + 600
    while time.time() < deadline and search.poll() is None and not checkpoint.exists():
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
        _tune_command(digits, tune_dir), env=env, capture_output=True, text=True, timeout=900
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
    assert best == {**by_id[summary["best_trial"]]["values"], tuning.SCHEDULE_EPOCHS: 2}
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
    search = tuning.with_space(
        tuning.Search("smoke", (digits["train"],), (digits["eval"],), overrides=SMALL, max_epochs=3)
    )
    tune_dir.mkdir()
    tuning.claim_directory(search, str(tune_dir))
    line = _refused(capsys, ["tune", *common, "--tune-dir", str(tune_dir), "--max-epochs", "2"])
    assert line.startswith(f"error: --tune-dir: {tune_dir} holds another search (its max_epochs, overrides")

    model_dir, bad = tmp_path / "run", tmp_path / "best.json"
    train_args = [*common, "--model-dir", str(model_dir), "--hyperparameters"]
    assert "error: --hyperparameters" in _refused(capsys, [*train_args, str(tmp_path / "missing.json")])
    bad.write_text(json.dumps({"schedule.nope": 1}))
    assert "'schedule.nope': unknown config field" in _refused(capsys, [*train_args, str(bad)])
    bad.write_text("[1, 2]")
    assert "must be a JSON object" in _refused(capsys, [*train_args, str(bad)])
    assert not model_dir.exists()


# ---------------------------------------------------------------------------------------------- TFX


def test_tfx_tuner_and_trainer_executors_run_tuner_fn_and_run_fn(digits, tmp_path):
    from tfx.components.trainer import executor as trainer_executor
    from tfx.components.tuner import executor as tuner_executor
    from tfx.dsl.components.base import base_executor
    from tfx.proto import trainer_pb2
    from tfx.types import standard_artifacts
    from tfx.utils import proto_utils

    from components.imagenet_shards import describe_artifact
    from effnet_common.manifest import Manifest

    examples = standard_artifacts.Examples()
    examples.uri = digits["uri"]
    with open(os.path.join(digits["uri"], "manifest.json")) as f:
        describe_artifact(examples, Manifest.from_json(f.read(), digits["uri"]))

    def artifact(kind, name):
        made = kind()
        made.uri = str(tmp_path / name)
        os.makedirs(made.uri)
        return [made]

    config = with_overrides(presets.get_preset("smoke"), [*SMALL, "loop.train_epochs=1"])
    tuning_settings = {
        "search": "random",
        "max_trials": 2,
        "space": ["schedule.lr_per_256=log:1:16"],
        "only": True,
    }
    properties = {
        "train_args": proto_utils.proto_to_json(trainer_pb2.TrainArgs(splits=["train"])),
        "eval_args": proto_utils.proto_to_json(trainer_pb2.EvalArgs(splits=["validation"])),
        "custom_config": json.dumps({"trainer_config": config.to_json(), "tuning": tuning_settings}),
    }
    best_hp = artifact(standard_artifacts.HyperParameters, "best_hyperparameters")
    context = base_executor.BaseExecutor.Context(tmp_dir=str(tmp_path / "tmp"), unique_id="1")
    tuner_executor.Executor(context).Do(
        {"examples": [examples]},
        {
            "best_hyperparameters": best_hp,
            "tuner_results": artifact(standard_artifacts.TunerResults, "results"),
        },
        {**properties, "tuner_fn": "trainer_module.tfx_trainer.tuner_fn"},
    )
    results = json.loads((tmp_path / "results" / "tuner_results.json").read_text())
    assert len(results) == 2 and all(0.0 <= r["score"] <= 1.0 for r in results)
    written = json.loads((tmp_path / "best_hyperparameters" / "best_hyperparameters.txt").read_text())
    best_lr = written["values"]["schedule.lr_per_256"]
    assert 1 <= best_lr <= 16 and written["values"][tuning.SCHEDULE_EPOCHS] == 1

    model_run = artifact(standard_artifacts.ModelRun, "model_run")
    trainer_executor.GenericExecutor(context).Do(
        {"examples": [examples], "hyperparameters": best_hp},
        {"model": artifact(standard_artifacts.Model, "model"), "model_run": model_run},
        {**properties, "run_fn": "trainer_module.tfx_trainer.run_fn"},
    )
    saved = json.loads((tmp_path / "model_run" / "config.json").read_text())
    assert saved["tuned"] == {"schedule.lr_per_256": best_lr}
    assert saved["config"]["schedule"]["lr_per_256"] == best_lr
    page = (tmp_path / "model_run" / "report.html").read_text()
    assert "Settings from hyperparameter tuning" in page and "schedule.lr_per_256" in page
    assert (tmp_path / "model" / "Format-Serving" / "saved_model.pb").exists()
