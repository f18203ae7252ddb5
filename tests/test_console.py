"""What a person sees: a short account on the console, the libraries' logs in a file (or live with --verbose).

The commands run as real subprocesses, the way a person runs them, so that output written below Python
logging (TensorFlow's C++ messages, descriptor 2) counts too. The whole pipeline's console (its line budget,
its step lines, CACHED, --verbose) is checked on the demo runs of test_pipeline.py.
"""

import os
import re
import subprocess
import sys

import pytest
import suite_env

from effnet_common import console

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SESSION = """
import logging, os, shutil, sys, warnings
from effnet_common import console

log, mode = sys.argv[1], sys.argv[2]
upload = (lambda local, path: shutil.copy(local, sys.argv[3])) if mode == "remote" else None
with console.session(verbose=mode == "verbose") as session:
    if mode != "preflight-failed":
        session.keep_log(log, upload)
    console.say("a line for the person")
    logging.getLogger("apache_beam.runners").info("a library record")
    os.write(2, b"written to descriptor 2\\n")
    warnings.warn("a library warning")
    if mode == "preflight-failed":
        sys.exit(console.fail(console.UsageError("--input", "/missing", "no such file")))
    if mode == "crash":
        raise RuntimeError("an error nobody foresaw")
print("after the session", file=sys.stderr)
os.write(2, b"descriptor 2 while the process shuts down\\n")
"""


