"""The Vertex training job of a task: found again by a retried task, cancelled when the task is stopped while
it is being created, its timeout from the run that is actually run, its checkpoints kept by the run's settings,
its logs streamed to a Vertex AI TensorBoard, and the training service's rules in the fake that stands for it.

Vertex AI is ``fake_vertex.FakeJobServiceClient`` in this process (``gapic.JobServiceClient`` replaced);
everything up to the network call is this project's and TFX's code. Jobs run real replica processes (a short
``python -c``) where their lifecycle matters, none where only the request does (``fake_vertex.RUN_REPLICAS``).
"""

import json
import logging
import os
import signal
import time

import fake_vertex
import faults
import pytest
from google.api_core import exceptions
from tfx.types import artifact_utils, standard_artifacts

from components import accelerators, run_label, runtime_gate, vertex_training
from effnet_common import cloud_retry, follower, schema
from effnet_common.manifest import LabelConvention, Manifest, Shard, SplitManifest
from pipeline import kubeflow_v2_runner
from pipeline.template import pipeline_tasks
from trainer_module import presets, tfx_trainer
from trainer_module.config import TrainerConfig, with_overrides

PROJECT, REGION = "my-project", "us-central1"
PARENT = f"projects/{PROJECT}/locations/{REGION}"
TENSORBOARD = f"projects/{PROJECT}/locations/{REGION}/tensorboards/1234"
SERVICE_ACCOUNT = f"effnet@{PROJECT}.iam.gserviceaccount.com"
IMAGE = "us-docker.pkg.dev/my-project/effnet/trainer-cpu@sha256:" + "c" * 64
INPUTS = ["--train-archive", "gs://b/train.tar", "--val-archive", "gs://b/val.tar"]


@pytest.fixture
def vertex(monkeypatch, tmp_path):
    """Vertex's job service faked in this process; polls at once. Yields the directory of its records."""
    records = tmp_path / "vertex"
    records.mkdir()
    fake_vertex.install_in_process(monkeypatch, str(records))
    monkeypatch.setattr(follower, "CANCEL_WAIT_SECONDS", 2.0)
    yield records
    for job in fake_vertex._JOBS.values():  # no replica outlives its test
        job.stop()


def created(records) -> list[dict]:
    """The jobs the fake service was asked to create, in order."""
    numbered = [
        p for p in records.glob("custom_job-*.json") if p.name.split("-")[1].split(".")[0:2][1] == "json"
    ]
    return [json.loads(p.read_text()) for p in sorted(numbered, key=lambda p: int(p.name.split("-")[1][:-5]))]


def state(name: str) -> str:
    return fake_vertex._JOBS[name].refresh().state.name


def outputs(run: str) -> dict:
    """A Trainer execution's output artifacts in run ``run`` (URIs as a pipeline run gives them)."""
    model, model_run = standard_artifacts.Model(), standard_artifacts.ModelRun()
    model.uri = f"gs://bucket/root/{run}/Trainer/model"
    model_run.uri = f"gs://bucket/root/{run}/Trainer/model_run"
    return {"model": [model], "model_run": [model_run]}


def request(
    run: str = "run-1", code: str = "import time; time.sleep(0.5)", **spec
) -> vertex_training.JobRequest:
    """A job of one CPU machine running ``code``, labelled as the Trainer execution of ``run`` is."""
    labels = {
        vertex_training.TASK_LABEL: "trainer",
        vertex_training.OUTPUTS_LABEL: vertex_training.outputs_digest(outputs(run)),
    }
    pool = {
        "machine_spec": {"machine_type": "n1-standard-8"},
        "replica_count": 1,
        "container_spec": {"image_uri": IMAGE, "command": ["python", "-c", code]},
    }
    custom_job = {
        "display_name": "effnet-smoke-trainer",
        "labels": {"effnet-pipeline": "effnet-smoke", **labels},
        "job_spec": {"worker_pool_specs": [pool], **spec},
    }
    return vertex_training.JobRequest(PROJECT, REGION, custom_job, labels)


def create(job_request: vertex_training.JobRequest):
    """What an earlier attempt of the task did before it was killed (OOM, eviction, SIGKILL): create the job."""
    client = fake_vertex.FakeJobServiceClient(client_options={"api_endpoint": job_request.api_endpoint})
    return client.create_custom_job(parent=job_request.parent, custom_job=job_request.custom_job)


# ---- a retried task ------------------------------------------------------------------------------------------


def test_a_retried_task_follows_the_job_its_earlier_attempt_started(vertex):
    retry = request()
    earlier = create(retry)
    assert state(earlier.name) == "JOB_STATE_RUNNING"
    job = vertex_training.run_job(retry)
    assert job.name == earlier.name and job.state.name == "JOB_STATE_SUCCEEDED"
    assert len(created(vertex)) == 1  # no second job
    # The job succeeded: a further attempt takes its outcome (the outputs it wrote) without training again.
    assert vertex_training.run_job(retry).name == earlier.name
    assert len(created(vertex)) == 1


