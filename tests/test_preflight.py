"""Preflight: each command checks its inputs, its output location and its overrides before doing any work,
and a problem is one ``error:`` line naming the flag (exit status 2), never a traceback; nothing is created.

The commands run as real subprocesses, as a person runs them.
"""

import json
import os
import subprocess
import sys

import pytest
import suite_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(module, *args):
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=900,
        env=suite_env.child(),
    )


def _one_error_line(result) -> str:
    """The single non-empty stderr line of a refused run (and no traceback anywhere)."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stdout + result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture
def workspace(tmp_path):
    """A regular file to put output paths under, the output path each command would create, and two
    small files standing in for shards."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    for name in ("train-00000-of-00001", "validation-00000-of-00001"):
        (tmp_path / name).write_bytes(b"\0" * 16)
    return tmp_path, blocker, tmp_path / "out"


def _local_runner_case(case, tmp_path, blocker, out, archives):
    inputs = ["--train-archive", archives.train_archive, "--val-archive", archives.val_archive]
    return {
        "missing input": (
            ["--pipeline-root", out, "--train-archive", tmp_path / "missing.tar"],
            f"error: --train-archive {tmp_path / 'missing.tar'}: no such file",
        ),
        "unwritable output": (
            ["--pipeline-root", blocker / "root", *inputs],
            f"error: --pipeline-root {blocker / 'root'}: cannot write here (Not a directory)",
        ),
        "bad override": (["--pipeline-root", out, "--set", "loop.nope=1", *inputs], "'loop.nope'"),
    }[case]


def _beam_case(case, tmp_path, blocker, out, archives):
    return {
        "missing input": (
            ["--train-archive", tmp_path / "missing.tar", "--output-dir", out],
            f"error: --train-archive {tmp_path / 'missing.tar'}: no such file",
        ),
        "unwritable output": (
            ["--train-archive", archives.train_archive, "--output-dir", blocker / "shards"],
            f"error: --output-dir {blocker / 'shards'}: cannot write here (Not a directory)",
        ),
        "bad override": (
            ["--train-archive", archives.train_archive, "--output-dir", out, "--shard-mb", "0"],
            "error: --shard-mb must be positive, got 0.0",
        ),
    }[case]


def _trainer_case(case, tmp_path, blocker, out, archives):
    files = ["--train-files", tmp_path / "train-*", "--eval-files", tmp_path / "validation-*"]
    return {
        "missing input": (
            [
                "--model-dir",
                out,
                "--train-files",
                tmp_path / "none-*",
                "--eval-files",
                tmp_path / "validation-*",
            ],
            f"error: --train-files {tmp_path / 'none-*'}: matches no file",
        ),
        "unwritable output": (
            ["--model-dir", blocker / "model", *files],
            f"error: --model-dir {blocker / 'model'}: cannot create it",
        ),
        "bad override": (["--model-dir", out, *files, "--set", "loop.nope=1"], "'loop.nope'"),
    }[case]


COMMANDS = {
    "pipeline.local_runner": (["--preset", "smoke"], _local_runner_case),
    "beam_preprocess": ([], _beam_case),
    "trainer_module": (["--preset", "smoke"], _trainer_case),
}


# pipeline.local_runner and trainer_module import TensorFlow: a refused run costs about 7 s of CPU (beam_preprocess 1.5).
TENSORFLOW_COMMANDS = ("pipeline.local_runner", "trainer_module")


@pytest.mark.parametrize("case", ["missing input", "unwritable output", "bad override"])
@pytest.mark.parametrize(
    "module", [pytest.param(m, marks=pytest.mark.slow) if m in TENSORFLOW_COMMANDS else m for m in COMMANDS]
)
def test_a_bad_flag_is_one_line_exit_2_and_creates_nothing(module, case, workspace, clean_archives):
    tmp_path, blocker, out = workspace
    before = sorted(os.listdir(tmp_path))
    common, build_case = COMMANDS[module]
    args, expected = build_case(case, tmp_path, blocker, out, clean_archives)
    result = _run(module, *common, *args)
    assert result.returncode == 2, result.stderr[-3000:]
    line = _one_error_line(result)
    assert line.startswith(expected) if expected.startswith("error: ") else expected in line, line
    assert not result.stdout.strip()
    assert sorted(os.listdir(tmp_path)) == before  # no output directory, no log file beside it


