"""``RunCleanup``: the pipeline's exit task, which cancels every job of the run still running when it ends.

A step cancels its own job when its task is stopped, but a task killed outright (SIGKILL, out of memory, its
node lost), or stopped before its job had an id, leaves the job billing. The exit task runs once every other
task has ended, in any state (it takes no ``PipelineTaskFinalStatus``), finds the run's jobs by the label
every step puts on them (``components.run_label``) and cancels those not ended: the Vertex AI custom jobs and
Dataflow jobs of the project and region, and a TPU VM slice's queued resources in its zone (deleted with their
nodes). It logs one line per job and a summary, ``run RUN: cancelled ...`` or ``run RUN: no job left
running``.

The run's id is the parameter ``RUN_ID_KEY`` when compiled for Kubeflow (which fills its run-id placeholder in
input parameters only, and this task has no outputs to read it from), else the argument ``run_label.RUN_ARG``.
What it could not do is an error in its log naming the permission a refusal says is missing (``PERMISSIONS``);
the task still succeeds, as a clean-up must never change its run's outcome. More: docs/vertex.md.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from tfx.dsl.components.base import base_beam_component, base_beam_executor, executor_spec
from tfx.types import component_spec

from components import beam_executor, run_label, vertex_training
from effnet_common import cloud_retry, dataflow_jobs, follower

PROJECT_KEY = "project"
REGION_KEY = "region"
TPU_ZONE_KEY = "tpu_zone"
# Optional: the run's id (a placeholder the orchestrator fills in); without it, the id among the arguments.
RUN_ID_KEY = "run_id"
STEP_ID = "RunCleanup"
# What each call needs of the service account: the IAM permission, and the role of docs/vertex.md's set-up
# that has it.
PERMISSIONS = {
    "list custom jobs": "aiplatform.customJobs.list (roles/aiplatform.user)",
    "cancel custom job": "aiplatform.customJobs.cancel (roles/aiplatform.user)",
    "list Dataflow jobs": "dataflow.jobs.list (roles/dataflow.developer)",
    "cancel Dataflow job": "dataflow.jobs.cancel (roles/dataflow.developer)",
    "list queued resources": "tpu.queuedResources.list (roles/tpu.admin)",
}

logger = logging.getLogger("components.run_cleanup")


@dataclasses.dataclass
class CleanupReport:
    """What the clean-up of one run did: ``(job, state after)`` of each job cancelled, and what failed."""

    run: str
    custom_jobs: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    dataflow_jobs: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    tpu_slices: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        """One line: ``run RUN: cancelled ...`` or ``run RUN: no job left running``, and what failed."""
        parts = [
            f"{len(jobs)} {kind}{'s' if len(jobs) > 1 else ''} "
            f"({', '.join(f'{job}: {state}' for job, state in jobs)})"
            for kind, jobs in (
                ("Vertex AI custom job", self.custom_jobs),
                ("Dataflow job", self.dataflow_jobs),
                ("TPU slice", self.tpu_slices),
            )
            if jobs
        ]
        done = "cancelled " + " and ".join(parts) if parts else "no job cancelled"
        if not self.failures:
            return f"run {self.run}: {done if parts else 'no job left running'}"
        return f"run {self.run}: {done}; could not cancel: {'; '.join(self.failures)}"


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def _failure(what: str, call: str, error: BaseException) -> str:
    """One line: what could not be done, why, and for a refusal (403) the permission it needed."""
    line = f"{what}: {_one_line(error)}"
    if cloud_retry.http_status(error) == 403:
        line += f" (the service account lacks {PERMISSIONS[call]})"
    return line


def cancel_custom_jobs(project: str, region: str, run: str, report: CleanupReport) -> None:
    """Cancels the run's Vertex AI custom jobs that have not ended, into ``report``."""
    from google.cloud.aiplatform import gapic

    client = gapic.JobServiceClient(client_options={"api_endpoint": f"{region}-aiplatform.googleapis.com"})
    request = {
        "parent": f"projects/{project}/locations/{region}",
        "filter": f'labels.{run_label.RUN_LABEL}="{run}"',
    }
    calls = {"timeout": cloud_retry.CALL_TIMEOUT_SECONDS}
    try:
        listed = client.list_custom_jobs(
            request=request,
            retry=cloud_retry.call_retry(f"listing custom jobs of {request['parent']}"),
            **calls,
        )
        jobs = [job for job in listed if job.state.name not in vertex_training.ENDED]
    except Exception as error:
        what = f"listing the Vertex AI custom jobs of {request['parent']}"
        report.failures.append(_failure(what, "list custom jobs", error))
        return
    for job in jobs:
        state = follower.cancel(
            vertex_training.CustomJob(client, job.name), retry_seconds=cloud_retry.CALL_RETRY_SECONDS
        ).state
        if state in vertex_training.ENDED or state == "JOB_STATE_CANCELLING":
            report.custom_jobs.append((job.name, state))
        else:
            report.failures.append(
                f"{job.name} is {state} ({vertex_training.console_url(job.name)}; cancelling it needs "
                f"{PERMISSIONS['cancel custom job']})"
            )


