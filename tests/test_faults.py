"""The fault tier: every cloud step of the compiled pipeline, end to end, under the services' injected faults.

Each step runs through the entry point its container calls (the executors' ``Do``, a Beam step's pipeline on the
DataflowRunner in a process of its own) against the fakes of ``tests/``, every one of which takes a fault schedule
(``tests/faults.py``): status codes (429, 500, 502, 503, 504), dropped connections, answers slower than the
call's deadline, answers lost after the service acted. Under transient faults each step must succeed with one job
(none where it starts none), nothing cancelled, nothing left running; under a persistent fault it must end with
one clear line and leave nothing running. The retry policy's waits are made short here (``fake_vertex.FAST_RETRY``:
the policy as written, its backoff bounds and the refusal window scaled down), as polls are.

The tier's figures (faults injected, steps run, jobs started and cancelled) are summed in ``FIGURES`` and printed
when the module ends (``pytest -s -m faults``); the training task killed mid-job and retried is in
``tests/test_vertex_steps.py``, the submissions' faults in ``tests/test_vertex.py``.
"""

import json
import os
import subprocess
import sys
import time

import fake_vertex
import faults
import kfp_launcher
import pytest
from fake_dataflow import FakeDataflow
from fake_vertex_registry import FakeModelRegistry
from google.api_core import exceptions
from tfx.types import standard_artifacts

from components import run_cleanup, run_label, runtime_gate, vertex_pusher, vertex_training

pytestmark = pytest.mark.faults

PROJECT, NUMBER, REGION = "effnet-test-project", "123456789012", "us-central1"
IMAGE = "us-docker.pkg.dev/effnet-test-project/effnet/pipeline@sha256:" + "a" * 64
RUN = "4f1c2a3b-run-one"
# The transient faults each call of a Vertex job service meets.
VERTEX_TRANSIENT = {
    "list_custom_jobs": ["503", "429", "drop"],
    "create_custom_job": ["slow:2"],  # served, its answer too late: found by its labels
    "get_custom_job": ["503", "429", "500", "drop", "slow:2", "504"],
}
FIGURES = {"steps": 0, "faults injected": 0, "jobs started": 0, "jobs cancelled": 0}


@pytest.fixture(scope="module", autouse=True)
def figures():
    yield FIGURES
    print(f"\nfault tier: {json.dumps(FIGURES)}")


def count(injected: int, started: int, cancelled: int) -> None:
    FIGURES["steps"] += 1
    FIGURES["faults injected"] += injected
    FIGURES["jobs started"] += started
    FIGURES["jobs cancelled"] += cancelled


@pytest.fixture
def vertex(monkeypatch, tmp_path):
    records = tmp_path / "vertex"
    records.mkdir()
    fake_vertex.install_in_process(monkeypatch, str(records), run_replicas=False)  # the calls are the subject
    yield records
    fake_vertex.stop_all(str(records))


def jobs_of(records) -> tuple[int, int]:
    """(jobs created, jobs cancelled) in a Vertex fake's records."""
    made = [p for p in records.glob("custom_job-*.json") if p.name.count(".") == 1]
    return len(made), len(list(records.glob("custom_job-*.cancel.json")))


def compiled_step(tmp_path, task: str, *flags) -> dict:
    """A task's constant parameters in the compiled Vertex PipelineJob (the smoke preset on CPU machines)."""
    from pipeline import kubeflow_v2_runner
    from pipeline.template import pipeline_tasks

    output = tmp_path / "effnet.json"
    argv = [
        "--output", str(output), "--project", PROJECT, "--region", REGION, "--pipeline-root", "gs://b/p",
        "--image", IMAGE, "--accelerator", "cpu", "--preset", "smoke", "--train-archive", "gs://b/t.tar",
        "--val-archive", "gs://b/v.tar", *flags,
    ]  # fmt: skip
    assert kubeflow_v2_runner.main(argv) == 0
    parameters = pipeline_tasks(json.loads(output.read_text())["pipelineSpec"])[task]["inputs"]["parameters"]
    return {k: v["runtimeValue"]["constant"] for k, v in parameters.items() if "runtimeValue" in v}


def examples(digit_shards) -> standard_artifacts.Examples:
    artifact = standard_artifacts.Examples()
    artifact.uri = digit_shards["uri"]
    artifact.split_names = '["train", "validation"]'
    return artifact


