"""The label that names a pipeline run on every cloud job it starts, so that the run's jobs can be found.

A compiled pipeline is the same for every run; what tells one run from another is the orchestrator's run id.
Every step that starts a cloud job (Vertex AI training and tuning jobs, the Dataflow jobs of the sharding step
and the Evaluator) labels it ``RUN_LABEL``, and the exit handler (``components.run_cleanup``) finds the run's
jobs by that label. A step learns the id from the argument ``RUN_FLAG``, compiled as ``RUN_ARG`` on Vertex AI
Pipelines (which fills the placeholder in arguments) or as ``kfp_run_arg`` on Kubeflow Pipelines (which fills
it in input parameters only): the id is then read off the step's output URIs (``run_id_in_uri``).

The run id is never an input parameter, because both orchestrators key a step's cache on its input values
and compiled arguments: every re-run would redo every step. Output URIs are not in the key. An argument whose
placeholder was not replaced is no run id (``run_value`` says so): a label made of it would name every run.
Details: docs/vertex.md, 'A cancelled or failed run stops paying'.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

# The label key on the run's jobs.
RUN_LABEL = "effnet_run"
# What the orchestrator replaces with the run's id, and the argument a compiled Vertex pipeline gives every
# task.
RUN_ID_PLACEHOLDER = "{{$.pipeline_job_uuid}}"
RUN_FLAG = "--effnet_run"
RUN_ARG = f"{RUN_FLAG}={RUN_ID_PLACEHOLDER}"
# What a pipeline compiled for Kubeflow gives every task instead (``kfp_run_arg``): the id is in its output
# URIs.
FROM_OUTPUT_URI = "from-output-uri"
# Google Cloud label values: lowercase letters, digits, '_' and '-', at most 63 characters (what is not one of
# them becomes '-').
_LABEL_VALUE = re.compile(r"[^a-z0-9_-]")
# A Kubeflow run id (a UUID) as a segment of an artifact URI.
_RUN_ID_SEGMENT = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")

logger = logging.getLogger("components.run_label")


class NoRunId(ValueError):
    """The task was given no run id, or a placeholder its orchestrator did not replace."""


def kfp_run_arg(pipeline_name: str) -> str:
    """The argument of every task of pipeline ``pipeline_name`` compiled for Kubeflow: the run's id is the
    UUID after the pipeline's name in the task's output URIs."""
    return f"{RUN_FLAG}={FROM_OUTPUT_URI}:{pipeline_name}"


def take_run_id(
    args: list[str], outputs: Mapping[str, Sequence[Any]] | None = None
) -> tuple[str | None, list[str]]:
    """The run id among a task's arguments (``RUN_FLAG``; None when absent) and the other arguments.

    ``kfp_run_arg`` stands for the run id in the URIs of the task's ``outputs`` (TFX's ``output_dict``:
    artifact lists by key), as a Kubeflow run places them; unless they hold exactly one, the argument's value
    is returned as it is (``run_value`` then says what is missing).
    """
    run_id, rest = None, []
    for arg in args:
        if arg.startswith(f"{RUN_FLAG}="):
            run_id = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    pipeline_name = _kfp_pipeline_name(run_id)
    if pipeline_name is not None:
        uris = [artifact.uri for artifacts in (outputs or {}).values() for artifact in artifacts]
        found = {run_id_in_uri(uri, pipeline_name) for uri in uris}
        if len(found) == 1 and None not in found:
            run_id = found.pop()
    return run_id, rest


def _kfp_pipeline_name(value: str | None) -> str | None:
    """The pipeline name of a ``kfp_run_arg`` value, None for any other value."""
    if value and value.startswith(f"{FROM_OUTPUT_URI}:"):
        return value.split(":", 1)[1]
    return None


def run_id_in_uri(uri: str, pipeline_name: str) -> str | None:
    """The Kubeflow run id in an artifact URI of pipeline ``pipeline_name``: the UUID-shaped segment right
    after a segment that is the pipeline's name (the last such pair), None if there is none.

    Kubeflow's driver writes a run's artifacts under ``<pipeline root>/<pipeline name>/<run id>/``; what
    follows (the task, in newer Kubeflow versions a random UUID per execution, the output) comes after the run
    id, and a UUID in the pipeline root is not after the pipeline's name."""
    segments = uri.rstrip("/").split("/")
    pairs = zip(segments, segments[1:], strict=False)
    found = [run for name, run in pairs if name == pipeline_name and _RUN_ID_SEGMENT.match(run)]
    return found[-1] if found else None


def label_value(text: str) -> str:
    """``text`` as a Google Cloud label value (lowercase, [a-z0-9_-], at most 63 characters)."""
    return _LABEL_VALUE.sub("-", text.lower())[:63]


def run_value(run_id: str | None) -> str:
    """The label value naming run ``run_id`` (a Google Cloud label value: lowercase, [a-z0-9_-], at most 63).

    Raises:
      NoRunId: ``run_id`` is empty or still a ``{{$...}}`` placeholder.
    """
    name = _kfp_pipeline_name(run_id)
    if name is not None:
        raise NoRunId(
            f"no run id: {RUN_FLAG} is {run_id!r}, and the task's output URIs do not hold one run id after "
            f"'/{name}/' (Kubeflow's layout: <pipeline root>/{name}/<run id>/...)"
        )
    if not run_id or "{{$" in run_id:
        raise NoRunId(
            f"no run id: {run_id!r} is not one; the orchestrator did not fill in {RUN_ID_PLACEHOLDER} "
            f"(Vertex AI Pipelines does in arguments and parameters, Kubeflow Pipelines in parameters only)"
        )
    return label_value(run_id)


def labels(run_id: str | None) -> dict[str, str]:
    """``{RUN_LABEL: value}`` for a job of run ``run_id``; {} when there is no run id (outside a compiled
    pipeline; with a warning when the orchestrator gave none): the job is then not found by the run's
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