def _refusal_case(case, tmp_path, archives):
    """(module, arguments, the error line's start) of refusals each command makes before any work."""
    train, val = ["--train-archive", archives.train_archive], ["--val-archive", archives.val_archive]
    shard = ["--output-dir", tmp_path / "shards", *train, *val]
    return {
        # The pipeline trains on one split and gates on the other: one alone would shard, then fail to train.
        "pipeline, training archive only": (
            "pipeline.local_runner",
            ["--pipeline-root", tmp_path / "root", *train],
            "error: no validation input: the pipeline trains on the training split and gates on the validation "
            "split; give --val-archive or --val-dir",
        ),
        "pipeline, validation archive only": (
            "pipeline.local_runner",
            ["--pipeline-root", tmp_path / "root", *val],
            "error: no training input: ",
        ),
        "pipeline, misspelt option": (
            "pipeline.local_runner",
            ["--pipeline-root", tmp_path / "root", "--beam_workers", "1"],
            "error: unrecognized arguments: --beam_workers 1 (did you mean --beam-workers?); see python -m "
            "pipeline.local_runner --help",
        ),
        # Beam's parser drops what it does not know: each would have sharded, ignoring the option.
        "sharding, --num_hosts": (
            "beam_preprocess",
            [*shard, "--num_hosts", "4"],
            "error: unrecognized arguments: --num_hosts 4 (did you mean --num-hosts?)",
        ),
        "sharding, --shards-mb": (
            "beam_preprocess",
            [*shard, "--shards-mb", "1"],
            "error: unrecognized arguments: --shards-mb 1 (did you mean --shard-mb?)",
        ),
        "sharding, --overwirte": (
            "beam_preprocess",
            [*shard, "--overwirte"],
            "error: unrecognized arguments: --overwirte (did you mean --overwrite?)",
        ),
        # The option belongs to the train subcommand (the bare form): the top parser reports it.
        "trainer, --modle-dir": (
            "trainer_module",
            ["--preset", "demo", "--modle-dir", tmp_path / "run"],
            "error: unrecognized arguments: --modle-dir "
            f"{tmp_path / 'run'} (did you mean --model-dir?); see python -m trainer_module --help",
        ),
        "sample data, unwritable": (
            "beam_preprocess.sample_data",
            ["--out", "/proc/x"],
            "error: --out /proc/x: cannot write here",
        ),
        "sample data, --num-images with the digits": (
            "beam_preprocess.sample_data",
            ["--out", tmp_path / "data", "--num-images", "50"],
            "error: --num-images 50: goes with --kind photos: the digits are always scikit-learn's 1,797 in 10 "
            "synsets",
        ),
    }[case]


REFUSALS = (
    "pipeline, training archive only",
    "pipeline, validation archive only",
    "pipeline, misspelt option",
    "sharding, --num_hosts",
    "sharding, --shards-mb",
    "sharding, --overwirte",
    "trainer, --modle-dir",
    "sample data, unwritable",
    "sample data, --num-images with the digits",
)


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.slow) if c.startswith("pipeline") else c for c in REFUSALS]
)
def test_every_command_refuses_before_any_work_in_one_line(case, tmp_path, clean_archives):
    module, args, expected = _refusal_case(case, tmp_path, clean_archives)
    before = sorted(os.listdir(tmp_path))
    result = _run(module, *args)
    assert result.returncode == 2, result.stderr[-3000:]
    assert _one_error_line(result).startswith(expected)
    assert not result.stdout.strip() and sorted(os.listdir(tmp_path)) == before


# ---- a refusal is answered before the heavy libraries load --------------------------------------------------

# What a refused name or flag must not wait for: each of these costs seconds to import (TensorFlow alone about
# 10 on 2 busy cores), and a refusal needs only the interpreter, the console and the config (about 0.3 s).
HEAVY = ("tensorflow", "keras", "keras_tuner", "tfx", "apache_beam", "kfp")

# Calls the command's main in a fresh interpreter and prints its exit status, then the heavy modules loaded
# (and Google Cloud's clients: ``google.cloud`` itself is a namespace a .pth file creates at start-up).
_REFUSE_AND_LIST_IMPORTS = """
import sys
from {module} import main
try:
    status = main({argv!r})
except SystemExit as stop:
    status = stop.code
print(status)
print(sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r} or m.startswith("google.cloud.")))
"""