@pytest.mark.parametrize("task", ["Trainer", "Tuner"])
def test_a_vertex_job_step_under_transient_faults_runs_one_job_and_cancels_nothing(
    vertex, tmp_path, monkeypatch, digit_shards, task
):
    schedule = faults.FaultSchedule(VERTEX_TRANSIENT)
    monkeypatch.setattr(fake_vertex, "FAULTS", schedule)
    if task == "Trainer":
        properties = compiled_step(tmp_path, task)
        output = standard_artifacts.Model()
        outputs = {"model": [output]}
        executor = runtime_gate.VertexTrainerExecutor(
            runtime_gate.VertexTrainerExecutor.Context(extra_flags=[f"--effnet_run={RUN}"])
        )
    else:
        from components import vertex_tuner  # TFX's Vertex tuner loads the Vertex AI SDK: not at collection

        properties = compiled_step(tmp_path, task, "--tune", "--tune-parallel-trials", "1")
        output = standard_artifacts.HyperParameters()
        outputs = {"best_hyperparameters": [output]}
        executor = vertex_tuner.VertexTunerExecutor(
            vertex_tuner.VertexTunerExecutor.Context(extra_flags=[f"--effnet_run={RUN}"])
        )
    output.uri = str(tmp_path / "root" / task / "output")
    executor.Do({"examples": [examples(digit_shards)]}, outputs, properties)
    started, cancelled = jobs_of(vertex)
    assert (started, cancelled) == (1, 0)
    assert not any(schedule.plan.values())  # every fault met
    (record,) = [json.loads(p.read_text()) for p in vertex.glob("custom_job-1.json")]
    assert record["custom_job"]["labels"][run_label.RUN_LABEL] == RUN
    count(len(schedule.injected), started, cancelled)


def test_a_vertex_job_step_under_a_persistent_refusal_ends_in_one_line_and_leaves_nothing_running(
    vertex, monkeypatch, tmp_path
):
    monkeypatch.setattr(fake_vertex, "RUN_REPLICAS", True)
    schedule = faults.FaultSchedule({"get_custom_job": ["403*"]})
    monkeypatch.setattr(fake_vertex, "FAULTS", schedule)
    labels = {vertex_training.TASK_LABEL: "trainer", vertex_training.OUTPUTS_LABEL: "o" * 32}
    pool = {
        "machine_spec": {"machine_type": "n1-standard-8"},
        "replica_count": 1,
        "container_spec": {"image_uri": IMAGE, "command": ["python", "-c", "import time; time.sleep(120)"]},
    }
    request = vertex_training.JobRequest(
        PROJECT,
        REGION,
        {"display_name": "t", "labels": labels, "job_spec": {"worker_pool_specs": [pool]}},
        labels,
    )
    with pytest.raises(vertex_training.TrainingJobFailed) as failure:
        vertex_training.run_job(request)
    assert "\n" not in str(failure.value) and ": refused for 2 s: PermissionDenied: 403" in str(failure.value)
    started, cancelled = jobs_of(vertex)
    assert (started, cancelled) == (1, 1)
    (job,) = fake_vertex._JOBS.values()
    assert all(replica.poll() is not None for replica in job.replicas.values())  # nothing left running
    count(len(schedule.injected), started, cancelled)


def test_the_push_step_under_transient_faults_makes_one_version_and_one_deployment(monkeypatch, tmp_path):
    fake_vertex.fast_retries(monkeypatch.setattr)
    registry = FakeModelRegistry().install(monkeypatch)
    registry.faults = faults.FaultSchedule(
        {
            "list_models": ["503", "drop"],
            "list_model_versions": ["429"],
            "upload_model": ["500", "lost"],
            "list_endpoints": ["503"],
            "create_endpoint": ["lost"],
            "get_endpoint": ["504"],
            "deploy_model": ["lost"],
        }
    )
    target = vertex_pusher.PushTarget(
        project="p", region=REGION, pipeline="effnet-smoke", endpoint="serving",
        serving_image="us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest", labels={"effnet-pipeline": "effnet-smoke"},
    )  # fmt: skip
    pushed = vertex_pusher.push(target, "gs://b/push/1", "run-1")
    assert not any(registry.faults.plan.values())
    assert len(registry.models[pushed.model]) == 1 and len(registry.endpoints) == 1
    assert len(registry.endpoints[pushed.endpoint].deployed_models) == 1
    count(len(registry.faults.injected), 0, 0)