def test_a_retry_starts_again_after_a_failed_job_and_leaves_other_runs_jobs_alone(vertex):
    failed = create(request(code="raise SystemExit(3)"))
    other_run = create(request(run="run-2", code="import time; time.sleep(30)"))
    deadline = time.monotonic() + 30
    while state(failed.name) != "JOB_STATE_FAILED" and time.monotonic() < deadline:
        time.sleep(0.05)
    job = vertex_training.run_job(request())
    assert job.name not in (failed.name, other_run.name) and job.state.name == "JOB_STATE_SUCCEEDED"
    assert len(created(vertex)) == 3
    assert state(other_run.name) == "JOB_STATE_RUNNING"  # another run's job is not this task's


def test_a_retry_follows_the_newest_of_its_jobs_and_cancels_the_others(vertex):
    older = create(request(code="import time; time.sleep(30)"))
    newer = create(request())
    job = vertex_training.run_job(request())
    assert job.name == newer.name and job.state.name == "JOB_STATE_SUCCEEDED"
    assert state(older.name) == "JOB_STATE_CANCELLED"  # two jobs would write the same outputs
    assert len(created(vertex)) == 2


def test_job_request_labels_the_task_and_its_outputs_and_sets_the_timeout(vertex):
    from tfx import v1 as tfx

    keys = tfx.extensions.google_cloud_ai_platform
    custom_config = {
        keys.VERTEX_REGION_KEY: REGION,
        keys.TRAINING_ARGS_KEY: {
            "project": PROJECT,
            "display_name": "effnet-smoke-trainer",
            "labels": {"effnet-pipeline": "effnet-smoke"},
            "job_spec": request().custom_job["job_spec"] | {"scheduling": {"timeout": "7200s"}},
        },
    }
    made = vertex_training.job_request(
        {}, outputs("run-1"), {}, custom_config, "m.Executor", timeout_seconds=9000
    )
    labels = made.custom_job["labels"]
    assert {key: labels[key] for key in made.find_labels} == made.find_labels == request().find_labels
    assert labels["effnet-pipeline"] == "effnet-smoke"
    assert made.custom_job["job_spec"]["scheduling"]["timeout"] == "9000s"
    other = vertex_training.job_request({}, outputs("run-2"), {}, custom_config, "m.Executor", task="tuner")
    assert other.find_labels[vertex_training.OUTPUTS_LABEL] != made.find_labels[vertex_training.OUTPUTS_LABEL]
    assert other.find_labels[vertex_training.TASK_LABEL] == "tuner"


# ---- the service's transient faults ------------------------------------------------------------------------


def cancelled(records) -> list[str]:
    return sorted(p.name for p in records.glob("custom_job-*.cancel.json"))


def test_transient_faults_at_the_lookup_and_while_polling_are_waited_out_and_cancel_nothing(
    vertex, monkeypatch
):
    """What Vertex documents as transient, at the first lookup of an earlier attempt's job, at the create and
    while the job is polled: 503, 429, 500, an answer slower than the call's deadline, a reset connection, 504.
    One job is created and followed to its success; nothing is cancelled."""
    schedule = faults.FaultSchedule(
        {
            "list_custom_jobs": ["503", "429"],
            "create_custom_job": ["500"],
            "get_custom_job": ["503", "429", "500", "slow:2", "drop", "504"],
        }
    )
    monkeypatch.setattr(fake_vertex, "FAULTS", schedule)
    job = vertex_training.run_job(request(code="import time; time.sleep(1)"))
    assert job.state.name == "JOB_STATE_SUCCEEDED"
    assert len(created(vertex)) == 1 and cancelled(vertex) == []
    assert [fault for _, fault in schedule.injected] == [
        "503",
        "429",
        "500",
        "503",
        "429",
        "500",
        "slow:2",
        "drop",
        "504",
    ]


def test_a_create_whose_answer_is_lost_is_found_by_its_labels_not_made_twice(vertex, monkeypatch):
    """The create call's deadline passes while Vertex creates the job: the retry finds it by the execution's
    labels instead of creating a second one."""
    monkeypatch.setattr(fake_vertex, "FAULTS", faults.FaultSchedule({"create_custom_job": ["slow:2"]}))
    job = vertex_training.run_job(request())
    assert job.state.name == "JOB_STATE_SUCCEEDED"
    assert len(created(vertex)) == 1 and job.name == f"{PARENT}/customJobs/1"


def test_a_persistent_refusal_ends_the_step_in_one_line_within_the_window_and_leaves_nothing_running(
    vertex, monkeypatch
):
    """403 on every read of the job (the permission to get it taken away): the step waits out the refusal for
    ``REFUSAL_SECONDS`` (IAM changes take a while to apply), then fails with one line and cancels the job."""
    monkeypatch.setattr(fake_vertex, "FAULTS", faults.FaultSchedule({"get_custom_job": ["403*"]}))
    started = time.monotonic()
    with pytest.raises(vertex_training.TrainingJobFailed) as failure:
        vertex_training.run_job(request(code="import time; time.sleep(60)"))
    waited = time.monotonic() - started
    assert cloud_retry.REFUSAL_SECONDS <= waited < cloud_retry.REFUSAL_SECONDS + 10
    message = str(failure.value)
    assert "\n" not in message and message.startswith(
        f"reading training job {PARENT}/customJobs/1: refused for {cloud_retry.REFUSAL_SECONDS:g} s: PermissionDenied: "
    )
    (job,) = fake_vertex._JOBS
    assert fake_vertex._JOBS[job].cancelled and cancelled(vertex) == ["custom_job-1.cancel.json"]
    assert len(created(vertex)) == 1


