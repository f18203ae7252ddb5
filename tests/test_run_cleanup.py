"""Nothing left billing: the compiled exit handler, the run's label on its jobs, and Dataflow jobs cancelled.

The compiled pipeline (``python -m pipeline.kubeflow_v2_runner``) has an exit handler (``components.run_cleanup``)
that Vertex AI Pipelines and Kubeflow Pipelines run after every step has ended, whatever its state; it cancels the
jobs of its run still running, found by the run's label. The Beam steps cancel their own Dataflow job when their
task is stopped.

Dataflow is ``fake_dataflow.FakeDataflow`` on 127.0.0.1 (the DataflowRunner and the project's
``JobsV1Beta3Client`` talk to it through Beam's ``--dataflow_endpoint``); Vertex AI's custom jobs are ``fake_vertex.FakeProjectJobs`` behind the
SDK's ``JobServiceClient``. The container tasks run as their containers would (``kfp_launcher``), the Beam step on
the DataflowRunner with its staging on the GCS emulator.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import fake_kfp_server
import fake_vertex
import faults
import gcs_emulator
import kfp_launcher
import pytest
import suite_env
import yaml
from fake_dataflow import FakeDataflow
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from components import run_cleanup, run_label, runtime_gate
from effnet_common import dataflow_jobs
from pipeline import kubeflow_v2_runner
from pipeline.template import Template, pipeline_tasks

PROJECT, NUMBER, REGION = "effnet-test-project", "123456789012", "us-central1"
IMAGE = "us-docker.pkg.dev/effnet-test-project/effnet/pipeline@sha256:" + "a" * 64
RUN, OTHER_RUN = "4f1c2a3b-run-one", "9e8d7c6b-run-two"
# A Kubeflow run's id (a UUID), and the random UUID Kubeflow puts in each execution's output URIs since 2024.
KFP_RUN, KFP_SALT = "0b6e7d0c-3d51-4c5e-9a43-8d2b7f1e6a90", "5d1c8a9e-7f3b-4e2a-b6c4-0a9f8e7d6c5b"
PIPELINE_LABELS = {"effnet-pipeline": "effnet-smoke", "effnet-preset": "smoke"}
STEPS_WITH_JOBS = ("ImageNetShardGen", "Trainer", "Evaluator")


def compile_smoke(
    out_dir, root: str, train_archive="gs://b/t.tar", val_archive="gs://b/v.tar", suffix=".json"
):
    output = os.path.join(out_dir, f"effnet{suffix}")
    argv = [
        "--output", output, "--project", PROJECT, "--region", REGION, "--pipeline-root", root, "--image", IMAGE,
        "--accelerator", "cpu", "--preset", "smoke", "--train-archive", train_archive, "--val-archive", val_archive,
        "--param", "target_top1=0.0",
    ]  # fmt: skip
    assert kubeflow_v2_runner.main(argv) == 0
    with open(output) as f:
        return yaml.safe_load(f)


@pytest.fixture
def dataflow():
    fake = FakeDataflow()
    yield fake
    fake.stop()


def custom_job(job_id: str, run: str, state: str, location: str = REGION) -> dict:
    """A training job as the Trainer creates it (its labels: the pipeline's, and the run's)."""
    return {
        "name": f"projects/{NUMBER}/locations/{location}/customJobs/{job_id}",
        "display_name": f"effnet-smoke-trainer-{job_id}",
        "labels": {**PIPELINE_LABELS, run_label.RUN_LABEL: run},
        "state": state,
        "job_spec": {
            "worker_pool_specs": [{"machine_spec": {"machine_type": "n1-standard-8"}, "replica_count": 1}]
        },
    }


# ---- the compiled exit handler ---------------------------------------------------------------------------------


def _args(spec: dict, task: str) -> list[str]:
    label = spec["components"][pipeline_tasks(spec)[task]["componentRef"]["name"]]["executorLabel"]
    return spec["deploymentSpec"]["executors"][label]["container"]["args"]


def test_compiled_vertex_job_runs_the_clean_up_after_every_step_whatever_its_state(tmp_path):
    spec = compile_smoke(tmp_path, "gs://effnet-test-bucket/pipelines")["pipelineSpec"]
    message = json_format.ParseDict(spec, pipeline_spec_pb2.PipelineSpec())  # the PipelineSpec schema's own
    root = spec["root"]["dag"]["tasks"]
    assert set(root) == {"tfx-dag", run_cleanup.STEP_ID}
    # The steps sit in the DAG the exit handler follows; it runs once that DAG has ended, in any state.
    steps = spec["components"]["tfx-dag"]["dag"]["tasks"]
    assert {"ImageNetShardGen", "Trainer", "Evaluator", "Pusher"} <= set(steps)
    cleanup = root[run_cleanup.STEP_ID]
    assert cleanup["triggerPolicy"] == {"strategy": "ALL_UPSTREAM_TASKS_COMPLETED"}
    assert cleanup["dependentTasks"] == ["tfx-dag"]
    assert not cleanup.get("cachingOptions", {}).get("enableCache")  # a cached clean-up would cancel nothing
    assert message.root.dag.tasks[run_cleanup.STEP_ID].trigger_policy.strategy == (
        pipeline_spec_pb2.PipelineTaskSpec.TriggerPolicy.ALL_UPSTREAM_TASKS_COMPLETED
    )
    parameters = cleanup["inputs"]["parameters"]
    assert {name: value["runtimeValue"]["constant"] for name, value in parameters.items()} == {
        "project": PROJECT,
        "region": REGION,
    }
    args = _args(spec, run_cleanup.STEP_ID)
    assert args[:2] == ["--executor_class_path", "components.run_cleanup.Executor"]
    assert {f"--project={PROJECT}", f"--region={REGION}"} <= set(args)  # Dataflow where the Beam steps run it
    # Every task learns its run's id from its arguments, which Vertex fills in...
    for task in (*STEPS_WITH_JOBS, run_cleanup.STEP_ID):
        assert "--effnet_run={{$.pipeline_job_uuid}}" in _args(spec, task), task
    # ... and no step's input depends on the run: a step's cache key is its inputs' values and its compiled
    # arguments, so a re-run with the same values reuses it.
    assert "{{$" not in json.dumps({name: task.get("inputs", {}) for name, task in steps.items()})
    # The runtime parameters reach the steps through the DAG: declared on it and passed in from the root.
    declared = spec["root"]["inputDefinitions"]["parameters"]
    dag_inputs = spec["components"]["tfx-dag"]["inputDefinitions"]["parameters"]
    assert {name: p["parameterType"] for name, p in dag_inputs.items()} == {
        name: p["parameterType"] for name, p in declared.items()
    }
    assert root["tfx-dag"]["inputs"]["parameters"] == {
        name: {"componentInputParameter": name} for name in declared
    }
    bound = {
        binding["componentInputParameter"]
        for task in steps.values()
        for binding in task.get("inputs", {}).get("parameters", {}).values()
        if "componentInputParameter" in binding
    }
    assert bound and bound <= set(dag_inputs)


def test_the_kubeflow_spec_cleans_up_by_the_run_id_kubeflow_fills_in(tmp_path):
    """Kubeflow Pipelines fills the run-id placeholder in input parameters only, which are in a step's cache key:
    the exit handler (never cached) takes it as a parameter; the steps read it off their output URIs, which are
    not in the key."""
    spec = compile_smoke(tmp_path, "gs://effnet-test-bucket/pipelines", suffix=".yaml")
    fake_kfp_server.check_run(spec, {})  # the API server's checks of a run
    root = spec["root"]["dag"]["tasks"]
    assert set(root) == {"tfx-dag", run_cleanup.STEP_ID}
    cleanup = root[run_cleanup.STEP_ID]
    assert cleanup["triggerPolicy"] == {"strategy": "ALL_UPSTREAM_TASKS_COMPLETED"}
    assert cleanup["dependentTasks"] == ["tfx-dag"]
    assert not cleanup.get("cachingOptions", {}).get("enableCache")
    parameters = cleanup["inputs"]["parameters"]
    assert {name: value["runtimeValue"]["constant"] for name, value in parameters.items()} == {
        "project": PROJECT,
        "region": REGION,
        "run_id": "{{$.pipeline_job_uuid}}",  # exactly the constant Kubeflow's driver replaces
    }
    steps = spec["components"]["tfx-dag"]["dag"]["tasks"]
    for task in STEPS_WITH_JOBS:
        assert run_label.kfp_run_arg(spec["pipelineInfo"]["name"]) in _args(spec, task), task
    # Nothing of a step's cache key (its inputs and its arguments) depends on the run.
    assert "{{$" not in json.dumps({name: task.get("inputs", {}) for name, task in steps.items()})
    assert not [arg for task in steps for arg in _args(spec, task) if "{{$." in arg]


def test_a_kubeflow_step_reads_its_run_id_off_its_output_uris():
    from tfx.types import standard_artifacts

    run, salt = KFP_RUN, KFP_SALT
    args = ["--runner=DataflowRunner", run_label.kfp_run_arg("effnet-smoke")]

    def outputs(*uris):
        artifacts = []
        for uri in uris:
            artifacts.append(standard_artifacts.Examples())
            artifacts[-1].uri = uri
        return {"examples": artifacts}

    # <pipeline root>/<pipeline name>/<run id>/<task>/[<salt>/]<output>; a root may hold a UUID too.
    root = "gs://b/1f2e3d4c-0000-4000-8000-000000000000/root"
    for uri in (
        f"{root}/effnet-smoke/{run}/ImageNetShardGen/{salt}/examples",
        f"{root}/effnet-smoke/{run}/ImageNetShardGen/examples",
    ):
        assert run_label.take_run_id(args, outputs(uri)) == (run, ["--runner=DataflowRunner"])
    assert run_label.labels(run_label.take_run_id(args, outputs(uri))[0]) == {"effnet_run": run}
    # Outputs elsewhere (a local run), or of two runs: no run label, and the clean-up says why.
    for found in (outputs("/tmp/root/ImageNetShardGen/examples/3"), outputs(uri, uri.replace(run, salt)), {}):
        run_id, _ = run_label.take_run_id(args, found)
        assert run_label.labels(run_id) == {}
        with pytest.raises(run_label.NoRunId, match="do not hold one run id after '/effnet-smoke/'"):
            run_label.run_value(run_id)


def test_the_evaluator_and_the_trainer_label_their_jobs_from_their_output_uris_on_kubeflow(monkeypatch):
    """The Kubeflow route of the two executors besides the sharding step (whose job the slow test follows)."""
    from tfx.components.evaluator import executor as evaluator_executor
    from tfx.types import standard_artifacts

    run = KFP_RUN
    model = standard_artifacts.Model()
    model.uri = f"gs://b/root/effnet-smoke/{run}/Trainer/{KFP_SALT}/model"
    config = {"ai_platform_training_args": {"project": PROJECT, "labels": dict(PIPELINE_LABELS)}}
    task_args = ["--runner=DataflowRunner", run_label.kfp_run_arg("effnet-smoke")]
    labelled = runtime_gate.labelled_with_run(
        config, "ai_platform_training_args", task_args, {"model": [model]}
    )
    assert labelled["ai_platform_training_args"]["labels"] == {**PIPELINE_LABELS, run_label.RUN_LABEL: run}

    # The DirectRunner: a DataflowRunner pipeline would check its temp location's bucket on GCS when built.
    args = ["--runner=DirectRunner", f"--project={PROJECT}", run_label.kfp_run_arg("effnet-smoke")]
    made = []  # TFX's evaluator makes its Beam pipeline inside its Do: here it only makes it
    monkeypatch.setattr(
        evaluator_executor.Executor, "Do", lambda self, *unused: made.append(self._make_beam_pipeline())
    )
    evaluator = runtime_gate.EvaluatorExecutor(
        runtime_gate.EvaluatorExecutor.Context(beam_pipeline_args=args)
    )
    evaluator.Do({}, {"evaluation": [model]}, {"eval_config": "{}"})
    (pipeline,) = made
    assert pipeline.options.get_all_options()["labels"] == [f"{run_label.RUN_LABEL}={run}"]
    shutil.rmtree(pipeline.local_tempdir)  # Beam removes a pipeline's temporary directory when it has run


def test_a_compiled_template_is_still_read_and_checked(tmp_path):
    """``--template FILE --submit`` finds the steps under the exit handler's DAG."""
    compile_smoke(tmp_path, "gs://effnet-test-bucket/pipelines")
    template = Template.read(str(tmp_path / "effnet.json"))
    assert template.target.project == PROJECT
    assert template.bound_parameters("Trainer") == {
        "train_epochs": "train_epochs",
        "target_top1": "target_top1",
    }
    with pytest.raises(ValueError, match="train_epochs"):
        template.check_values({"train_epochs": 0})