@pytest.fixture
def dataflow():
    fake = FakeDataflow()
    yield fake
    fake.stop()


def test_the_clean_up_under_transient_faults_cancels_every_job_of_its_run(dataflow, monkeypatch, tmp_path):
    from google.cloud.aiplatform import gapic

    fake_vertex.fast_retries(monkeypatch.setattr)
    jobs = fake_vertex.FakeProjectJobs(str(tmp_path / "custom_jobs.json"), {PROJECT: NUMBER})
    name = f"projects/{NUMBER}/locations/{REGION}/customJobs/"
    jobs.write(
        [
            {"name": name + str(n), "display_name": f"j{n}", "labels": {run_label.RUN_LABEL: RUN}, "state": "JOB_STATE_RUNNING",
             "job_spec": {"worker_pool_specs": [{"machine_spec": {"machine_type": "n1-standard-8"}, "replica_count": 1}]}}
            for n in (1, 2)
        ]
    )  # fmt: skip
    monkeypatch.setattr(gapic, "JobServiceClient", jobs.client_class())
    vertex_faults = faults.FaultSchedule(
        {"list_custom_jobs": ["503", "drop"], "cancel_custom_job": ["429", "500"]}
    )
    monkeypatch.setattr(fake_vertex, "FAULTS", vertex_faults)
    dataflow.faults = faults.FaultSchedule(
        {"GET jobs": ["503", "drop"], "GET jobs/{id}": ["500", "slow:2"], "PUT jobs/{id}": ["429", "drop"]}
    )
    flow = [
        dataflow.add_job(PROJECT, REGION, f"step{n}", {run_label.RUN_LABEL: RUN}, "JOB_STATE_RUNNING")
        for n in (1, 2)
    ]
    report = run_cleanup.clean_up(PROJECT, REGION, RUN, dataflow.beam_args())
    assert not report.failures, report.summary()
    assert {job["state"] for job in jobs.read()} == {"JOB_STATE_CANCELLED"}
    assert {dataflow.state(job) for job in flow} == {"JOB_STATE_CANCELLED"}
    assert not any(vertex_faults.plan.values()) and not any(dataflow.faults.plan.values())
    count(len(vertex_faults.injected) + len(dataflow.faults.injected), 0, 4)


# ---- a Beam step on Dataflow, as a process of its own ----------------------------------------------------------

# The Evaluator's executor's Beam pipeline (the ``StoppablePipeline`` the sharding step runs too) on the
# DataflowRunner, the retry policy's waits short as in the fakes' task processes.
BEAM_STEP = r"""
import sys
import apache_beam as beam
import fake_vertex
from tfx.types import standard_artifacts
from components import runtime_gate
from effnet_common import dataflow_jobs
fake_vertex.fast_retries()
# A followed job's state is read as often as the fake's jobs are (they change at once; Dataflow's take minutes).
dataflow_jobs.FOLLOW_POLL_SECONDS = fake_vertex.FAST_POLL_SECONDS
executor = runtime_gate.EvaluatorExecutor(runtime_gate.EvaluatorExecutor.Context(beam_pipeline_args=sys.argv[1:]))
evaluation = standard_artifacts.ModelEvaluation()
evaluation.uri = "gs://b/p/Evaluator/evaluation/1"  # the execution's outputs: what names its job
executor.take_run_outputs({"evaluation": [evaluation]})
with executor._make_beam_pipeline() as pipeline:
    _ = pipeline | beam.Create([1, 2, 3]) | beam.Map(lambda x: x + 1)
"""


