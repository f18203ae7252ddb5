"""The label that names a pipeline run on every cloud job it starts, so that the run's jobs can be found.

A compiled pipeline is the same for every run; what tells one run from another is the orchestrator's run id.
Vertex AI Pipelines puts it in place of the placeholder ``{{$.pipeline_job_uuid}}`` in a task's container
arguments, so a compiled Vertex pipeline gives every task the argument ``RUN_ARG``
(``--effnet_run={{$.pipeline_job_uuid}}``, among the Beam options TFX passes to every task). Every step that
starts a cloud job puts the value on it as the label ``RUN_LABEL``: the training and tuning custom jobs on Vertex
AI, the Dataflow jobs of the sharding step and of the Evaluator; the pipeline's exit handler
(``components.run_cleanup``) finds the run's jobs by that label.

The run id is an argument and not an input parameter because Vertex AI Pipelines (and Kubeflow Pipelines) make a
step's cache key of its input parameters' values and its compiled arguments: a run-id parameter would give every
run's steps a new key, and no step of a re-run would be reused. Kubeflow Pipelines replaces the run placeholders
in input parameters only, not in arguments, so a pipeline compiled for it carries no run id.

An argument whose placeholder was not replaced is no run id (``run_value`` says so): a label made of it would
name every run at once.
"""

from __future__ import annotations

import logging

# The label key on the run's jobs.
RUN_LABEL = "effnet_run"
# What the orchestrator replaces with the run's id, and the argument a compiled Vertex pipeline gives every task.
RUN_ID_PLACEHOLDER = "{{$.pipeline_job_uuid}}"
RUN_FLAG = "--effnet_run"
RUN_ARG = f"{RUN_FLAG}={RUN_ID_PLACEHOLDER}"

logger = logging.getLogger("components.run_label")


class NoRunId(ValueError):
    """The task was given no run id, or a placeholder its orchestrator did not replace."""


def take_run_id(args: list[str]) -> tuple[str | None, list[str]]:
    """The run id among a task's arguments (``RUN_FLAG``; None when absent) and the other arguments."""
    run_id, rest = None, []
    for arg in args:
        if arg.startswith(f"{RUN_FLAG}="):
            run_id = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return run_id, rest


def run_value(run_id: str | None) -> str:
    """The label value naming run ``run_id`` (a Google Cloud label value: lowercase, [a-z0-9_-], at most 63).

    Raises:
      NoRunId: ``run_id`` is empty or still a ``{{$...}}`` placeholder.
    """
    from pipeline.cloud import label_value

    if not run_id or "{{$" in run_id:
        raise NoRunId(
            f"no run id: {RUN_FLAG} is {run_id!r}; the orchestrator did not replace {RUN_ID_PLACEHOLDER} in the "
            f"task's arguments (Vertex AI Pipelines does)"
        )
    return label_value(run_id)


def labels(run_id: str | None) -> dict[str, str]:
    """``{RUN_LABEL: value}`` for a job of run ``run_id``; {} when there is no run id (outside a compiled Vertex
    pipeline; with a warning when the placeholder was not replaced): the job is then not found by the run's
    clean-up."""
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
