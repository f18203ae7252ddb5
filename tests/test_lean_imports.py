"""The imports ``python -m beam_preprocess`` refuses on the DirectRunner (``beam_preprocess.lean_imports``) and
``python -m trainer_module`` refuses for a run (``trainer_module.lean_imports``)."""

import subprocess
import sys

import pytest

from beam_preprocess import lean_imports
from trainer_module import lean_imports as trainer_lean_imports


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


def _python(code: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code, *argv], capture_output=True, text=True, timeout=120
    )


def _with_refusal(package: str, imports: str, probe: str) -> list[str]:
    """In a fresh interpreter (installing it in this test process would refuse them to every later test):
    ``package``'s refusal installed, then ``imports`` run; the lines they print, the refused packages loaded all
    the same, and what importing ``probe`` raises."""
    code = f"""
import sys
from {package} import lean_imports
assert lean_imports.install()
{imports}
print(sorted(name for name in lean_imports.REFUSED if name in sys.modules))
try:
    import {probe}
except ImportError as e:
    print(e)
"""
    done = _python(code)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_installed_finder_refuses_exactly_the_listed_packages():
    imports = """
import apache_beam
from apache_beam.io.filesystems import FileSystems
print(type(FileSystems.get_filesystem("gs://bucket/x")).__name__)
"""
    gcs, loaded, refusal = _with_refusal("beam_preprocess", imports, "google.cloud.bigquery")
    assert gcs == "GCSFileSystem"  # gs:// still works: google-cloud-storage is not refused
    assert loaded == "[]"
    assert "google.cloud.bigquery is not imported by beam_preprocess" in refusal


def test_install_changes_nothing_once_a_refused_package_is_imported():
    done = _python("import pandas\nfrom beam_preprocess import lean_imports\nprint(lean_imports.install())")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize(
    "argv, remote",
    [
        (["--train-archive", "a.tar", "--output-dir", "out"], False),
        (["--train-archive", "gs://b/a.tar", "--output-dir", "out"], True),
        (["--output-dir", "o", "--temp_location=gs://b/tmp"], True),
        (["--train-dir", "hdfs://nn/train", "--output-dir", "o"], True),
    ],
)
def test_remote_paths_read_from_the_command_line(argv, remote):
    assert lean_imports.names_remote_paths(argv) is remote


def test_a_local_only_run_imports_no_object_store_and_still_reads_and_writes_local_files(tmp_path):
    """With ``local_only`` Beam imports without its GCS and HDFS file systems (as if their libraries were not
    installed: no warning), local paths work, and a gs:// path is refused in Beam's own words."""
    code = f"""
import logging, sys
logging.basicConfig(level=logging.WARNING)
from beam_preprocess import lean_imports
assert lean_imports.install(local_only=True)
from apache_beam.io.filesystems import FileSystems
from effnet_common import storage
storage.write_text({str(tmp_path / "x.txt")!r}, "hello")
print(FileSystems.exists({str(tmp_path / "x.txt")!r}))
print(sorted(name for name in lean_imports.REFUSED + lean_imports.LOCAL_ONLY_REFUSED if name in sys.modules))
try:
    FileSystems.get_filesystem("gs://bucket/x")
except ValueError as e:
    print("refused:", e)
"""
    done = _python(code)
    assert done.returncode == 0, done.stderr
    exists, loaded, refusal = done.stdout.splitlines()
    assert (exists, loaded) == ("True", "[]")
    assert refusal.startswith("refused:") and "gs" in refusal
    assert "Failed to import" not in done.stderr  # Beam skips the missing file systems without a warning


@pytest.mark.parametrize(
    "argv, refused",
    [([], True), (["--preset", "demo"], True), (["train", "--preset", "demo"], True), (["report", "d"], True),
     (["tune", "--preset", "demo"], False)],
)  # fmt: skip
def test_the_trainers_runs_refuse_and_its_search_does_not(argv, refused):
    assert trainer_lean_imports.wanted(argv) is refused


@pytest.mark.parametrize("argv, refused", [(["--help"], "True"), (["tune", "--help"], "False")])
def test_the_command_refuses_them_before_anything_else_for_a_run_only(argv, refused):
    code = """
import runpy, sys
sys.argv = ["trainer_module", *sys.argv[1:]]
try:
    runpy.run_module("trainer_module", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
print(any(type(finder).__name__ == "_RefuseFinder" for finder in sys.meta_path))
"""
    done = _python(code, *argv)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == refused


@pytest.mark.slow
def test_a_training_process_imports_tensorflow_keras_and_the_report_without_the_refused_packages():
    """What a run imports works without them: TensorFlow, Keras, the loop, the export and the report's pyplot."""
    imports = """
import keras, tensorflow
import matplotlib.pyplot
from trainer_module import export, report, run, train
"""
    loaded, refusal = _with_refusal("trainer_module", imports, "pandas")[-2:]
    assert loaded == "[]"
    assert refusal.startswith("pandas is not imported by python -m trainer_module")