def _wait_for(predicate, what: str, process, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if process.poll() is not None:
            raise AssertionError(f"the step ended (exit {process.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout:.0f} s")
        time.sleep(0.2)


def _beam_step(dataflow, gcs_bucket, tmp_path) -> subprocess.Popen:
    """The Beam step as a process of its own, its output in ``tmp_path/step.log``, its TMPDIR ``tmp_path/tmp``."""
    emulator, bucket = gcs_bucket
    (tmp_path / "tmp").mkdir(parents=True)
    args = [
        "--runner=DataflowRunner", f"--project={PROJECT}", f"--region={REGION}", f"--temp_location={bucket}/beam-tmp",
        f"--sdk_container_image={IMAGE}", "--sdk_location=container", f"--effnet_run={RUN}", *dataflow.beam_args(),
    ]  # fmt: skip
    env = {
        **os.environ,
        "STORAGE_EMULATOR_HOST": emulator.host,
        "PYTHONPATH": os.pathsep.join([kfp_launcher.REPO_DIR, kfp_launcher.TESTS_DIR]),
        "TMPDIR": str(tmp_path / "tmp"),
    }
    with open(tmp_path / "step.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-c", BEAM_STEP, *args], cwd=kfp_launcher.REPO_DIR, env=env, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip


@pytest.mark.slow
def test_a_beam_step_under_a_persistent_refusal_ends_in_one_line_and_cancels_its_job(
    dataflow, gcs_bucket, tmp_path
):
    dataflow.faults = faults.FaultSchedule({"GET jobs/{id}": ["403*"]})
    step = _beam_step(dataflow, gcs_bucket, tmp_path)
    assert step.wait(timeout=240) != 0
    (job_id,) = dataflow.jobs
    assert dataflow.cancel_requests() == [job_id]
    assert dataflow.jobs[job_id]["currentState"] in ("JOB_STATE_CANCELLING", "JOB_STATE_CANCELLED")
    log = (tmp_path / "step.log").read_text(errors="replace")
    assert f"Unanswered: reading Dataflow job {job_id}: refused for 2 s: Forbidden: 403 GET " in log
    count(len(dataflow.faults.injected), 1, 1)


@pytest.mark.slow
def test_a_beam_step_killed_mid_job_and_met_by_transient_faults_follows_its_one_job_to_the_end(
    dataflow, gcs_bucket, tmp_path
):
    """The create's answer lost (Beam's client sends it again with its request id; Dataflow answers with the job it
    made); the task killed outright while its job runs (its pod evicted) and started again, the same execution:
    its create is answered with the running job of its name, which it follows; reads of the job fail on the way (a
    403 that Beam's waiter does not retry: the step reads the job itself and waits on it again), messages fail.
    One job, followed until it is done, nothing cancelled, no temporary file left by the step that ended."""
    dataflow.faults = faults.FaultSchedule(
        {
            "POST jobs": ["lost"],
            "GET jobs/{id}": ["503", "drop", "403", "500"],
            "GET jobs/{id}/messages": ["503"],
        }
    )
    first = _beam_step(dataflow, gcs_bucket, tmp_path / "first")
    _wait_for(
        lambda: any(j["currentState"] == "JOB_STATE_RUNNING" for j in dataflow.jobs.values()), "job", first
    )
    first.kill()
    first.wait()
    (job_id,) = dataflow.jobs
    retried = _beam_step(dataflow, gcs_bucket, tmp_path / "retried")
    log = tmp_path / "retried" / "step.log"
    _wait_for(
        lambda: f"following Dataflow job {job_id}" in log.read_text(errors="replace"),
        "the job followed",
        retried,
    )
    _wait_for(lambda: not dataflow.faults.plan["GET jobs/{id}"], "the reads' faults", retried)
    dataflow.set_state(job_id, "JOB_STATE_DONE")
    assert retried.wait(timeout=120) == 0, log.read_text(errors="replace")[-3000:]
    assert list(dataflow.jobs) == [job_id] and dataflow.cancel_requests() == []
    assert dataflow.jobs[job_id]["name"].startswith("effnet-")
    assert os.listdir(tmp_path / "retried" / "tmp") == []
    count(len(dataflow.faults.injected), 1, 0)


def test_the_tiers_faults_are_the_services_documented_transient_ones():
    """What the tier injects is what the policy must retry, and a refusal is not retried past its window."""
    from effnet_common import cloud_retry

    for code in (429, 500, 503, 504):
        assert cloud_retry.is_transient(faults.gapic_error(faults.Fault("status", code), "call"))
    assert cloud_retry.is_transient(faults.gapic_error(faults.Fault("drop"), "call"))
    assert cloud_retry.is_refusal(faults.gapic_error(faults.Fault("status", 403), "call"))
    assert isinstance(faults.gapic_error(faults.Fault("status", 403), "call"), exceptions.PermissionDenied)
