"""The multi-process DirectRunner's lean workers (beam_preprocess.direct / .worker) and the refused imports."""

import contextlib
import os
import shutil
import subprocess
import sys

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import environments

from beam_preprocess import direct, lean_imports

MULTI_PROCESS = ["--direct_num_workers", "2", "--direct_running_mode", "multi_processing"]


def _worker_facts(_):
    """Where this element was processed: the worker's main module and whether a refused package is loaded."""
    main = sys.modules["__main__"]
    refused = sorted(name for name in lean_imports.REFUSED if name in sys.modules)
    return main.__spec__.name if main.__spec__ else main.__file__, tuple(refused)


def test_multi_process_workers_run_the_lean_worker_without_the_refused_packages(monkeypatch):
    # The workers unpickle _worker_facts by reference to this module: put it on their path.
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [tests_dir, os.environ.get("PYTHONPATH")])))
    with direct.pipeline_from_args(MULTI_PROCESS) as p:
        facts = p | beam.Create(range(4)) | beam.Map(_worker_facts) | beam.Distinct()
        assert_that(facts, equal_to([("beam_preprocess.worker", ())]))


@contextlib.contextmanager
def _never_run(pipeline: beam.Pipeline):
    """A pipeline built only to be looked at. Beam makes the pipeline's local temporary directory when it is
    built and removes it at the end of ``run()``: one that is never run removes it here."""
    try:
        yield pipeline
    finally:
        shutil.rmtree(pipeline.local_tempdir)


def test_other_modes_and_runners_are_built_by_beam_unchanged():
    for args in ([], ["--direct_running_mode", "multi_threading"]):
        with _never_run(direct.pipeline_from_args(args)) as p:
            assert not isinstance(p.runner, direct.LeanWorkerRunner)
    assert not direct.uses_direct_worker_processes(
        PipelineOptions(["--runner", "DataflowRunner", *MULTI_PROCESS])
    )
    with _never_run(direct.pipeline_from_args(MULTI_PROCESS)) as p:
        assert isinstance(p.runner, direct.LeanWorkerRunner)


def test_only_beams_own_worker_command_is_replaced():
    def proto_with(command):
        environment = environments.SubprocessSDKEnvironment.from_command_string(command)
        with _never_run(beam.Pipeline()) as p:
            return p.to_runner_api(default_environment=environment)

    beams = proto_with(direct.BEAM_WORKER_COMMAND)
    assert direct.swap_worker_command(beams) == 1
    payloads = {e.payload for e in beams.components.environments.values()}
    assert direct.LEAN_WORKER_COMMAND.encode() in payloads
    assert direct.BEAM_WORKER_COMMAND.encode() not in payloads
    assert direct.swap_worker_command(proto_with("my-own-worker --flag")) == 0


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