# ---- the fake Dataflow service holds Dataflow's rules -------------------------------------------------------


def test_dataflow_fake_lists_summaries_by_page_and_refuses_to_cancel_an_ended_job(dataflow):
    from google.api_core import exceptions

    api = dataflow_jobs.DataflowApi.from_args(
        [*dataflow.beam_args(), f"--project={PROJECT}", f"--region={REGION}"]
    )
    ids = [
        dataflow.add_job(PROJECT, REGION, f"job-{i}", {"k": f"v{i}"}, "JOB_STATE_RUNNING") for i in range(5)
    ]
    ended = dataflow.add_job(PROJECT, REGION, "ended", {"k": "v"}, "JOB_STATE_DONE")
    elsewhere = dataflow.add_job(PROJECT, "europe-west4", "elsewhere", {"k": "v0"}, "JOB_STATE_RUNNING")
    listed = list(api.active_jobs())
    assert [job.id for job in listed] == ids  # every page, active jobs only, this region only
    lists = [r for r in dataflow.requests if r["method"] == "GET" and r["path"].endswith("/jobs")]
    assert len(lists) == 3  # pages of at most FakeDataflow.PAGE_LIMIT
    assert all(not job.labels for job in listed)  # a list returns summaries
    assert not api.get(ids[0]).labels and dict(api.get(ids[0], with_labels=True).labels) == {"k": "v0"}
    assert [job.id for job in api.jobs_labelled("k", "v0")] == [ids[0]]
    # An ended job cannot be cancelled: Dataflow refuses, and the client reports the state it ended in.
    assert api.cancel(ended) == "JOB_STATE_DONE"
    assert dataflow.state(ended) == "JOB_STATE_DONE"
    assert api.cancel(ids[1]) == "JOB_STATE_CANCELLED"
    with pytest.raises(exceptions.NotFound, match="Could not find job"):
        api.get(elsewhere)  # jobs are regional