def _python(*args, env=None, **kwargs):
    return subprocess.run(
        [sys.executable, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=900,
        env=suite_env.child(env),
        **kwargs,
    )


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.fixture
def private_tmp(tmp_path):
    """A TMPDIR of the subprocess's own, to see that the session leaves no temporary file behind."""
    path = tmp_path / "tmp"
    path.mkdir()
    return {"TMPDIR": str(path)}, path


def test_session_sends_library_records_and_descriptor_2_to_the_log_file(tmp_path, private_tmp):
    env, tmp = private_tmp
    log = tmp_path / "logs" / "run.log"
    result = _python("-c", SESSION, log, "file", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"full log: {log}\na line for the person\n"
    assert result.stderr == "after the session\n"
    text = log.read_text()
    assert "descriptor 2 while the process shuts down" in text
    for expected in (
        "a line for the person",
        "apache_beam.runners: a library record",
        "written to descriptor 2",
    ):
        assert expected in text
    assert "a library warning" in text
    assert not os.listdir(tmp)


def test_verbose_session_shows_the_library_records_live_and_writes_no_file(tmp_path, private_tmp):
    env, tmp = private_tmp
    log = tmp_path / "run.log"
    result = _python("-c", SESSION, log, "verbose", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "a line for the person\n"  # the account once, not again among the records
    assert "apache_beam.runners: a library record" in result.stderr
    assert "written to descriptor 2" in result.stderr and "a library warning" in result.stderr
    assert not log.exists() and not os.listdir(tmp)


def test_remote_log_is_uploaded_when_the_session_ends(tmp_path, private_tmp):
    env, tmp = private_tmp
    uploaded = tmp_path / "uploaded.log"
    result = _python("-c", SESSION, "mem://bucket/run.log", "remote", uploaded, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "full log: mem://bucket/run.log\na line for the person\n"
    assert "a library record" in uploaded.read_text() and "written to descriptor 2" in uploaded.read_text()
    assert not os.listdir(tmp)


def test_session_ended_by_a_preflight_error_prints_one_line_and_leaves_nothing(tmp_path, private_tmp):
    env, tmp = private_tmp
    result = _python("-c", SESSION, tmp_path / "run.log", "preflight-failed", env=env)
    assert result.returncode == 2
    assert result.stderr == "error: --input /missing: no such file\n"
    assert result.stdout == "a line for the person\n"
    assert not os.listdir(tmp) and not (tmp_path / "run.log").exists()


def test_unforeseen_error_shows_its_traceback_on_the_terminal_and_in_the_log(tmp_path, private_tmp):
    env, tmp = private_tmp
    log = tmp_path / "run.log"
    result = _python("-c", SESSION, log, "crash", env=env)
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "RuntimeError: an error nobody foresaw" in result.stderr
    assert "written to descriptor 2" not in result.stderr
    assert "RuntimeError: an error nobody foresaw" in log.read_text() and not os.listdir(tmp)


# -- python -m beam_preprocess


@pytest.mark.slow
def test_beam_preprocess_prints_a_summary_with_its_rate_and_logs_beside_the_output(clean_archives, tmp_path):
    out = tmp_path / "shards"
    args = ["-m", "beam_preprocess", "--train-archive", clean_archives.train_archive, "--output-dir", out]
    args += ["--val-archive", clean_archives.val_archive, "--num-hosts", 2]
    result = _python(*args)
    assert result.returncode == 0, result.stderr
    assert not result.stderr.strip()
    lines = _lines(result.stdout)
    assert len(lines) <= 10, result.stdout
    log = tmp_path / "shards.beam_preprocess.log"
    assert lines[0] == f"full log: {log}"
    assert re.search(r"^\d+ images in [\dhms.]+: \d+ images/s$", result.stdout, re.M)
    assert sorted(os.listdir(out)) == ["manifest.json", "train", "validation"]  # nothing but the output
    text = log.read_text()
    assert "INFO apache_beam" in text and "planned 1 work units" in text  # Beam's records and ours
    size = log.stat().st_size

    verbose = _python(*args, "--overwrite", "--verbose")
    assert verbose.returncode == 0, verbose.stderr
    assert "apache_beam" in verbose.stderr and "images/s" in verbose.stdout
    assert "full log" not in verbose.stdout and log.stat().st_size == size


# -- python -m trainer_module


def test_the_config_is_checked_against_the_shards_epoch_not_the_presets(digit_shards, tmp_path):
    # smoke says 16 training examples; the shards' manifest says 400. Batch 64 is a valid run on them (the run
    # trains on the manifest's epoch), batch 512 is not, and says so before the model directory is made.
    from trainer_module import __main__ as cli

    train_files, eval_files = digit_shards["train"], digit_shards["eval"]

    def preflight(batch: int, model_dir):
        argv = ["--preset", "smoke", "--train-files", train_files, "--eval-files", eval_files]
        argv += ["--model-dir", str(model_dir), "--set", f"data.global_batch_size={batch}"]
        argv += [
            "--set",
            "data.num_train_examples=16",
        ]  # an explicit count loses to the manifest's, as in run
        return cli.preflight(cli.parse_args(argv)).config

    config = preflight(64, tmp_path / "ok")
    assert (config.data.num_train_examples, config.data.num_eval_examples) == (400, 100)
    assert config.data.global_batch_size == 64
    with pytest.raises(
        cli.console.UsageError, match="global_batch_size=512 exceeds data.num_train_examples=400"
    ):
        preflight(512, tmp_path / "too-big")
    assert not (tmp_path / "too-big").exists()


@pytest.mark.slow
def test_trainer_prints_one_line_per_evaluation_and_logs_to_the_model_dir(digit_shards, tmp_path):
    train_files, eval_files = digit_shards["train"], digit_shards["eval"]
    model_dir = tmp_path / "model"
    args = ["-m", "trainer_module", "--preset", "smoke", "--model-dir", model_dir]
    args += ["--train-files", train_files, "--eval-files", eval_files]
    args += ["--set", "loop.train_epochs=2", "--set", "loop.eval_every_epochs=1"]
    result = _python(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not result.stderr.strip()
    lines = _lines(result.stdout)
    assert len(lines) <= 8, result.stdout
    evaluations = [line for line in lines if line.startswith("epoch ")]
    assert len(evaluations) == 2
    for line in evaluations:
        assert re.search(r"top-1 [\d.]+ .* [\d.]+ img/s  ETA (\d+\.\ds|\d+m\d\ds|\d+h\d\dm)$", line), line
    # The command runs as printed, the environment's own script whether or not it is activated.
    tensorboard = console.program_command("tensorboard")
    assert f"TensorBoard: {tensorboard} --logdir {model_dir / 'tensorboard'}" in lines
    (log,) = (model_dir / "logs").iterdir()
    assert lines[0] == f"full log: {log}"
    text = log.read_text()
    assert "trainer_module: train step" in text and "tensorflow" in text  # ours, and TensorFlow's

    # --verbose shows the records live instead of writing a file. (A label offset the shards do not have
    # stops that run at its first step, with one error line: LabelError is a known failure, not a traceback.)
    verbose = _python(*args, "--model-dir", tmp_path / "other", "--set", "data.label_offset=1", "--verbose")
    assert verbose.returncode == 2, verbose.stderr[-3000:]
    assert "trainer_module: start" in verbose.stderr and "Traceback" not in verbose.stderr
    (error,) = [line for line in verbose.stderr.splitlines() if line.startswith("error: ")]
    assert "train-" in error and "label" in error
    assert not (tmp_path / "other" / "logs").exists()