def cancel_dataflow_jobs(api: dataflow_jobs.DataflowApi, run: str, report: CleanupReport) -> None:
    """Cancels the run's Dataflow jobs that have not ended, into ``report``."""
    try:
        jobs = api.jobs_labelled(run_label.RUN_LABEL, run)
    except Exception as error:
        what = f"listing the Dataflow jobs of {api.project}/{api.region}"
        report.failures.append(_failure(what, "list Dataflow jobs", error))
        return
    for job in jobs:
        try:
            report.dataflow_jobs.append((f"{job.id} {job.name}".strip(), api.cancel(job.id)))
        except Exception as error:
            what = f"Dataflow job {job.id} ({api.console_url(job.id)})"
            report.failures.append(_failure(what, "cancel Dataflow job", error))


def delete_tpu_slices(project: str, zone: str, endpoint: str, run: str, report: CleanupReport) -> None:
    """Deletes the run's TPU VM slices in ``zone`` (its queued resources, found by the run's label on their
    node: ``components.tpu_vm``), each followed until the API no longer knows it."""
    from components import tpu_vm

    client = tpu_vm.client_for(endpoint)
    try:
        names = tpu_vm.run_resources(client, project, zone, run_label.RUN_LABEL, run)
    except Exception as error:
        report.failures.append(
            _failure(f"the TPU slices of {project}/{zone}", "list queued resources", error)
        )
        return
    for name in names:
        gone = tpu_vm.delete(client, name)
        if gone:
            report.tpu_slices.append((name.rsplit("/", 1)[1], "DELETED"))
        else:
            report.failures.append(
                f"TPU slice {name}: still there after its delete (delete it: gcloud compute tpus "
                f"queued-resources delete {name.rsplit('/', 1)[1]} --zone {zone} --force)"
            )


def clean_up(
    project: str, region: str, run_id: str, beam_args: list[str], tpu_zone: str = "", tpu_endpoint: str = ""
) -> CleanupReport:
    """Cancels every job of run ``run_id`` still running in ``project`` / ``region``: its Vertex AI custom
    jobs, its Dataflow jobs (reached with the Beam options ``beam_args``, as its Beam steps reach Dataflow),
    and with ``tpu_zone`` its TPU VM slices there.

    Raises:
      run_label.NoRunId: ``run_id`` names no run.
    """
    run = run_label.run_value(run_id)
    report = CleanupReport(run)
    cancel_custom_jobs(project, region, run, report)
    api = dataflow_jobs.DataflowApi.from_args([*beam_args, f"--project={project}", f"--region={region}"])
    cancel_dataflow_jobs(api, run, report)
    if tpu_zone:
        delete_tpu_slices(project, tpu_zone, tpu_endpoint or tpu_endpoint_of_environment(), run, report)
    return report


def tpu_endpoint_of_environment() -> str:
    """The Cloud TPU API's endpoint: ``components.tpu_vm.API_ENDPOINT``, or the one the environment names
    (``ENDPOINT_VARIABLE``: a rehearsal's or a test's server on this machine)."""
    from components import tpu_vm

    return os.environ.get(tpu_vm.ENDPOINT_VARIABLE) or tpu_vm.API_ENDPOINT


class Executor(beam_executor.InstalledTfxOnLocalRunners, base_beam_executor.BaseBeamExecutor):
    """Runs ``clean_up`` for the run named by the task's ``RUN_ID_KEY`` parameter, else among its arguments,
    and prints its summary; what it could not do is an error in its log, never the task's failure."""

    def Do(self, input_dict: dict, output_dict: dict, exec_properties: dict[str, Any]) -> None:  # noqa: N802
        del input_dict, output_dict
        run_id, beam_args = run_label.take_run_id(self._beam_pipeline_args)
        beam_args = cloud_retry.take_patience(beam_args)[1]
        run_id = exec_properties.get(RUN_ID_KEY) or run_id
        try:
            report = clean_up(
                exec_properties[PROJECT_KEY],
                exec_properties[REGION_KEY],
                run_id,
                beam_args,
                exec_properties.get(TPU_ZONE_KEY) or "",
            )
        except run_label.NoRunId as error:
            summary = f"no clean-up: {error}"
            logger.error("%s", summary)
            print(summary, flush=True)
            return
        summary = report.summary()
        (logger.error if report.failures else logger.warning)("%s", summary)
        print(summary, flush=True)


class RunCleanupSpec(component_spec.ComponentSpec):
    """Where the run's jobs are: project and region; and, optionally, which run's they are."""

    PARAMETERS = {
        PROJECT_KEY: component_spec.ExecutionParameter(type=str),
        REGION_KEY: component_spec.ExecutionParameter(type=str),
        RUN_ID_KEY: component_spec.ExecutionParameter(type=str, optional=True),
        TPU_ZONE_KEY: component_spec.ExecutionParameter(type=str, optional=True),
    }
    INPUTS = {}
    OUTPUTS = {}


class RunCleanup(base_beam_component.BaseBeamComponent):
    """The exit handler: cancels the run's jobs left running (see the module's docstring). A Beam component so
    that it reaches Dataflow with the Beam options of the pipeline's Beam steps (``with_beam_pipeline_args``),
    which carry the run's id."""

    SPEC_CLASS = RunCleanupSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(Executor)

    def __init__(self, project: str, region: str, run_id: str | None = None, tpu_zone: str = ""):
        parameters = {PROJECT_KEY: project, REGION_KEY: region}
        if run_id is not None:
            parameters[RUN_ID_KEY] = run_id
        if tpu_zone:  # the Trainer trains on a TPU VM slice there
            parameters[TPU_ZONE_KEY] = tpu_zone
        super().__init__(spec=RunCleanupSpec(**parameters))