_DIGEST = "@sha256:" + "0123456789abcdef" * 4


def _quick_refusal_case(case, tmp_path):
    """(module with ``main``, arguments, the error line's start) of refusals made before any heavy import."""
    shards = ["--train-files", tmp_path / "train-*", "--eval-files", tmp_path / "validation-*"]
    cloud = [
        "--project", "p", "--image", "us-docker.pkg.dev/p/effnet/pipeline" + _DIGEST,
        "--trainer-image", "us-docker.pkg.dev/p/effnet/trainer-tpu" + _DIGEST, "--pipeline-root", "gs://b/p",
        "--train-archive", "gs://b/train.tar", "--val-archive", "gs://b/val.tar",
        "--output", tmp_path / "effnet.json",
    ]  # fmt: skip
    local = ["--pipeline-root", tmp_path / "root"]
    trainer, runner, local_runner = (
        "trainer_module.__main__",
        "pipeline.kubeflow_v2_runner",
        "pipeline.local_runner",
    )
    return {
        "trainer, unknown preset": (
            trainer,
            ["--preset", "nope"],
            "error: --preset nope: unknown preset 'nope'",
        ),
        "trainer, unknown preset with shards": (
            trainer,
            ["--preset", "nope", *shards, "--model-dir", tmp_path / "run"],
            "error: --preset nope: unknown preset 'nope'",
        ),
        "trainer, --plan of an unknown preset": (
            trainer,
            ["--plan", "--preset", "nope"],
            "error: --preset nope: unknown preset 'nope'",
        ),
        "trainer, --modle-dir": (
            trainer,
            ["--preset", "demo", "--modle-dir", tmp_path / "run"],
            f"error: unrecognized arguments: --modle-dir {tmp_path / 'run'} (did you mean --model-dir?)",
        ),
        "trainer, unknown setting with shards": (
            trainer,
            ["--preset", "smoke", "--set", "loop.nope=1", *shards, "--model-dir", tmp_path / "run"],
            "error: override 'loop.nope': unknown config field",
        ),
        "trainer, setting of the wrong type": (
            trainer,
            ["--preset", "smoke", "--set", "loop.train_epochs=x"],
            "error: override loop.train_epochs='x': expected int",
        ),
        "trainer, no shards": (
            trainer,
            ["--preset", "smoke"],
            "error: a training run needs --train-files, --eval-files, --model-dir",
        ),
        "trainer, tune with an unknown preset": (
            trainer,
            ["tune", "--preset", "nope", *shards, "--tune-dir", tmp_path / "tune"],
            "error: --preset nope: unknown preset 'nope'",
        ),
        "trainer, tune with an unknown search": (
            trainer,
            ["tune", "--preset", "smoke", "--search", "grid", *shards, "--tune-dir", tmp_path / "tune"],
            "error: --search='grid' is not one of 'hyperband', 'bayesian', 'random'",
        ),
        "cloud, unknown preset": (
            runner,
            [*cloud, "--preset", "nope"],
            "error: unknown pipeline preset 'nope'",
        ),
        "cloud, --prset": (
            runner,
            [*cloud, "--prset", "demo"],
            "error: unrecognized arguments: --prset demo (did you mean --preset?)",
        ),
        "cloud, unknown accelerator": (
            runner,
            [*cloud, "--accelerator", "tpu-v9-8"],
            "error: --accelerator='tpu-v9-8' is not one of",
        ),
        "cloud, a TPU size that does not exist": (
            runner,
            [*cloud, "--accelerator", "tpu-v3-48"],
            "error: --accelerator tpu-v3-48: TPU v3 comes as tpu-v3-8 on Vertex AI (one host) or slices of",
        ),
        "cloud, preset too large for the accelerator": (
            runner,
            [*cloud, "--preset", "b5-lars-1024x65536"],
            "error: preset b5-lars-1024x65536 needs 1024 replicas; tpu-v3-8 has 8",
        ),
        "cloud, unknown setting": (
            runner,
            [*cloud, "--set", "loop.nope=1"],
            "error: override 'loop.nope': unknown config field",
        ),
        "cloud, unknown parameter": (
            runner,
            [*cloud, "--param", "epochs=3"],
            "error: --param epochs: not a runtime parameter",
        ),
        "cloud, output of no format": (
            runner,
            [*cloud, "--output", tmp_path / "effnet.txt"],
            f"error: --output '{tmp_path / 'effnet.txt'}' must end in .json (Vertex PipelineJob) or .yaml (KFP)",
        ),
        "cloud, nothing to do": (
            runner,
            [],
            "error: give --output FILE to compile, or --template FILE --submit to submit a compiled one",
        ),
        "cloud, --plan of an unknown preset": (
            runner,
            ["--plan", "--preset", "nope"],
            "error: unknown pipeline preset 'nope'",
        ),
        "cloud, unknown search": (
            runner,
            [*cloud, "--tune", "--tune-search", "grid"],
            "error: --search='grid' is not one of 'hyperband', 'bayesian', 'random'",
        ),
        "cloud, no parallel trials": (
            runner,
            [*cloud, "--tune", "--tune-parallel-trials", "0"],
            "error: --tune-parallel-trials 0 must be at least 1",
        ),
        "cloud, a TensorBoard in another region": (
            runner,
            [
                *cloud,
                "--service-account",
                "sa@p.iam.gserviceaccount.com",
                "--tensorboard",
                "projects/p/locations/europe-west4/tensorboards/1",
            ],
            "error: --tensorboard projects/p/locations/europe-west4/tensorboards/1 is in europe-west4: Vertex AI takes "
            "a training job's logs only into a TensorBoard of the job's region (--region us-central1)",
        ),
        "cloud, a TensorBoard without a service account": (
            runner,
            [*cloud, "--tensorboard", "projects/p/locations/us-central1/tensorboards/1"],
            "error: --tensorboard needs --service-account",
        ),
        "cloud, an experiment's name Vertex refuses": (
            runner,
            [*cloud, "--submit", "--experiment", "EffNet B0"],
            "error: --experiment 'EffNet B0': a Vertex AI experiment's name is 4 to 128 lowercase letters",
        ),
        "cloud, an experiment without --submit": (
            runner,
            [*cloud, "--experiment", "effnet-b0"],
            "error: --experiment puts a submitted run into a Vertex AI experiment: add --submit",
        ),
        "local, unknown preset": (
            local_runner,
            [*local, "--preset", "nope"],
            "error: argument --preset: invalid choice: 'nope'",
        ),
        "local, --beam_workers": (
            local_runner,
            [*local, "--beam_workers", "1"],
            "error: unrecognized arguments: --beam_workers 1 (did you mean --beam-workers?)",
        ),
        "local, unknown setting": (
            local_runner,
            [*local, "--set", "loop.nope=1"],
            "error: override 'loop.nope': unknown config field",
        ),
        "local, no Beam workers": (
            local_runner,
            [*local, "--beam-workers", "0"],
            "error: --beam-workers 0: must be",
        ),
        "local, unknown search": (
            local_runner,
            [*local, "--tune", "--tune-search", "grid"],
            "error: --tune: --search='grid' is not one of 'hyperband', 'bayesian', 'random'",
        ),
    }[case]