def test_an_outage_longer_than_the_patience_gives_up_in_one_line(vertex, monkeypatch):
    monkeypatch.setattr(fake_vertex, "FAULTS", faults.FaultSchedule({"get_custom_job": ["503*"]}))
    patience = cloud_retry.Patience(outage_seconds=1.0)
    with pytest.raises(
        vertex_training.TrainingJobFailed, match=r"no answer for 1 s: ServiceUnavailable: 503"
    ):
        vertex_training.run_job(request(code="import time; time.sleep(60)"), patience=patience)
    assert len(created(vertex)) == 1 and cancelled(vertex) == ["custom_job-1.cancel.json"]


# ---- a task stopped while its job is created -------------------------------------------------------------------


class StoppedDuringCreate(fake_vertex.FakeJobServiceClient):
    """The task's pod gets SIGTERM while ``create_custom_job`` is in flight; the service creates the job."""

    def create_custom_job(self, parent, custom_job, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return super().create_custom_job(parent, custom_job, **kwargs)


class StoppedAndCreateFailed(fake_vertex.FakeJobServiceClient):
    """SIGTERM while the call is in flight; the service creates the job, but its answer never arrives."""

    def create_custom_job(self, parent, custom_job, **kwargs):
        super().create_custom_job(parent, custom_job, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        raise exceptions.DeadlineExceeded("Deadline Exceeded")


@pytest.mark.parametrize("client", [StoppedDuringCreate, StoppedAndCreateFailed])
def test_sigterm_while_the_job_is_created_leaves_no_job_running(vertex, monkeypatch, client):
    from google.cloud.aiplatform import gapic

    monkeypatch.setattr(gapic, "JobServiceClient", client)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(vertex_training.TaskStopped, match="^the pipeline task received SIGTERM$"):
        vertex_training.run_job(request(code="import time; time.sleep(30)"))
    (job,) = fake_vertex._JOBS
    assert state(job) == "JOB_STATE_CANCELLED"
    cancel = json.loads((vertex / fake_vertex.CANCEL_FILE.format(n=1)).read_text())
    assert cancel == {"name": job, "running": ["workerpool0-0"]}  # it was running when cancelled
    assert signal.getsignal(signal.SIGTERM) == before  # the task's own handler is back


class StoppedWhileLookingUp(fake_vertex.FakeJobServiceClient):
    """SIGTERM while the step looks for a job of an earlier attempt (a list call in flight)."""

    def list_custom_jobs(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return super().list_custom_jobs(*args, **kwargs)


def test_sigterm_while_an_earlier_job_is_looked_up_creates_nothing(vertex, monkeypatch):
    from google.cloud.aiplatform import gapic

    monkeypatch.setattr(gapic, "JobServiceClient", StoppedWhileLookingUp)
    with pytest.raises(vertex_training.TaskStopped, match="^the pipeline task received SIGTERM$"):
        vertex_training.run_job(request(code="import time; time.sleep(30)"))
    assert created(vertex) == [] and fake_vertex._JOBS == {}


def test_a_job_the_service_refuses_fails_the_task_in_one_line(vertex):
    refused = request(scheduling={"strategy": "FLEX_START"})  # CPU machines: flex-start takes GPUs only
    with pytest.raises(vertex_training.TrainingJobFailed) as failure:
        vertex_training.run_job(refused)
    assert str(failure.value) == (
        "Vertex AI refused the training job: FLEX_START takes L4, A100, H100, H200 or B200 GPUs, "
        "not n1-standard-8"
    )
    assert created(vertex) == [] and fake_vertex._JOBS == {}


# ---- the timeout of the run that is actually run -----------------------------------------------------------


def imagenet_shards(
    root, train_records: int = 1_281_167, val_records: int = 50_000
) -> standard_artifacts.Examples:
    """An Examples artifact as the sharding step leaves it, with ImageNet's counts in its manifest (the shard
    files are empty: only the manifest is read before the job starts)."""
    splits = {}
    for split, records, count in ((schema.TRAIN, train_records, 4), (schema.VALIDATION, val_records, 2)):
        directory = f"Split-{split}"
        os.makedirs(os.path.join(root, directory), exist_ok=True)
        shards = []
        for i in range(count):
            path = os.path.join(root, directory, schema.shard_name(split, i, count))
            open(path, "wb").close()
            shards.append(Shard(path, records // count + (i < records % count), 0))
        pattern = f"{directory}/{split}-*-of-*"
        splits[split] = SplitManifest(split, records, records, 0, 0, directory, pattern, tuple(shards))
    convention = LabelConvention("ILSVRC2012 synsets, sorted", offset=0, num_classes=1000)
    Manifest(splits, convention, ("image/encoded",), directory=str(root)).write(
        os.path.join(root, "manifest.json")
    )
    examples = standard_artifacts.Examples()
    examples.uri = str(root)
    examples.split_names = artifact_utils.encode_split_names([schema.TRAIN, schema.VALIDATION])
    return examples


def compiled_trainer(tmp_path, *flags, task: str = "Trainer") -> dict:
    """The Trainer task's (or ``task``'s) constant parameters in the compiled Vertex PipelineJob
    (b0-rmsprop-8x2048 on a tpu-v3-8)."""
    output = tmp_path / "effnet.json"
    argv = [
        "--output", str(output), "--project", PROJECT, "--region", REGION, "--pipeline-root", "gs://b/p",
        "--image", IMAGE, "--preset", "b0-rmsprop-8x2048", *INPUTS, *flags,
    ]  # fmt: skip
    assert kubeflow_v2_runner.main(argv) == 0
    parameters = pipeline_tasks(json.loads(output.read_text())["pipelineSpec"])[task]["inputs"]
    return {
        k: v["runtimeValue"]["constant"] for k, v in parameters["parameters"].items() if "runtimeValue" in v
    }


def train_in_vertex(tmp_path, properties: dict, run_values: dict) -> dict:
    """Runs the Vertex Trainer's executor with the run's values up to the (fake) service; returns the job it
    sent. The job starts no replica and succeeds at once."""
    examples = imagenet_shards(tmp_path / "examples")
    runtime_gate.VertexTrainerExecutor().Do(
        {"examples": [examples]}, outputs("run-1"), {**properties, **run_values}
    )
    (record,) = created(tmp_path / "vertex")
    return record["custom_job"]


def test_the_timeout_is_the_runs_own_with_the_compiled_flag_as_its_bound(vertex, tmp_path, monkeypatch):
    monkeypatch.setattr(fake_vertex, "RUN_REPLICAS", False)
    properties = compiled_trainer(tmp_path)
    custom_config = json.loads(properties["custom_config"])
    config = TrainerConfig.from_json(custom_config[tfx_trainer.CONFIG_KEY])
    machine = accelerators.get("tpu-v3-8")
    compiled = accelerators.estimate(config, machine).timeout_seconds
    assert custom_config["ai_platform_training_args"]["job_spec"]["scheduling"]["timeout"] == f"{compiled}s"
    # Three times the default epochs: the job gets three times the timeout, not the one compiled for 350.
    epochs = 3 * config.loop.train_epochs
    job = train_in_vertex(tmp_path, properties, {"train_epochs": epochs, "target_top1": 0.5})
    longer = accelerators.estimate(
        with_overrides(config, [f"loop.train_epochs={epochs}"]), machine
    ).timeout_seconds
    assert job["job_spec"]["scheduling"]["timeout"] == f"{longer}s"
    assert 2.9 * compiled < longer < accelerators.MAX_TIMEOUT_SECONDS


def test_the_timeout_flag_bounds_the_runs_timeout(vertex, tmp_path, monkeypatch):
    monkeypatch.setattr(fake_vertex, "RUN_REPLICAS", False)
    properties = compiled_trainer(tmp_path, "--training-timeout-hours", "100")
    job = train_in_vertex(tmp_path, properties, {"train_epochs": 1050, "target_top1": 0.5})
    assert job["job_spec"]["scheduling"]["timeout"] == "360000s"


def test_the_timeout_follows_the_shards_epoch(vertex, tmp_path, monkeypatch):
    """A smaller dataset than the preset's trains fewer steps: the timeout is that run's (the 2-hour floor)."""
    monkeypatch.setattr(fake_vertex, "RUN_REPLICAS", False)
    properties = compiled_trainer(tmp_path)
    examples = imagenet_shards(tmp_path / "small", train_records=20_480, val_records=1_000)
    runtime_gate.VertexTrainerExecutor().Do({"examples": [examples]}, outputs("run-1"), properties)
    (record,) = created(vertex)
    assert record["custom_job"]["job_spec"]["scheduling"]["timeout"] == f"{accelerators.MIN_TIMEOUT_SECONDS}s"


def test_the_tuning_jobs_timeout_is_the_searchs_on_the_runs_data(vertex, tmp_path, monkeypatch):
    """The Tuner's job: the compiled timeout is the search's on ImageNet; a run on a smaller dataset (another
    archive given at submission) gets its own, here the 2-hour floor."""
    from tfx import v1 as tfx

    from components import vertex_tuner  # TFX's Vertex tuner loads the Vertex AI SDK: not at collection

    monkeypatch.setattr(fake_vertex, "RUN_REPLICAS", False)
    properties = compiled_trainer(tmp_path, "--tune", "--tune-parallel-trials", "1", task="Tuner")
    tuning_args = json.loads(properties["custom_config"])[
        tfx.extensions.google_cloud_ai_platform.experimental.TUNING_ARGS_KEY
    ]
    compiled = tuning_args["job_spec"]["scheduling"]["timeout"]
    assert int(compiled.rstrip("s")) > accelerators.MIN_TIMEOUT_SECONDS  # a search of ImageNet epochs
    timeouts = []
    for name, examples in (
        ("imagenet", imagenet_shards(tmp_path / "imagenet")),
        ("small", imagenet_shards(tmp_path / "small", train_records=20_480, val_records=1_000)),
    ):
        best = standard_artifacts.HyperParameters()
        best.uri = f"gs://bucket/root/{name}/Tuner/best_hyperparameters"
        vertex_tuner.VertexTunerExecutor().Do(
            {"examples": [examples]}, {"best_hyperparameters": [best]}, properties
        )
        timeouts.append(created(vertex)[-1]["custom_job"]["job_spec"]["scheduling"]["timeout"])
    assert timeouts == [compiled, f"{accelerators.MIN_TIMEOUT_SECONDS}s"]


def test_on_kubeflow_the_training_job_is_labelled_with_the_run_id_in_its_output_uris(
    vertex, tmp_path, monkeypatch
):
    """A Kubeflow task has no run id among its arguments: the executor reads it off its outputs' URIs."""
    monkeypatch.setattr(fake_vertex, "RUN_REPLICAS", False)
    properties = compiled_trainer(tmp_path)
    run = "0b6e7d0c-3d51-4c5e-9a43-8d2b7f1e6a90"
    salted = outputs(f"effnet-b0-rmsprop-8x2048/{run}")  # <root>/<pipeline>/<run id>/<task>/<salt>/<output>
    for artifacts in salted.values():
        artifacts[0].uri = artifacts[0].uri.replace(
            "/Trainer/", "/Trainer/5d1c8a9e-7f3b-4e2a-b6c4-0a9f8e7d6c5b/"
        )
    context = runtime_gate.VertexTrainerExecutor.Context(
        extra_flags=[run_label.kfp_run_arg("effnet-b0-rmsprop-8x2048")]
    )
    examples = imagenet_shards(tmp_path / "examples")
    runtime_gate.VertexTrainerExecutor(context).Do({"examples": [examples]}, salted, properties)
    (record,) = created(vertex)
    assert record["custom_job"]["labels"][run_label.RUN_LABEL] == run


# ---- Vertex AI TensorBoard ------------------------------------------------------------------------------------


def test_the_training_and_tuning_jobs_stream_to_the_tensorboard_each_run_in_a_directory_of_its_own(
    vertex, tmp_path, monkeypatch, caplog
):
    """Compiled with ``--tensorboard``: both jobs name the instance (with the service account Vertex requires) and
    the step's logs root under the pipeline root, which the service's rules accept. The steps add the run (its
    id; outside a pipeline run, a digest of the step's outputs), so every run's job is told a directory of its own
    (``AIP_TENSORBOARD_LOG_DIR``), and the training step logs the job's page in Vertex AI TensorBoard."""
    from google.cloud import aiplatform_v1
    from tfx import v1 as tfx

    from components import vertex_tuner  # TFX's Vertex tuner loads the Vertex AI SDK: not at collection

    monkeypatch.setattr(fake_vertex, "RUN_REPLICAS", False)
    output = tmp_path / "effnet.json"
    argv = [
        "--output", str(output), "--project", PROJECT, "--region", REGION, "--pipeline-root", "gs://b/p",
        "--image", IMAGE, *INPUTS, "--tune", "--tune-parallel-trials", "1",
        "--service-account", SERVICE_ACCOUNT, "--tensorboard", TENSORBOARD,
    ]  # fmt: skip
    assert kubeflow_v2_runner.main(argv) == 0
    tasks = pipeline_tasks(json.loads(output.read_text())["pipelineSpec"])
    properties = {
        task: {
            k: v["runtimeValue"]["constant"]
            for k, v in tasks[task]["inputs"]["parameters"].items()
            if "runtimeValue" in v
        }
        for task in ("Trainer", "Tuner")
    }
    vertex_keys = tfx.extensions.google_cloud_ai_platform
    logs_root = "gs://b/p/tensorboard/effnet-b0-rmsprop-8x2048"
    for task, key in (
        ("Trainer", vertex_keys.TRAINING_ARGS_KEY),
        ("Tuner", vertex_keys.experimental.TUNING_ARGS_KEY),
    ):
        job_args = json.loads(properties[task]["custom_config"])[key]
        spec = job_args["job_spec"]
        assert (spec["tensorboard"], spec["service_account"]) == (TENSORBOARD, SERVICE_ACCOUNT)
        assert spec["base_output_directory"] == {"output_uri_prefix": f"{logs_root}/{task.lower()}"}
        compiled = aiplatform_v1.CustomJob({k: v for k, v in job_args.items() if k != "project"})
        fake_vertex.check_custom_job(PARENT, compiled)

    run_id = "0b6e7d0c-3d51-4c5e-9a43-8d2b7f1e6a90"
    context = runtime_gate.VertexTrainerExecutor.Context(extra_flags=[f"{run_label.RUN_FLAG}={run_id}"])
    examples = imagenet_shards(tmp_path / "examples")
    with caplog.at_level(logging.INFO, logger=vertex_training.logger.name):
        runtime_gate.VertexTrainerExecutor(context).Do(
            {"examples": [examples]}, outputs(run_id), properties["Trainer"]
        )
    (record,) = created(vertex)
    spec = record["custom_job"]["job_spec"]
    assert spec["tensorboard"] == TENSORBOARD
    assert spec["base_output_directory"] == {"output_uri_prefix": f"{logs_root}/trainer/{run_id}"}
    assert (
        fake_vertex.output_environment(spec)["AIP_TENSORBOARD_LOG_DIR"]
        == f"{logs_root}/trainer/{run_id}/logs/"
    )
    page = (
        "https://us-central1.tensorboard.googleusercontent.com/experiment/"
        "projects+my-project+locations+us-central1+tensorboards+1234+experiments+1"
    )
    assert f"TensorBoard of training job {PARENT}/customJobs/1: {page}" in caplog.messages

    best = standard_artifacts.HyperParameters()
    best.uri = "gs://bucket/root/run-1/Tuner/best_hyperparameters"
    vertex_tuner.VertexTunerExecutor().Do(
        {"examples": [examples]}, {"best_hyperparameters": [best]}, properties["Tuner"]
    )
    spec = created(vertex)[-1]["custom_job"]["job_spec"]
    # No run id outside a pipeline run: the directory is named by the step's outputs.
    digest = vertex_training.outputs_digest({"best_hyperparameters": [best]})
    assert (spec["tensorboard"], spec["base_output_directory"]) == (
        TENSORBOARD,
        {"output_uri_prefix": f"{logs_root}/tuner/{digest}"},
    )


def test_a_job_with_an_output_directory_tells_its_replicas_where_the_tensorboard_logs_go(vertex):
    """Vertex sets ``AIP_MODEL_DIR``, ``AIP_CHECKPOINT_DIR`` and ``AIP_TENSORBOARD_LOG_DIR`` under a job's
    ``base_output_directory`` in each of its containers; so do the fake's replicas."""
    code = "import os; print('logs at', os.environ['AIP_TENSORBOARD_LOG_DIR'])"
    output = {"output_uri_prefix": "gs://b/p/tensorboard/effnet-smoke/trainer/run-1"}
    job = vertex_training.run_job(request(code=code, base_output_directory=output))
    assert job.state.name == "JOB_STATE_SUCCEEDED"
    log = (vertex / fake_vertex.LOG_FILE.format(n=1, replica="workerpool0-0")).read_text()
    assert "logs at gs://b/p/tensorboard/effnet-smoke/trainer/run-1/logs/" in log


# ---- checkpoints that outlive the run ----------------------------------------------------------------------


def _files(examples) -> tuple[list[str], list[str]]:
    return [f"{examples.uri}/Split-train/*"], [f"{examples.uri}/Split-validation/*"]


def test_the_checkpoint_directory_is_named_by_the_runs_settings_and_data(tmp_path):
    config = presets.get_preset("b0-rmsprop-8x2048")
    first = _files(imagenet_shards(tmp_path / "run-1"))
    again = _files(imagenet_shards(tmp_path / "run-2"))  # the same data, sharded by another pipeline run
    key = tfx_trainer.checkpoint_key(config, *first)
    assert tfx_trainer.checkpoint_key(config, *again) == key
    # Where the run stops is not what it trains: a later stop or another target continues the checkpoints.
    for same in ("loop.target_top1=0.7", "loop.stop_at_epoch=10"):
        assert tfx_trainer.checkpoint_key(with_overrides(config, [same]), *first) == key, same
    for other in ("loop.train_epochs=100", "loop.seed=1", "schedule.lr_per_256=0.02"):
        assert tfx_trainer.checkpoint_key(with_overrides(config, [other]), *first) != key, other
    other_data = _files(imagenet_shards(tmp_path / "run-3", train_records=1_281_000))
    assert tfx_trainer.checkpoint_key(config, *other_data) != key


def test_the_checkpoint_root_is_compiled_only_when_asked(tmp_path):
    asked = json.loads(compiled_trainer(tmp_path, "--checkpoint-root", "gs://ckpt/effnet/")["custom_config"])
    assert asked[tfx_trainer.CHECKPOINT_ROOT_KEY] == "gs://ckpt/effnet/effnet-b0-rmsprop-8x2048"
    default = json.loads(compiled_trainer(tmp_path)["custom_config"])
    assert tfx_trainer.CHECKPOINT_ROOT_KEY not in default
    assert default[vertex_training.TIMEOUT_KEY] == {
        "accelerator": "tpu-v3-8",
        "machines": 1,
        "max_seconds": accelerators.MAX_TIMEOUT_SECONDS,
    }


@pytest.fixture(scope="module")
def digit_examples(tmp_path_factory):
    """300 real digits sharded by beam_preprocess, laid out as the sharding step's Examples artifact."""
    from beam_preprocess import sample_data
    from beam_preprocess.config import ShardingConfig
    from beam_preprocess.run import run as shard

    root = tmp_path_factory.mktemp("digits")
    archives = sample_data.write_archives(
        str(root / "archives"), sample_data.digit_samples(size=32)[:300], 0.2
    )
    out = root / "examples"
    shard(
        ShardingConfig(
            output_dir=str(out),
            train_archive=archives.train_archive,
            val_archive=archives.val_archive,
            train_shards=2,
            val_shards=1,
            split_dir_template="Split-{split}",
        )
    )
    examples = standard_artifacts.Examples()
    examples.uri = str(out)
    return examples


@pytest.mark.slow
def test_a_rerun_with_the_same_settings_resumes_from_the_checkpoint_root(
    digit_examples, tmp_path, monkeypatch
):
    """Two pipeline runs: each has model directories of its own, the checkpoints are kept under the root. The
    first run stops after its first epoch (as a run killed there would); the second, with the same settings,
    starts from that checkpoint. The jobs are attached to a Vertex AI TensorBoard: the summaries go where Vertex
    tells the job (``AIP_TENSORBOARD_LOG_DIR``), not into the model run."""
    import tensorflow as tf
    from tfx.components.trainer.fn_args_utils import FnArgs

    from trainer_module.profiling import VERTEX_TENSORBOARD_ENV
    from trainer_module.recorder import RUN_LOG_FILE, read_run_log

    streamed = tmp_path / "tensorboard" / "trainer" / "run" / "logs"
    # As Vertex sets it: <base_output_directory>/logs/.
    monkeypatch.setenv(VERTEX_TENSORBOARD_ENV, f"{streamed}/")

    config = with_overrides(
        presets.get_preset("smoke"),
        ["loop.train_epochs=2", "loop.eval_every_epochs=1", "loop.target_top1=1.0"],
    )
    root = str(tmp_path / "checkpoints")
    train_files, eval_files = _files(digit_examples)

    def run(name: str, run_config):
        fn_args = FnArgs(
            train_files=train_files,
            eval_files=eval_files,
            model_run_dir=str(tmp_path / name / "model_run"),
            serving_model_dir=str(tmp_path / name / "model"),
            custom_config={
                tfx_trainer.CONFIG_KEY: run_config.to_json(),
                tfx_trainer.CHECKPOINT_ROOT_KEY: root,
            },
        )
        tfx_trainer.run_fn(fn_args)
        (start,) = [
            e
            for e in read_run_log(os.path.join(fn_args.model_run_dir, RUN_LOG_FILE))
            if e["event"] == "start"
        ]
        return start

    first = run("run-1", with_overrides(config, ["loop.stop_at_epoch=1"]))
    assert (first["step"], first["resumed"]) == (0, False)
    (key,) = os.listdir(root)
    assert not os.path.exists(tmp_path / "run-1" / "model_run" / "checkpoints")  # none in the run's artifact
    second = run("run-2", config)
    assert second["resumed"] and second["step"] == first["stop_step"]
    assert os.listdir(root) == [key]
    assert os.path.isfile(tmp_path / "run-2" / "model" / "saved_model.pb")
    assert tf.io.gfile.glob(f"{streamed}/events.out.tfevents.*")
    assert not any(os.path.exists(tmp_path / run / "model_run" / "tensorboard") for run in ("run-1", "run-2"))


# ---- the fake's rules: what the service refuses --------------------------------------------------------------


def _job(machine: dict, replicas: int = 1, **spec):
    from google.cloud import aiplatform_v1

    pool = {"machine_spec": machine, "replica_count": replicas, "container_spec": {"image_uri": IMAGE}}
    return aiplatform_v1.CustomJob({"display_name": "j", "job_spec": {"worker_pool_specs": [pool], **spec}})


V3 = {"machine_type": "cloud-tpu", "accelerator_type": "TPU_V3", "accelerator_count": 8}
H100 = {"machine_type": "a3-highgpu-8g", "accelerator_type": "NVIDIA_H100_80GB", "accelerator_count": 8}
RESERVED = {
    "reservation_affinity": {
        "reservation_affinity_type": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["projects/p/zones/us-central1-a/reservations/r"],
    }
}


@pytest.mark.parametrize(
    "job,region,refusal",
    [
        (_job(V3), "us-central1", None),
        (_job(V3), "us-east1", None),
        (_job(V3), "asia-east1", "TPU_V3 is not offered for training in asia-east1"),
        (_job({**V3, "accelerator_count": 32}), "us-central1", "cloud-tpu takes TPU_V2 or TPU_V3 with accelerator_count 8"),
        (_job(V3, replicas=2), "us-central1", "a TPU_V3 job runs one replica in one worker pool"),
        (_job({"machine_type": "ct5lp-hightpu-4t", "tpu_topology": "2x2"}), "us-west1", None),
        (_job({"machine_type": "ct5lp-hightpu-4t", "tpu_topology": "2x4"}), "us-west1", "needs tpu_topology 2x2"),
        (_job({"machine_type": "a3-highgpu-8g", "accelerator_type": "NVIDIA_H100_80GB"}), "us-central1",
         "should be given together"),
        (_job({**H100, "accelerator_type": "NVIDIA_TESLA_A100"}), "us-central1", "a3-highgpu-8g has 8 NVIDIA_H100_80GB"),
        (_job({"machine_type": "m9-giant"}), "us-central1", "machine type 'm9-giant' is not offered"),
        (_job(H100, scheduling={"strategy": "FLEX_START"}), "us-central1", None),
        (_job(V3, scheduling={"strategy": "FLEX_START"}), "us-central1", "FLEX_START takes L4, A100, H100"),
        (_job(H100, scheduling={"strategy": "FLEX_START", "timeout": "700000s"}), "us-central1", "at most 7 days"),
        (_job({**H100, **RESERVED}, scheduling={"strategy": "FLEX_START"}), "us-central1", "cannot consume a reservation"),
        (_job({**H100, **RESERVED}, scheduling={"strategy": "SPOT"}), "us-central1", "cannot consume a reservation"),
        (_job(V3, scheduling={"strategy": "SPOT"}), "us-central1", None),
        (_job({**H100, **RESERVED}), "us-central1", None),
        (_job({**H100, **RESERVED}), "europe-west4", "is not in region europe-west4"),
        (_job({**V3, **RESERVED}), "us-central1", "a cloud-tpu machine cannot consume a Compute Engine reservation"),
        (_job(V3, tensorboard=TENSORBOARD, service_account=SERVICE_ACCOUNT,
              base_output_directory={"output_uri_prefix": "gs://b/p/tensorboard/x/trainer/r"}), "us-central1", None),
        (_job(V3, tensorboard=TENSORBOARD, service_account=SERVICE_ACCOUNT), "us-east1",
         "tensorboard projects/my-project/locations/us-central1/tensorboards/1234 is not in the job's region us-east1"),
        (_job(V3, tensorboard=TENSORBOARD), "us-central1", "service_account is required with tensorboard"),
        (_job(V3, tensorboard="tensorboards/1234", service_account=SERVICE_ACCOUNT), "us-central1",
         "is not projects/P/locations/L/tensorboards/T"),
        (_job(V3, base_output_directory={"output_uri_prefix": "/tmp/out"}), "us-central1", "must be a gs:// prefix"),
    ],
)  # fmt: skip
def test_the_fake_service_refuses_what_vertex_refuses(job, region, refusal):
    if refusal is None:
        fake_vertex.check_custom_job(f"projects/p/locations/{region}", job)
    else:
        with pytest.raises(fake_vertex.Refused, match=refusal):
            fake_vertex.check_custom_job(f"projects/p/locations/{region}", job)


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["--provisioning", "spot"],
        ["--accelerator", "gpu-h100x8", "--provisioning", "flex-start"],
        ["--accelerator", "gpu-a100x8", "--machines", "2", "--set", "data.num_cores=16", "--provisioning", "flex-start"],
        ["--accelerator", "gpu-h100x8", "--reservation", "projects/p/zones/us-central1-b/reservations/r"],
        ["--accelerator", "tpu-v5litepod-8", "--region", "us-west1", "--set", "data.num_cores=8"],
        ["--region", "us-east1"],  # TPU v3 in Vertex's training table, not among Cloud TPU VM zones
    ],
)  # fmt: skip
def test_what_compiles_the_fake_service_accepts(tmp_path, flags):
    """Every training job the runner compiles is one the service's rules accept (the runner refuses the rest)."""
    from google.cloud import aiplatform_v1

    output = tmp_path / "effnet.json"
    region = flags[flags.index("--region") + 1] if "--region" in flags else REGION
    argv = [
        "--output",
        str(output),
        "--project",
        PROJECT,
        "--pipeline-root",
        "gs://b/p",
        "--image",
        IMAGE,
        *INPUTS,
    ]
    assert (
        kubeflow_v2_runner.main([*argv, *(flags if "--region" in flags else ["--region", REGION, *flags])])
        == 0
    )
    parameters = pipeline_tasks(json.loads(output.read_text())["pipelineSpec"])["Trainer"]["inputs"]
    training = json.loads(parameters["parameters"]["custom_config"]["runtimeValue"]["constant"])
    job_args = {k: v for k, v in training["ai_platform_training_args"].items() if k != "project"}
    fake_vertex.check_custom_job(f"projects/{PROJECT}/locations/{region}", aiplatform_v1.CustomJob(job_args))


def test_the_fake_lists_jobs_through_the_apis_filter(vertex):
    client = fake_vertex.FakeJobServiceClient()
    ours, theirs = create(request()), create(request(run="run-2"))
    digest = request().find_labels[vertex_training.OUTPUTS_LABEL]
    found = client.list_custom_jobs(request={"parent": PARENT, "filter": f"labels.effnet_outputs={digest}"})
    assert [job.name for job in found] == [ours.name]
    quoted = client.list_custom_jobs(
        request={"parent": PARENT, "filter": f'labels.effnet_outputs="{digest}"'}
    )
    assert [job.name for job in quoted] == [ours.name]
    both = client.list_custom_jobs(
        request={"parent": PARENT, "filter": "labels.effnet_task:* AND state!=JOB_STATE_FAILED"}
    )
    assert {job.name for job in both} == {ours.name, theirs.name}
    assert client.list_custom_jobs(parent="projects/p/locations/europe-west4") == []
    with pytest.raises(exceptions.InvalidArgument, match="unsupported filter term"):
        client.list_custom_jobs(request={"parent": PARENT, "filter": "display_name~x"})
