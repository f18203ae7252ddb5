"""The suite runs in the environment it sets (tests/suite_env.py), not in the one its caller exported."""

import os
import re
import subprocess
import sys

import suite_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_table_pins_clears_and_keeps_the_rest():
    caller = {
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "PYTHONWARNINGS": "ignore",
        "TF_CONFIG": "{}",
        "AIP_MODEL_DIR": "gs://m",
    }
    caller |= {"KF_PIPELINES_ENDPOINT": "https://kfp", "HOME": "/home/someone", "TMPDIR": "/tmp/run"}
    suite_env.apply(caller)
    assert caller == {**suite_env.PINNED, "HOME": "/home/someone", "TMPDIR": "/tmp/run"}


def test_the_session_started_with_the_pinned_values():
    # Libraries may set variables of the table once imported (tensorflow_transform sets TF_USE_LEGACY_KERAS,
    # pipeline.local_runner PYTHONWARNINGS as its own default), so only the pinned values are checked here.
    for name, value in suite_env.PINNED.items():
        if name in suite_env.LOCAL_SERVICES:
            assert os.environ.get(name) == value or os.environ[name].startswith("127.0.0.1:"), name
        else:
            assert os.environ.get(name) == value, name


def test_a_child_gets_the_table_over_what_a_caller_exported(monkeypatch):
    monkeypatch.setenv("PYTHONWARNINGS", "ignore")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    monkeypatch.setenv("AIP_MODEL_DIR", "gs://somebody/model")
    code = (
        "import os, sys, warnings; warnings.warn('seen');"
        "print(sys.warnoptions, os.environ.get('TF_CPP_MIN_LOG_LEVEL'), os.environ.get('AIP_MODEL_DIR'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=suite_env.child({"EXTRA": "1"}),
        timeout=60,
    )
    assert result.stdout == "[] 2 None\n"
    assert "UserWarning: seen" in result.stderr


def test_the_test_command_clears_what_pythons_interpreter_reads_at_start():
    with open(os.path.join(REPO, "scripts", "test.sh")) as f:
        unset = re.search(r"^unset (.+)$", f.read(), re.M)
    assert unset and sorted(unset.group(1).split()) == sorted(suite_env.PYTHON_STARTUP)


def test_a_group_of_tests_runs_on_one_worker(tmp_path):
    """The suite's units (tests/conftest.py) reach pytest-xdist as ``xdist_group`` marks; a module's fixtures are
    built once only if pytest-xdist keeps each group on one worker (pytest 9.2 broke it silently: setup.py)."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_grouped.py").write_text(
        "import os, pytest\n"
        + "".join(
            f"@pytest.mark.xdist_group('one')\ndef test_{i}():\n"
            f"    open('workers', 'a').write(os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n"
            for i in range(6)
        )
    )
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider"],
        cwd=tmp_path, check=True, capture_output=True, env=suite_env.child(),
    )  # fmt: skip
    workers = (tmp_path / "workers").read_text().split()
    assert len(workers) == 6 and len(set(workers)) == 1, workers