QUICK_REFUSALS = (
    "trainer, unknown preset",
    "trainer, unknown preset with shards",
    "trainer, --plan of an unknown preset",
    "trainer, --modle-dir",
    "trainer, unknown setting with shards",
    "trainer, setting of the wrong type",
    "trainer, no shards",
    "trainer, tune with an unknown preset",
    "trainer, tune with an unknown search",
    "cloud, unknown preset",
    "cloud, --prset",
    "cloud, unknown accelerator",
    "cloud, a TPU size that does not exist",
    "cloud, preset too large for the accelerator",
    "cloud, unknown setting",
    "cloud, unknown parameter",
    "cloud, output of no format",
    "cloud, nothing to do",
    "cloud, --plan of an unknown preset",
    "cloud, unknown search",
    "cloud, no parallel trials",
    "cloud, a TensorBoard in another region",
    "cloud, a TensorBoard without a service account",
    "cloud, an experiment's name Vertex refuses",
    "cloud, an experiment without --submit",
    "local, unknown preset",
    "local, --beam_workers",
    "local, unknown setting",
    "local, no Beam workers",
    "local, unknown search",
)


@pytest.mark.parametrize("case", QUICK_REFUSALS)
def test_a_misspelt_name_or_flag_is_refused_before_tensorflow_beam_tfx_or_kfp_load(case, workspace):
    """A refusal within a second: the trainer and both runners check their flags, presets and settings before
    importing what runs them (they once imported TensorFlow first: 10-20 s for a misspelt preset)."""
    tmp_path = workspace[0]
    module, argv, expected = _quick_refusal_case(case, tmp_path)
    before = sorted(os.listdir(tmp_path))
    code = _REFUSE_AND_LIST_IMPORTS.format(module=module, argv=[str(a) for a in argv], heavy=HEAVY)
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env=suite_env.child(),
    )
    status, loaded = result.stdout.strip().splitlines()[-2:]
    assert (status, loaded) == ("2", "[]"), result.stderr[-3000:]
    assert _one_error_line(result).startswith(expected)
    assert sorted(os.listdir(tmp_path)) == before


