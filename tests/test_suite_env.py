"""The suite runs in the environment it sets (tests/suite_env.py), not in the one its caller exported."""

import os
import re
import subprocess
import sys

import suite_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_session_runs_with_the_pinned_values_and_without_the_cleared_names():
    for name, value in suite_env.PINNED.items():
        assert os.environ.get(name) == value, name
    leaked = [n for n in os.environ if n in suite_env.CLEARED or n.startswith(suite_env.CLEARED_PREFIXES)]
    assert leaked == []


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
