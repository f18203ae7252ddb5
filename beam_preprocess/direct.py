"""The Beam pipeline a sharding run executes in: any runner, with lean worker processes on the DirectRunner.

For ``--direct_running_mode multi_processing`` the DirectRunner starts each worker as
``python -m apache_beam.runners.worker.sdk_worker_main``. ``pipeline_from_args`` builds the same FnApiRunner
the DirectRunner would (pipeline options handed to the workers the same way), except that its workers run
``python -m beam_preprocess.worker``: the same SDK harness, started without the connectors sharding never
imports and ended without the interpreter's slow shutdown (see ``beam_preprocess.worker``). Every other runner
and mode is left exactly as Beam builds it.
"""

from __future__ import annotations

import logging
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions
from apache_beam.portability import python_urns
from apache_beam.portability.api import beam_provision_api_pb2, beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner import fn_runner

from beam_preprocess import lean_imports

BEAM_WORKER_COMMAND = f"{sys.executable} -m apache_beam.runners.worker.sdk_worker_main"
LEAN_WORKER_COMMAND = f"{sys.executable} -m beam_preprocess.worker"


def swap_worker_command(pipeline_proto: beam_runner_api_pb2.Pipeline) -> int:
    """Points every subprocess environment that runs Beam's worker at ours; returns how many it changed."""
    swapped = 0
    for environment in pipeline_proto.components.environments.values():
        if environment.urn != python_urns.SUBPROCESS_SDK:
            continue
        if environment.payload == BEAM_WORKER_COMMAND.encode():  # the payload is the command line itself
            environment.payload = LEAN_WORKER_COMMAND.encode()
            swapped += 1
    return swapped


class LeanWorkerRunner(fn_runner.FnApiRunner):
    """The DirectRunner's FnApiRunner whose worker processes start through ``beam_preprocess.worker``."""

    def run_via_runner_api(self, pipeline_proto, options):
        if not swap_worker_command(pipeline_proto):
            logging.warning("no DirectRunner worker command to replace: Beam's own workers run")
        return super().run_via_runner_api(pipeline_proto, options)


def uses_direct_worker_processes(options: PipelineOptions) -> bool:
    runner = options.view_as(StandardOptions).runner
    direct = options.view_as(DirectOptions)
    return (runner is None or runner in lean_imports.DIRECT_RUNNERS) and (
        direct.direct_running_mode == "multi_processing"
    )


def pipeline_from_args(beam_args: list[str]) -> beam.Pipeline:
    """A Beam pipeline for ``beam_args``; multi-process DirectRunner runs get lean worker processes, and a run on
    another runner is stoppable: on Dataflow, Ctrl-C (or SIGTERM) cancels the job (``components.dataflow_jobs``)."""
    options = PipelineOptions(beam_args)
    if not uses_direct_worker_processes(options):
        from components import dataflow_jobs

        return dataflow_jobs.StoppablePipeline(options=options)
    # What DirectRunner.run_pipeline gives the FnApiRunner: the options the workers read at start.
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    provision_info = fn_runner.ExtendedProvisionInfo(
        beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)
    )
    return beam.Pipeline(runner=LeanWorkerRunner(provision_info=provision_info), options=options)