def test_sharding_over_its_failure_budget_is_one_line(quirky_archives, tmp_path):
    out = tmp_path / "shards"
    result = _run("beam_preprocess", "--train-archive", quirky_archives.train_archive, "--output-dir", out)
    assert result.returncode == 2  # unusable inputs are bad input, as in every command
    line = _one_error_line(result)
    assert "inputs could not be used (more than --max-failures=0)" in line
    # The first inputs that failed are named on that line, with their reasons; all are in the failed manifest.
    with open(out / "manifest.failed.json") as f:
        failures = json.load(f)["failures"]
    for failure in failures[:3]:
        assert f"{failure['source']}: {failure['reason']}" in line
    assert f"and {len(failures) - 3} more; all are listed in {out / 'manifest.failed.json'}" in line
    assert "n99999999.tar" in (tmp_path / "shards.beam_preprocess.log").read_text()
    # No output a later step could take for a finished run: no manifest.json and no shards.
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == ["manifest.failed.json"]
    # The next run over the same directory is told to --overwrite, and then runs.
    again = _run("beam_preprocess", "--train-archive", quirky_archives.train_archive, "--output-dir", out)
    assert again.returncode == 2 and "manifest.failed.json" in _one_error_line(again)


@pytest.mark.slow
def test_pipeline_step_failing_on_bad_inputs_is_one_line_not_a_traceback(quirky_archives, tmp_path):
    root = tmp_path / "root"
    args = ["--pipeline-root", root, "--preset", "smoke"]
    args += ["--train-archive", quirky_archives.train_archive, "--val-archive", quirky_archives.val_archive]
    result = _run("pipeline.local_runner", *args)
    assert result.returncode == 2
    line = _one_error_line(result)
    assert "inputs could not be used (more than --max-failures=0)" in line
    assert "] ImageNetShardGen: running" in result.stdout and "] ImageNetShardGen: FAILED" in result.stdout
    assert "Traceback" in next((root / "logs").iterdir()).read_text()  # the details are in the log file


def test_every_option_of_every_command_says_what_it_does():
    """--help documents every option (the README lists those a person needs)."""
    import argparse

    from beam_preprocess import __main__ as beam_cli
    from beam_preprocess import sample_data
    from pipeline import kubeflow_v2_runner, local_runner
    from trainer_module import __main__ as trainer_cli

    def undocumented(name, parser):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for command, sub in action.choices.items():
                    yield from undocumented(f"{name} {command}", sub)
            elif action.option_strings and not action.help:
                yield f"{name} {action.option_strings[0]}"

    parsers = {
        "beam_preprocess": beam_cli.build_parser(),
        "sample_data": sample_data.build_parser(),
        "local_runner": local_runner.build_parser(),
        "kubeflow_v2_runner": kubeflow_v2_runner.build_parser(),
        "trainer_module": trainer_cli.build_parser(),
    }
    assert [option for name, parser in parsers.items() for option in undocumented(name, parser)] == []
    # The runners list the presets they take (named without loading TensorFlow: the pipeline's are the trainer's).
    from pipeline import presets
    from trainer_module.presets import preset_names

    assert sorted(preset_names()) == sorted(presets.PIPELINE_PRESETS)
    for runner in ("local_runner", "kubeflow_v2_runner"):
        (preset,) = [a for a in parsers[runner]._actions if "--preset" in a.option_strings]
        assert all(name in preset.help for name in presets.PIPELINE_PRESETS), runner