def test_the_dataflow_client_takes_the_credentials_beam_submits_with(tmp_path, monkeypatch, caplog):
    """Application default credentials (an authorized user's file here: nothing is fetched until a call), through
    the impersonation chain Beam's option names; none with --no_auth; anonymous, said in the log, when none are
    found (the service then refuses, and the caller names the permission)."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions
    from google.auth import credentials, impersonated_credentials

    def cloud(*args):
        return PipelineOptions([f"--project={PROJECT}", f"--region={REGION}", *args]).view_as(
            GoogleCloudOptions
        )

    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))  # no gcloud credentials of this machine's
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    for name in ("GCE_METADATA_HOST", "GCE_METADATA_IP"):  # off a cloud machine (the suite may serve one)
        monkeypatch.setenv(name, suite_env.PINNED[name])
    assert isinstance(dataflow_jobs.credentials_of(cloud()), credentials.AnonymousCredentials)
    assert "calling it anonymously" in caplog.text
    user = {"type": "authorized_user", "client_id": "id", "client_secret": "secret", "refresh_token": "token"}
    (tmp_path / "adc.json").write_text(json.dumps(user))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "adc.json"))
    assert dataflow_jobs.credentials_of(cloud()).refresh_token == "token"
    chain = "first@p.iam.gserviceaccount.com,runner@p.iam.gserviceaccount.com"
    impersonated = dataflow_jobs.credentials_of(cloud(f"--impersonate_service_account={chain}"))
    assert isinstance(impersonated, impersonated_credentials.Credentials)
    assert impersonated.service_account_email == "runner@p.iam.gserviceaccount.com"
    assert impersonated._delegates == ["first@p.iam.gserviceaccount.com"]  # noqa: SLF001 - no public reader
    assert isinstance(dataflow_jobs.credentials_of(cloud("--no_auth")), credentials.AnonymousCredentials)


def test_custom_jobs_fake_filters_pages_and_refuses_what_the_service_refuses(tmp_path):
    from google.api_core import exceptions

    jobs = fake_vertex.FakeProjectJobs(str(tmp_path / "custom_jobs.json"), {PROJECT: NUMBER})
    jobs.write(
        [custom_job(str(i), RUN, "JOB_STATE_RUNNING") for i in range(5)]
        + [custom_job("9", RUN, "JOB_STATE_FAILED")]
    )
    client = jobs.client_class()(client_options={"api_endpoint": f"{REGION}-aiplatform.googleapis.com"})
    parent = f"projects/{PROJECT}/locations/{REGION}"  # by the project's id: answered with its number
    pager = client.list_custom_jobs(
        request={"parent": parent, "filter": f'labels.{run_label.RUN_LABEL}="{RUN}"'}
    )
    assert [job.name.rsplit("/", 1)[1] for job in pager] == [
        "0",
        "1",
        "2",
        "3",
        "4",
        "9",
    ]  # 3 pages, by the pager
    failed = client.list_custom_jobs(request={"parent": parent, "filter": 'state="JOB_STATE_FAILED"'})
    assert [job.state.name for job in failed] == ["JOB_STATE_FAILED"]
    with pytest.raises(
        exceptions.InvalidArgument
    ):  # a filter the fake does not implement is refused, not guessed
        list(
            client.list_custom_jobs(
                request={"parent": parent, "filter": 'create_time>"2021-05-18T00:00:00Z"'}
            )
        )
    with pytest.raises(exceptions.InvalidArgument):  # another region's endpoint
        list(client.list_custom_jobs(request={"parent": f"projects/{PROJECT}/locations/europe-west4"}))
    name = f"projects/{NUMBER}/locations/{REGION}/customJobs/"
    with pytest.raises(exceptions.FailedPrecondition):
        client.cancel_custom_job(name=name + "9")
    client.cancel_custom_job(name=f"projects/{PROJECT}/locations/{REGION}/customJobs/0")
    assert jobs.read()[0]["state"] == "JOB_STATE_CANCELLING"
    cancelled = client.get_custom_job(name=name + "0")
    assert cancelled.state.name == "JOB_STATE_CANCELLED" and cancelled.error.code == 1


# ---- the clean-up, in this process ------------------------------------------------------------------------------


@pytest.fixture
def project_jobs(tmp_path, monkeypatch):
    """The project's custom jobs, served by the SDK's ``JobServiceClient`` in this process."""
    from google.cloud.aiplatform import gapic

    jobs = fake_vertex.FakeProjectJobs(str(tmp_path / "custom_jobs.json"), {PROJECT: NUMBER})
    jobs.write([])
    monkeypatch.setattr(gapic, "JobServiceClient", jobs.client_class())
    monkeypatch.setattr(fake_vertex, "FAULTS", None)
    return jobs


def test_clean_up_cancels_the_runs_jobs_left_running_and_no_other(dataflow, project_jobs):
    project_jobs.write(
        [
            custom_job("1", RUN, "JOB_STATE_SUCCEEDED"),  # the tuner's: ended
            custom_job("2", OTHER_RUN, "JOB_STATE_RUNNING"),
            custom_job("3", RUN, "JOB_STATE_RUNNING"),  # the trainer's, its task killed
            custom_job("4", RUN, "JOB_STATE_PENDING"),  # a retried task's
            custom_job("5", RUN, "JOB_STATE_RUNNING", location="europe-west4"),
        ]
    )
    labels = {**PIPELINE_LABELS, run_label.RUN_LABEL: RUN}
    sharding = dataflow.add_job(PROJECT, REGION, "sharding", labels, "JOB_STATE_RUNNING")
    evaluation = dataflow.add_job(PROJECT, REGION, "evaluator", labels, "JOB_STATE_PENDING")
    done = dataflow.add_job(PROJECT, REGION, "done", labels, "JOB_STATE_DONE")
    other = dataflow.add_job(
        PROJECT, REGION, "other", {**labels, run_label.RUN_LABEL: OTHER_RUN}, "JOB_STATE_RUNNING"
    )
    unlabelled = dataflow.add_job(PROJECT, REGION, "someone-elses", {}, "JOB_STATE_RUNNING")

    report = run_cleanup.clean_up(PROJECT, REGION, RUN, dataflow.beam_args())

    assert not report.failures
    name = f"projects/{NUMBER}/locations/{REGION}/customJobs/"
    assert report.custom_jobs == [(name + "3", "JOB_STATE_CANCELLED"), (name + "4", "JOB_STATE_CANCELLED")]
    assert {job["name"]: job["state"] for job in project_jobs.read()} == {
        name + "1": "JOB_STATE_SUCCEEDED",
        name + "2": "JOB_STATE_RUNNING",
        name + "3": "JOB_STATE_CANCELLED",
        name + "4": "JOB_STATE_CANCELLED",
        f"projects/{NUMBER}/locations/europe-west4/customJobs/5": "JOB_STATE_RUNNING",
    }
    assert sorted(dataflow.cancel_requests()) == sorted([sharding, evaluation])
    assert {job: dataflow.state(job) for job in (sharding, evaluation, done, other, unlabelled)} == {
        sharding: "JOB_STATE_CANCELLED",
        evaluation: "JOB_STATE_CANCELLED",
        done: "JOB_STATE_DONE",
        other: "JOB_STATE_RUNNING",
        unlabelled: "JOB_STATE_RUNNING",
    }
    summary = report.summary()
    assert summary.startswith(f"run {RUN}: cancelled 2 Vertex AI custom jobs ({name}3: JOB_STATE_CANCELLED, ")
    assert f"2 Dataflow jobs ({sharding} sharding: JOB_STATE_CANCELLED" in summary and "\n" not in summary
    # A second clean-up finds nothing left.
    assert run_cleanup.clean_up(PROJECT, REGION, RUN, dataflow.beam_args()).summary() == (
        f"run {RUN}: no job left running"
    )


def test_clean_up_refuses_a_run_id_its_orchestrator_did_not_replace(dataflow, project_jobs):
    """A label made of the placeholder would name every run: nothing is cancelled, the task fails in one line."""
    project_jobs.write([custom_job("1", RUN, "JOB_STATE_RUNNING")])
    with pytest.raises(run_label.NoRunId, match=r"\{\{\$\.pipeline_job_uuid\}\}"):
        run_cleanup.clean_up(PROJECT, REGION, run_label.RUN_ID_PLACEHOLDER, dataflow.beam_args())
    assert project_jobs.read()[0]["state"] == "JOB_STATE_RUNNING" and not dataflow.requests
    assert run_label.labels(run_label.RUN_ID_PLACEHOLDER) == {}  # a step's job then carries no run label


def test_a_clean_up_that_may_not_list_says_which_permission_and_never_fails_its_run(
    dataflow, project_jobs, monkeypatch, capsys, caplog
):
    """The service account may not list custom jobs (403, persistent): the Dataflow jobs are still cancelled; the
    task logs the permission it lacked and succeeds, so the run's outcome stays its steps' (a failed clean-up
    would fail a good run). Transient faults on the way are retried."""
    monkeypatch.setattr(fake_vertex, "FAULTS", faults.FaultSchedule({"list_custom_jobs": ["403*"]}))
    fake_vertex.fast_retries(monkeypatch.setattr)
    dataflow.faults = faults.FaultSchedule({"GET jobs": ["503", "drop"], "PUT jobs/{id}": ["429"]})
    job = dataflow.add_job(PROJECT, REGION, "sharding", {run_label.RUN_LABEL: RUN}, "JOB_STATE_RUNNING")
    args = [f"--effnet_run={RUN}", *dataflow.beam_args()]  # the task's args, the run's id filled in
    executor = run_cleanup.Executor(run_cleanup.Executor.Context(beam_pipeline_args=args))
    executor.Do({}, {}, {"project": PROJECT, "region": REGION})  # does not raise
    (summary,) = capsys.readouterr().out.splitlines()
    assert summary.startswith(
        f"run {RUN}: cancelled 1 Dataflow job ({job} sharding: JOB_STATE_CANCELLED); could not"
    )
    assert (
        f"could not cancel: listing the Vertex AI custom jobs of projects/{PROJECT}/locations/{REGION}: 403 "
        in summary
    )
    assert summary.endswith("(the service account lacks aiplatform.customJobs.list (roles/aiplatform.user))")
    assert dataflow.state(job) == "JOB_STATE_CANCELLED" and dataflow.cancel_requests() == [job, job]
    assert not any(dataflow.faults.plan.values())
    assert [r.levelname for r in caplog.records if r.message == summary] == ["ERROR"]


def test_a_run_id_left_unfilled_is_an_error_in_the_log_not_a_failed_task(dataflow, project_jobs, capsys):
    """A backend that does not fill the exit task's run id (Kubeflow before 2.5.0; refused at submission): nothing is
    cancelled, the log says why, the task does not fail."""
    args = [f"--effnet_run={RUN}", *dataflow.beam_args()]
    executor = run_cleanup.Executor(run_cleanup.Executor.Context(beam_pipeline_args=args))
    executor.Do({}, {}, {"project": PROJECT, "region": REGION, "run_id": run_label.RUN_ID_PLACEHOLDER})
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("no clean-up: no run id: '{{$.pipeline_job_uuid}}' is not one")
    assert not dataflow.requests


def test_the_run_label_goes_on_the_training_job_and_the_evaluators_dataflow_job():
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    config = {
        "ai_platform_training_args": {"project": PROJECT, "labels": dict(PIPELINE_LABELS)},
        "ai_platform_vertex_region": REGION,
    }
    task_args = ["--runner=DataflowRunner", f"--effnet_run={RUN}"]
    labelled = runtime_gate.labelled_with_run(config, "ai_platform_training_args", task_args)
    assert labelled["ai_platform_training_args"]["labels"] == {**PIPELINE_LABELS, run_label.RUN_LABEL: RUN}
    unchanged = config["ai_platform_training_args"]["labels"]
    assert unchanged == PIPELINE_LABELS  # the compiled config is left as it was
    # Outside a compiled Vertex pipeline, or with the placeholder left as it is, the job has no run label.
    for args in ([], ["--effnet_run={{$.pipeline_job_uuid}}"]):
        labels = runtime_gate.labelled_with_run(config, "ai_platform_training_args", args)
        assert labels["ai_platform_training_args"]["labels"] == PIPELINE_LABELS

    # The DirectRunner: a DataflowRunner pipeline would check its temp location's bucket on GCS when built.
    args = [
        "--runner=DirectRunner",
        f"--project={PROJECT}",
        f"--region={REGION}",
        "--labels=effnet-preset=smoke",
        f"--effnet_run={RUN}",
    ]
    executor = runtime_gate.EvaluatorExecutor(runtime_gate.EvaluatorExecutor.Context(beam_pipeline_args=args))
    pipeline = executor._make_beam_pipeline()
    assert isinstance(pipeline, dataflow_jobs.StoppablePipeline)
    options = pipeline.options.get_all_options(retain_unknown_options=True)
    assert "effnet_run" not in options  # taken out of Beam's options, put on the job as a label
    labels = pipeline.options.view_as(GoogleCloudOptions).labels
    assert "effnet-preset=smoke" in labels and f"{run_label.RUN_LABEL}={RUN}" in labels
    shutil.rmtree(pipeline.local_tempdir)  # Beam removes a pipeline's temporary directory when it has run


# ---- a Beam step stopped while its Dataflow job runs ----------------------------------------------------------

# A Beam step as TFX's executors run one (``with pipeline: ...``), on the Evaluator's executor and its Beam options.
BEAM_STEP = r"""
import sys
import apache_beam as beam
from components import runtime_gate
executor = runtime_gate.EvaluatorExecutor(runtime_gate.EvaluatorExecutor.Context(beam_pipeline_args=sys.argv[1:]))
with executor._make_beam_pipeline() as pipeline:
    _ = pipeline | beam.Create([1, 2, 3]) | beam.Map(lambda x: x + 1)
