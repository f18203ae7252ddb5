"""The label that names a pipeline run on every cloud job it starts, so that the run's jobs can be found.

A compiled pipeline is the same for every run; what tells one run from another is the orchestrator's run id,
which a step receives through the PipelineSpec placeholder ``{{$.pipeline_job_uuid}}`` compiled into its
execution parameter ``RUN_ID_KEY``: Vertex AI Pipelines replaces it with the PipelineJob's id, Kubeflow
Pipelines (2.5 and later) with the run's UUID. Every step that starts a cloud job puts that value on it as the
label ``RUN_LABEL``: the training and tuning custom jobs on Vertex AI, the Dataflow jobs of the sharding step and
of the Evaluator. The pipeline's exit handler (``components.run_cleanup``) finds the run's jobs by that label.

An orchestrator that does not replace the placeholder passes it through as it is; it is then no run id
(``run_value`` says so), since a label made of it would name every run at once.
"""

from __future__ import annotations

import logging

# The execution parameter of each step that starts a cloud job, and of the exit handler.
RUN_ID_KEY = "effnet_run"
# The label key on the run's jobs.
RUN_LABEL = "effnet_run"
# What a compiled pipeline binds RUN_ID_KEY to: the orchestrator's id of the run.
RUN_ID_PLACEHOLDER = "{{$.pipeline_job_uuid}}"

logger = logging.getLogger("components.run_label")


class NoRunId(ValueError):
    """The step was given no run id, or a placeholder its orchestrator did not replace."""


def run_value(run_id: str | None) -> str:
    """The label value naming run ``run_id`` (a Google Cloud label value: lowercase, [a-z0-9_-], at most 63).

    Raises:
      NoRunId: ``run_id`` is empty or still a ``{{$...}}`` placeholder.
    """
    from pipeline.cloud import label_value

    if not run_id or "{{$" in run_id:
        raise NoRunId(
            f"no run id: the orchestrator passed {run_id!r} for {RUN_ID_PLACEHOLDER} (Kubeflow Pipelines replaces "
            f"it from version 2.5 on)"
        )
    return label_value(run_id)


def labels(run_id: str | None) -> dict[str, str]:
    """``{RUN_LABEL: value}`` for a job of run ``run_id``; {} (with a warning) when there is no run id, as
    outside a compiled pipeline: the job is then not found by the run's clean-up."""
    if run_id is None:
        return {}
    try:
        return {RUN_LABEL: run_value(run_id)}
    except NoRunId as error:
        logger.warning("%s; this step's job carries no %s label", error, RUN_LABEL)
        return {}


def beam_args(run_id: str | None) -> list[str]:
    """Beam options putting the run's label on a step's Dataflow job."""
    return [f"--labels={key}={value}" for key, value in labels(run_id).items()]
