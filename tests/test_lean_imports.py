"""The imports ``python -m beam_preprocess`` refuses on the DirectRunner (``beam_preprocess.lean_imports``)."""

import subprocess
import sys

import pytest

from beam_preprocess import lean_imports


@pytest.mark.parametrize(
    "argv, direct_runner",
    [
        ([], True),
        (["--runner", "DirectRunner", "--x", "1"], True),
        (["--runner=direct"], True),
        (["--runner", "DataflowRunner"], False),
        (["--output-dir", "o", "--runner=PortableRunner"], False),
    ],
)
def test_runner_read_from_the_command_line(argv, direct_runner):
    assert lean_imports.runs_on_direct_runner(argv) is direct_runner


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120
    )


def test_installed_finder_refuses_exactly_the_listed_packages():
    # In a fresh interpreter: installing it in this test process would refuse them to every later test.
    code = """
import sys
from beam_preprocess import lean_imports
assert lean_imports.install()
import apache_beam
from apache_beam.io.filesystems import FileSystems
print(type(FileSystems.get_filesystem("gs://bucket/x")).__name__)
print(sorted(name for name in lean_imports.REFUSED if name in sys.modules))
try:
    import google.cloud.bigquery
except ImportError as e:
    print(e)
"""
    done = _python(code)
    assert done.returncode == 0, done.stderr
    gcs, loaded, refusal = done.stdout.splitlines()
    assert gcs == "GCSFileSystem"  # gs:// still works: google-cloud-storage is not refused
    assert loaded == "[]"
    assert "google.cloud.bigquery is not imported by beam_preprocess" in refusal


def test_install_changes_nothing_once_a_refused_package_is_imported():
    done = _python("import pandas\nfrom beam_preprocess import lean_imports\nprint(lean_imports.install())")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