"""


def _wait_for(predicate, what: str, process, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if process.poll() is not None:
            raise AssertionError(f"the task ended (exit {process.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout:.0f} s")
        time.sleep(0.2)


def _start_beam_step(dataflow, bucket, emulator, tmp_path):
    """The Beam step as a process of its own, its output in ``tmp_path/step.log``. Beam's Dataflow stager leaves
    the submission's dependency list and its requirements cache in the temporary directory: here the test's."""
    (tmp_path / "tmp").mkdir()
    args = [
        "--runner=DataflowRunner", f"--project={PROJECT}", f"--region={REGION}", f"--temp_location={bucket}/beam-tmp",
        f"--sdk_container_image={IMAGE}", "--sdk_location=container", f"--effnet_run={RUN}", *dataflow.beam_args(),
    ]  # fmt: skip
    env = {
        **os.environ,
        "STORAGE_EMULATOR_HOST": emulator.host,
        "PYTHONPATH": kfp_launcher.REPO_DIR,
        "TMPDIR": str(tmp_path / "tmp"),
    }
    with open(tmp_path / "step.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-c", BEAM_STEP, *args], cwd=kfp_launcher.REPO_DIR, env=env, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip


@pytest.mark.slow
def test_sigterm_while_the_job_runs_cancels_it(dataflow, gcs_bucket, tmp_path):
    emulator, bucket = gcs_bucket
    log = tmp_path / "step.log"
    step = _start_beam_step(dataflow, bucket, emulator, tmp_path)
    _wait_for(
        lambda: any(job["currentState"] == "JOB_STATE_RUNNING" for job in dataflow.jobs.values()), "job", step
    )
    (job_id,) = dataflow.jobs
    step.send_signal(signal.SIGTERM)
    assert step.wait(timeout=60) != 0
    assert dataflow.cancel_requests() == [job_id] and dataflow.state(job_id) == "JOB_STATE_CANCELLED"
    assert dataflow.jobs[job_id]["labels"][run_label.RUN_LABEL] == RUN
    text = log.read_text(errors="replace")
    assert f"Dataflow job {job_id} is JOB_STATE_CANCELLED" in text
    assert "TaskStopped: the pipeline task received SIGTERM" in text


@pytest.mark.slow
def test_sigterm_while_the_job_is_submitted_cancels_it_once_it_exists(dataflow, gcs_bucket, tmp_path):
    """The signal arrives before Dataflow has answered the create request: it is held, then the job is cancelled."""
    emulator, bucket = gcs_bucket
    dataflow.create_delay_s = 3.0
    log = tmp_path / "step.log"
    step = _start_beam_step(dataflow, bucket, emulator, tmp_path)
    _wait_for(lambda: any(r["method"] == "POST" for r in dataflow.requests), "create request", step)
    step.send_signal(signal.SIGTERM)
    assert step.wait(timeout=60) != 0
    (job_id,) = dataflow.jobs
    assert dataflow.cancel_requests() == [job_id] and dataflow.state(job_id) == "JOB_STATE_CANCELLED"
    assert "TaskStopped: the pipeline task received SIGTERM" in log.read_text(errors="replace")


@pytest.mark.slow
def test_ctrl_c_on_the_sharding_command_cancels_its_dataflow_job_and_leaves_no_temporary_file(
    dataflow, gcs_bucket, clean_archives, tmp_path
):
    """``python -m beam_preprocess --runner DataflowRunner`` from a workstation: Ctrl-C while the job runs cancels
    it, the command ends with one line naming the job (no traceback), and Beam's submission files are gone."""
    emulator, bucket = gcs_bucket
    train, val = gcs_emulator.upload_archives(f"{bucket}/cli-inputs", clean_archives)
    (tmp_path / "tmp").mkdir()
    args = [
        "--train-archive", train, "--val-archive", val, "--output-dir", f"{bucket}/cli-shards",
        "--runner=DataflowRunner", f"--project={PROJECT}", f"--region={REGION}", f"--temp_location={bucket}/beam-tmp",
        f"--sdk_container_image={IMAGE}", "--sdk_location=container", *dataflow.beam_args(),
    ]  # fmt: skip
    env = {**os.environ, "STORAGE_EMULATOR_HOST": emulator.host, "TMPDIR": str(tmp_path / "tmp")}
    with open(tmp_path / "cli.log", "wb") as log:
        command = subprocess.Popen(
            [sys.executable, "-m", "beam_preprocess", *args], cwd=kfp_launcher.REPO_DIR, env=env, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    _wait_for(
        lambda: any(job["currentState"] == "JOB_STATE_RUNNING" for job in dataflow.jobs.values()),
        "job",
        command,
    )
    (job_id,) = dataflow.jobs
    # The submission's files went with their directory; what is there is the command's own log (until it ends).
    assert [p.name for p in (tmp_path / "tmp").iterdir() if not p.match("effnet-*.log")] == []
    command.send_signal(signal.SIGINT)
    assert command.wait(timeout=60) == 130
    assert dataflow.state(job_id) == "JOB_STATE_CANCELLED"
    text = (tmp_path / "cli.log").read_text(errors="replace")
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert errors[0] == (
        f"error: the pipeline task received SIGINT: Dataflow job {job_id} is JOB_STATE_CANCELLED "
        f"({dataflow_jobs.CONSOLE.format(region=REGION, job=job_id, project=PROJECT)})"
    )
    assert "Traceback" not in text and len(errors) == 2  # the job, then what was left under --output-dir
    assert not list((tmp_path / "tmp").iterdir())


# ---- the compiled steps, run as their containers run them -----------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "suffix, run",
    [(".json", RUN), (".yaml", KFP_RUN)],
    ids=["vertex", "kubeflow"],
)
def test_a_failed_run_leaves_no_job_running(dataflow, gcs_bucket, clean_archives, tmp_path, suffix, run):
    """The sharding step's task is killed outright (SIGKILL: evicted, out of memory) while its Dataflow job runs,
    and the training job outlives its killed task: the exit handler, run as its container, cancels both by the
    run's label, and leaves another run's jobs alone. On Vertex the run's id comes in the tasks' arguments; on
    Kubeflow, in the sharding step's output URIs and the exit handler's parameter."""
    emulator, bucket = gcs_bucket
    archives = gcs_emulator.upload_archives(f"{bucket}/cleanup-inputs", clean_archives)
    root = f"{bucket}/cleanup-root"
    job = compile_smoke(tmp_path, root, *archives, suffix=suffix)
    parameters = kfp_launcher.runtime_parameters(job)
    # The sharding step is killed outright: what Beam's Dataflow stager put in the temporary directory stays in
    # the test's.
    (tmp_path / "tmp").mkdir()
    env = {"STORAGE_EMULATOR_HOST": emulator.host, "TMPDIR": str(tmp_path / "tmp")}
    scratch = str(tmp_path / "launcher")
    sharding = kfp_launcher.start_task(
        job, "ImageNetShardGen", root, scratch, parameters, env=env, run_id=run, dataflow=dataflow.beam_args()
    )
    # Killed once its job runs (the step has read it back from Dataflow), not merely once it was submitted.
    _wait_for(
        lambda: any(job["currentState"] == "JOB_STATE_RUNNING" for job in dataflow.jobs.values()),
        "running Dataflow job",
        sharding.process,
    )
    sharding.process.kill()
    sharding.process.wait()
    (sharding_job,) = dataflow.jobs
    labels = dataflow.jobs[sharding_job]["labels"]
    assert {key: labels[key] for key in (*PIPELINE_LABELS, run_label.RUN_LABEL)} == {
        **PIPELINE_LABELS,
        run_label.RUN_LABEL: run,
    }
    assert dataflow.state(sharding_job) == "JOB_STATE_RUNNING"  # nothing cancelled it
    other = dataflow.add_job(
        PROJECT, REGION, "other", {**labels, run_label.RUN_LABEL: OTHER_RUN}, "JOB_STATE_RUNNING"
    )
    jobs_file = str(tmp_path / "custom_jobs.json")
    project_jobs = fake_vertex.FakeProjectJobs(jobs_file, {PROJECT: NUMBER})
    project_jobs.write(
        [custom_job("7", run, "JOB_STATE_RUNNING"), custom_job("8", OTHER_RUN, "JOB_STATE_RUNNING")]
    )

    cleanup = kfp_launcher.run_task(
        job, run_cleanup.STEP_ID, root, scratch, parameters, run_id=run, dataflow=dataflow.beam_args(),
        wrapper=fake_vertex.project_jobs_wrapper(str(tmp_path / "vertex"), jobs_file),
    )  # fmt: skip

    assert (
        dataflow.state(sharding_job) == "JOB_STATE_CANCELLED" and dataflow.state(other) == "JOB_STATE_RUNNING"
    )
    name = f"projects/{NUMBER}/locations/{REGION}/customJobs/"
    assert {job["name"]: job["state"] for job in project_jobs.read()} == {
        name + "7": "JOB_STATE_CANCELLED",
        name + "8": "JOB_STATE_RUNNING",
    }
    with open(cleanup.log_path) as f:
        log = f.read()
    assert (
        f"run {run}: cancelled 1 Vertex AI custom job ({name}7: JOB_STATE_CANCELLED) and 1 Dataflow job "
        f"({sharding_job} " in log
    )
    assert pipeline_tasks(kfp_launcher.pipeline_spec(job))[run_cleanup.STEP_ID]["triggerPolicy"][
        "strategy"
    ] == ("ALL_UPSTREAM_TASKS_COMPLETED")


