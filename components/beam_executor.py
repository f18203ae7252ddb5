"""Our TFX Beam executors: their Dataflow jobs stoppable and named after their execution, and on a local
runner no copy of TFX packaged for workers that already import it.

``StoppableBeamExecutor`` makes a step's Beam pipeline an ``effnet_common.dataflow_jobs.StoppablePipeline``
(on Dataflow, cancelled when the task is stopped, re-attached by a retried task) whose job carries the run's
label (``components.run_label``) and its execution's name (``execution_job_name``).

``InstalledTfxOnLocalRunners``: unless the Beam options say how workers get their packages, TFX's
``BaseBeamExecutor`` builds a source package of the installed TFX in a new temporary directory, adds it as
``--extra_package`` and never removes the directory. That serves remote workers; a local runner's workers
import TFX from this environment, so there the options go to Beam as given (without TFX's GCP telemetry
labels, read by Dataflow only, and its parsing of the Beam options as absl flags, which no step of ours
reads). On Dataflow the compiled steps name their SDK image, so nothing is built there either.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from effnet_common import cloud_retry

# Beam's runners that run the workers in this process or in processes started from this environment.
LOCAL_RUNNERS = ("DirectRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner", "FnApiRunner")


def runs_locally(beam_args: Sequence[str]) -> bool:
    """Whether Beam options choose a local runner (Beam's default when they name none)."""
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    runner = PipelineOptions(list(beam_args)).view_as(StandardOptions).runner
    return runner is None or runner in LOCAL_RUNNERS or runner.lower() == "direct"


class InstalledTfxOnLocalRunners:
    """Mixin for a TFX Beam executor (before it in the bases): on a local runner, its Beam options are used
    as given, without the TFX package TFX would build for remote workers (see the module's docstring)."""

    def __init__(self, context=None):
        beam_args = getattr(context, "beam_pipeline_args", None)
        if not beam_args or not runs_locally(beam_args):
            super().__init__(context)
            return
        without_args = copy.copy(context)
        without_args.beam_pipeline_args = None  # TFX prepares no options it is not given
        super().__init__(without_args)
        self._beam_pipeline_args = list(beam_args)


def execution_job_name(output_dict: dict) -> str:
    """The Dataflow job name of a step's execution: the same for a retried task (it keeps its output URIs),
    another for every other execution (Dataflow's names: ``[a-z]([-a-z0-9]*[a-z0-9])?``)."""
    from components import vertex_training

    return f"effnet-{vertex_training.outputs_digest(output_dict)}"


class StoppableBeamExecutor:
    """Mixin for a TFX Beam executor (before it in the bases): its Beam pipeline is a ``StoppablePipeline``
    whose Dataflow job carries the label of the run named among the task's arguments, or in its output URIs on
    Kubeflow (``components.run_label``), and the name of the task's execution (``execution_job_name``)."""

    _run_outputs: dict | None = None

    def take_run_outputs(self, output_dict: dict) -> None:
        """Keeps the task's outputs, where a Kubeflow run's id is (``run_label.kfp_run_arg``): each executor's
        ``Do`` calls it before its Beam pipeline is made."""
        self._run_outputs = output_dict

    def _make_beam_pipeline(self):
        from components import run_label
        from effnet_common.dataflow_jobs import StoppablePipeline

        if self._make_beam_pipeline_fn is not None:  # a TFX operator's own pipeline
            return self._make_beam_pipeline_fn()
        run_id, args = run_label.take_run_id(self._beam_pipeline_args, self._run_outputs)
        patience, args = cloud_retry.take_patience(args)
        if self._run_outputs and not any(arg.startswith("--job_name") for arg in args):
            args = [*args, f"--job_name={execution_job_name(self._run_outputs)}"]
        pipeline = StoppablePipeline(argv=[*args, *run_label.beam_args(run_id)])
        pipeline.patience = patience
        return pipeline
