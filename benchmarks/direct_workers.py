"""What the multi-process DirectRunner's lean workers saved on the demo's sharding, against Beam's public routes.

``python -m beam_preprocess`` on the DirectRunner with ``--direct_num_workers 2`` shards the demo's data (the
embedded digits as ILSVRC2012 archives, ``beam_preprocess.sample_data``; 1,797 images, 2 hosts as the demo
preset) in three forms, each a fresh process of the command line as a person runs it, in turn (A B C A B C...),
so the machine's drift falls on all three alike:

- ``lean-processes``: the form the package used up to issue 38, the baseline: the DirectRunner's FnApiRunner
  built by hand from Beam's portability internals (``fn_runner.FnApiRunner``, ``JobServiceHandle``) so that
  its ``--direct_running_mode multi_processing`` workers start as ``benchmarks/lean_worker.py`` (Beam's SDK
  harness without the connectors sharding never imports, ended by ``os._exit``). Built here, in the benchmark,
  from those internals: no package module may import them.
- ``beam-processes``: Beam's own ``--direct_running_mode multi_processing``, what the command line runs now:
  its workers run ``python -m apache_beam.runners.worker.sdk_worker_main``, which imports every installed
  connector.
- ``threads``: ``--direct_running_mode multi_threading``: the workers are threads of the command's process
  (libjpeg decodes without the GIL, and each worker checks images on one thread per core already).

Printed: each form's best and median wall time of ``--repeats`` runs, and the ratios of the best runs to the
baseline's (below 1: faster than the baseline). Every run is checked: it exits 0 and its manifest counts every
image generated. ``--photos N`` shards N ImageNet-sized photos instead, where the workers' start weighs less.

    .venv/bin/python benchmarks/direct_workers.py                             # 5 runs of each form
    .venv/bin/python benchmarks/direct_workers.py --repeats 3 --photos 4000   # the steady state
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)  # run as a script: the package is importable from the checkout

BASELINE = "lean-processes"
FORMS = {
    BASELINE: ["--direct_running_mode", "multi_processing"],
    "beam-processes": ["--direct_running_mode", "multi_processing"],
    "threads": ["--direct_running_mode", "multi_threading"],
}
WORKERS = 2
NUM_HOSTS = 2  # the demo preset's

# Run as ``python -c LAUNCH FORM ARGS...``: the command line ``python -m beam_preprocess ARGS...`` with its
# DirectRunner pipeline built in the given form.
LAUNCH = r"""
import runpy, sys
form = sys.argv[1]
sys.argv = ["beam_preprocess", *sys.argv[2:]]
from beam_preprocess import lean_imports
lean_imports.install()  # as the command line does on the DirectRunner, before Beam is imported
sys.path.insert(0, {benchmarks!r})
import direct_workers
from beam_preprocess import run
if form == direct_workers.BASELINE:
    run.pipeline_from_args = direct_workers.lean_worker_pipeline
runpy.run_module("beam_preprocess", run_name="__main__", alter_sys=True)
"""


def lean_worker_pipeline(beam_args: list[str]):
    """The baseline: the DirectRunner's FnApiRunner, given the options its workers read at start as
    ``DirectRunner.run_pipeline`` gives them, whose subprocess workers run ``benchmarks/lean_worker.py``."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.portability import python_urns
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    beams = f"{sys.executable} -m apache_beam.runners.worker.sdk_worker_main".encode()
    lean = f"{sys.executable} {os.path.join(os.path.dirname(os.path.abspath(__file__)), 'lean_worker.py')}".encode()

    class LeanWorkerRunner(fn_runner.FnApiRunner):
        def run_via_runner_api(self, pipeline_proto, options):
            for environment in pipeline_proto.components.environments.values():
                if environment.urn == python_urns.SUBPROCESS_SDK and environment.payload == beams:
                    environment.payload = lean
            return super().run_via_runner_api(pipeline_proto, options)

    options = PipelineOptions(beam_args)
    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    provision = fn_runner.ExtendedProvisionInfo(
        beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)
    )
    return beam.Pipeline(runner=LeanWorkerRunner(provision_info=provision), options=options)


def run_once(form: str, archives: str, output_dir: str, images: int) -> float:
    """One run of ``form`` in a fresh process; its wall time in seconds, checked against the images generated."""
    from beam_preprocess import sample_data
    from effnet_common.manifest import MANIFEST_NAME, Manifest

    shutil.rmtree(output_dir, ignore_errors=True)
    args = [
        "--train-archive", os.path.join(archives, sample_data.TRAIN_ARCHIVE),
        "--val-archive", os.path.join(archives, sample_data.VAL_ARCHIVE),
        "--output-dir", output_dir, "--num-hosts", str(NUM_HOSTS),
        "--direct_num_workers", str(WORKERS), *FORMS[form],
    ]  # fmt: skip
    launch = LAUNCH.format(benchmarks=os.path.dirname(os.path.abspath(__file__)))
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", launch, form, *args], cwd=REPO_ROOT, capture_output=True, text=True
    )
    wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"{form}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    manifest = Manifest.read(os.path.join(output_dir, MANIFEST_NAME))
    records = sum(split.records for split in manifest.splits.values())
    if records != images or manifest.failures:
        raise SystemExit(
            f"{form}: {records} records, {len(manifest.failures)} failures (expected {images}, 0)"
        )
    return wall


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each form (default 5)")
    parser.add_argument("--forms", default=",".join(FORMS), help="which forms, comma-separated")
    parser.add_argument(
        "--photos",
        type=int,
        default=0,
        help="instead of the demo's digits, this many ImageNet-sized photos (sample_data --kind photos): the "
        "steady state, where the workers' start weighs less",
    )
    args = parser.parse_args(argv)
    from beam_preprocess import sample_data

    forms = args.forms.split(",")
    walls: dict[str, list[float]] = {form: [] for form in forms}
    with tempfile.TemporaryDirectory(prefix="direct-workers-") as work:
        archives = os.path.join(work, "archives")
        if args.photos:
            contents = sample_data.write_archives(
                archives, sample_data.photo_samples(args.photos, sample_data.PHOTOS_DEFAULT_SYNSETS)
            )
        else:
            contents = sample_data.write_digits_archives(archives)
        images = len(contents.train) + len(contents.validation)
        data = f"{images:,} photos" if args.photos else f"the demo's sharding ({images:,} digits)"
        for round_ in range(args.repeats):
            for form in forms:
                walls[form].append(run_once(form, archives, os.path.join(work, "shards"), images))
                print(f"round {round_ + 1}: {form} {walls[form][-1]:.2f} s", flush=True)
    best = {form: min(times) for form, times in walls.items()}
    print(f"\n{data}, {NUM_HOSTS} hosts, {WORKERS} workers, {args.repeats} runs each:")
    for form in forms:
        ratio = f", {best[form] / best[BASELINE]:.2f}x the baseline's best" if BASELINE in best else ""
        print(f"  {form:15s} best {best[form]:6.2f} s, median {statistics.median(walls[form]):6.2f} s{ratio}")
    print(json.dumps({"best_s": best, "runs_s": walls}))


if __name__ == "__main__":
    main()