def test_the_kubeflow_fake_models_what_its_backend_version_decides(tmp_path):
    """The facts read in kubeflow/pipelines' backend at its release tags, as the fake server and the launcher
    model them: the exit task's run id filled from 2.5.0 (before, the literal placeholder, which the clean-up
    refuses), the run's outcome the exit task's before 2.4.0, a task's retry policy applied in tfx-dag from 2.14.0."""
    spec = compile_smoke(tmp_path, "gs://b/p", suffix=".yaml")
    parameters = kfp_launcher.runtime_parameters(spec)
    values = {}
    for version in ((2, 3, 0), (2, 5, 0)):
        executor_input = kfp_launcher.build_executor_input(
            spec,
            run_cleanup.STEP_ID,
            "gs://b/p",
            parameters,
            {},
            "out.json",
            run_id=KFP_RUN,
            backend_version=version,
        )
        values[version] = executor_input["inputs"]["parameterValues"][run_cleanup.RUN_ID_KEY]
    assert values == {(2, 3, 0): run_label.RUN_ID_PLACEHOLDER, (2, 5, 0): KFP_RUN}
    with pytest.raises(run_label.NoRunId):
        run_label.run_value(values[(2, 3, 0)])
    old, new, newest = (fake_kfp_server.FakeKfpServer(version=v) for v in ("2.3.0", "2.5.0", "2.14.0"))
    try:
        assert (
            old.run_outcome("FAILED", "SUCCEEDED") == "SUCCEEDED"
        )  # #10917: a failed run reported succeeded
        assert (
            new.run_outcome("FAILED", "SUCCEEDED") == "FAILED"
            and new.run_outcome("SUCCEEDED", "FAILED") == "SUCCEEDED"
        )
        assert not old.fills_run_id_placeholder and new.fills_run_id_placeholder
        # The compiled retry policy sits on tasks inside tfx-dag: applied from 2.14.0 only.
        retried = [name for name, task in pipeline_tasks(spec).items() if "retryPolicy" in task]
        assert set(retried) == {"ImageNetShardGen", "Trainer", "Evaluator"}
        assert not set(retried) & set(spec["root"]["dag"]["tasks"])
        assert not new.applies_retry_policy(in_root_dag=False) and newest.applies_retry_policy(
            in_root_dag=False
        )
    finally:
        for server in (old, new, newest):
            server.stop()
