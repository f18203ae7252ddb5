"""The compiled Vertex PipelineJob's steps, run the way their containers run them, on the embedded digits.

``python -m pipeline.kubeflow_v2_runner`` compiles the pipeline (smoke preset, the ``cpu`` accelerator); then
``kfp_launcher`` runs each container task of the compiled JSON as the Vertex launcher would: the task's own
command and args with the ``ExecutorInput`` built from the compiled spec, the run's parameter values and the
upstream tasks' executor outputs. The Trainer task starts its Vertex AI custom job through TFX's Vertex job
client, whose network client ``fake_vertex`` replaces: it records the CustomJob request and runs the job's
worker pool 0 command on this machine. The deviations (DirectRunner for Dataflow, no baseline model from the
resolver, a local root) are listed in ``kfp_launcher``.

The run's parameter values differ from the compiled defaults, so what the steps produce shows that each value
reached its step: the shard count, the trainer's epochs and target, the Evaluator's gate. (The Pusher, TFX's
own filesystem Pusher, is left out: each step is a fresh interpreter importing TensorFlow, TFX and Beam, and
the suite's time is better spent on the steps this project wrote.)

The training chain runs on a local pipeline root: TensorFlow's own gs:// (the Trainer, TFMA, the Pusher)
cannot reach the GCS emulator. The sharding step, which reads and writes through Beam's GCS client, also runs
with its archives and the compiled gs:// root on the emulator.

The data is the ``clean_archives`` pair of a few hundred real digits: an epoch of the trainer is a pass over
the shards (their manifest's count), so the full embedded set would train and evaluate several times longer.
"""

import dataclasses
import json
import os
import pathlib

import fake_vertex
import faults
import gcs_emulator
import kfp_launcher
import pytest
import tensorflow_model_analysis as tfma

from components import runtime_gate
from effnet_common import schema
from effnet_common.manifest import Manifest
from pipeline import kubeflow_v2_runner

PROJECT, REGION = "effnet-test-project", "us-central1"
PIPELINE_IMAGE = "us-docker.pkg.dev/effnet-test-project/effnet/pipeline@sha256:" + "a" * 64
TRAINER_IMAGE = "us-docker.pkg.dev/effnet-test-project/effnet/trainer-cpu@sha256:" + "b" * 64
SERVICE_ACCOUNT = "effnet@effnet-test-project.iam.gserviceaccount.com"
NETWORK = "projects/123/global/networks/vpc"
# Compiled defaults that no model here meets, and the run's values that replace them.
COMPILED = {"target_top1": 0.99, "train_epochs": 1, "train_shards": 2}
RUN = {"target_top1": 0.0, "train_epochs": 3, "train_shards": 3}
SHARDS, TRAINER, EVALUATOR = "ImageNetShardGen", "Trainer", "Evaluator"


def compile_job(out_dir, pipeline_root: str, train_archive: str, val_archive: str) -> dict:
    """The Vertex PipelineJob ``kubeflow_v2_runner`` writes for the smoke preset on the cpu accelerator."""
    output = os.path.join(out_dir, "effnet.json")
    argv = [
        "--output", output, "--project", PROJECT, "--region", REGION, "--pipeline-root", pipeline_root,
        "--image", PIPELINE_IMAGE, "--trainer-image", TRAINER_IMAGE, "--accelerator", "cpu",
        "--service-account", SERVICE_ACCOUNT, "--network", NETWORK, "--preset", "smoke",
        "--train-archive", train_archive, "--val-archive", val_archive,
        *[f"--param={name}={value}" for name, value in COMPILED.items()],
    ]  # fmt: skip
    assert kubeflow_v2_runner.main(argv) == 0
    with open(output) as f:
        return json.load(f)


def trainer_values() -> dict:
    return {name: RUN[name] for name in ("train_epochs", "target_top1")}


def shard_files() -> list[str]:
    """What the sharding step leaves in its Examples artifact with the run's layout, sorted."""
    layout = ((schema.TRAIN, RUN["train_shards"]), (schema.VALIDATION, 1))
    shards = [
        f"Split-{split}/{schema.shard_name(split, i, count)}" for split, count in layout for i in range(count)
    ]
    return sorted(["manifest.json", *shards])


def files_under(directory) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(parent, name), directory)
        for parent, _, names in os.walk(directory)
        for name in names
    )


def overall_metrics(evaluation_uri: str) -> dict[str, float]:
    """TFMA's metrics of the overall slice, by name."""
    (overall,) = [m for m in tfma.load_metrics(evaluation_uri) if not m.slice_key.single_slice_keys]
    return {kv.key.name: kv.value.double_value.value for kv in overall.metric_keys_and_values}


def exec_properties_of(command: list[str]) -> dict:
    """The execution properties TFX wrote into a worker pool's ``run_executor`` command."""
    return json.loads(command[command.index("--exec-properties") + 1])


@dataclasses.dataclass(frozen=True)
class LocalRun:
    """The compiled job, run on a local root with the run's values."""

    job: dict
    out: pathlib.Path
    parameters: dict

    @property
    def root(self) -> str:
        return str(self.out / "root")

    def run(self, task: str, upstream=(), **kwargs) -> kfp_launcher.TaskResult:
        results = {result.task: result for result in upstream}
        scratch = str(self.out / "launcher")
        return kfp_launcher.run_task(self.job, task, self.root, scratch, self.parameters, results, **kwargs)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, clean_archives):
    out = tmp_path_factory.mktemp("vertex_steps")
    job = compile_job(out, "gs://effnet-test-bucket/pipelines", clean_archives.train_archive,
                      clean_archives.val_archive)  # fmt: skip
    return LocalRun(job, out, kfp_launcher.runtime_parameters(job, RUN))


@pytest.fixture(scope="module")
def shards(local_run):
    return local_run.run(SHARDS)


@dataclasses.dataclass(frozen=True)
class RetriedTrainer:
    result: kfp_launcher.TaskResult
    attempts: int
    faults_met: list

    def artifact(self, key: str) -> dict:
        return self.result.artifact(key)


@pytest.fixture(scope="module")
def trainer(local_run, shards):
    """The Trainer task as the orchestrator runs it under its compiled retry policy, with its first attempt killed
    outright (SIGKILL: its pod evicted) once its job trains, and Vertex's transient faults on the way: the retried
    attempt finds the job by its labels and follows it to its end."""
    vertex = local_run.out / "vertex"
    vertex.mkdir()
    record = str(local_run.out / "faults-met.jsonl")
    schedule = faults.FaultSchedule(
        {"list_custom_jobs": ["503", "drop"], "get_custom_job": ["429", "500", "slow:2", "503"]}, record
    ).save(str(local_run.out / "faults.json"))
    replica_log = vertex / fake_vertex.LOG_FILE.format(n=1, replica="workerpool0-0")

    def training(started) -> bool:
        return replica_log.exists() and "Training model." in replica_log.read_text(errors="replace")

    try:
        result, attempts = kfp_launcher.run_task_retried(
            local_run.job, TRAINER, local_run.root, str(local_run.out / "launcher"), local_run.parameters,
            {SHARDS: shards}, kill_first_when=training, backoff_scale=0.0, wrapper=fake_vertex.wrapper(str(vertex), schedule),
        )  # fmt: skip
    finally:
        fake_vertex.stop_all(str(vertex))
    return RetriedTrainer(result, attempts, faults.FaultSchedule.recorded(record))


@pytest.fixture(scope="module")
def evaluator(local_run, shards, trainer):
    return local_run.run(EVALUATOR, [shards, trainer.result])


def test_run_values_differ_from_the_compiled_defaults(local_run):
    """The premise of the step tests: what a step produces tells the run's value from the compiled one."""
    defaults = kfp_launcher.runtime_parameters(local_run.job)
    assert {name: defaults[name] for name in COMPILED} == COMPILED
    assert {name: local_run.parameters[name] for name in RUN} == RUN


@pytest.mark.slow
def test_sharding_step_writes_the_run_shard_count_and_manifest(shards, clean_archives, local_run):
    examples = shards.artifact("examples")
    assert examples["uri"] == f"{local_run.root}/{SHARDS}/examples/1"
    metadata = examples["metadata"]
    assert json.loads(metadata["split_names"]) == [schema.TRAIN, schema.VALIDATION]
    assert metadata["train_records"] == len(clean_archives.train)
    assert metadata["validation_records"] == len(clean_archives.validation)
    assert (metadata["train_shards"], metadata["validation_shards"]) == (RUN["train_shards"], 1)
    assert files_under(examples["uri"]) == shard_files()  # no spill or temp file left
    manifest = Manifest.read(os.path.join(examples["uri"], "manifest.json"))
    assert manifest.split(schema.TRAIN).num_examples == len(clean_archives.train)
    assert manifest.split(schema.TRAIN).num_shards == RUN["train_shards"]


@pytest.mark.slow
def test_trainer_runs_as_a_vertex_custom_job_with_the_run_values(trainer, local_run):
    executors = local_run.job["pipelineSpec"]["deploymentSpec"]["executors"]
    assert executors["Trainer_executor"]["container"]["image"] == PIPELINE_IMAGE  # it only starts the job
    vertex = local_run.out / "vertex"
    record_file = fake_vertex.RECORD_FILE.format(n=1)  # the one job the task (and its retry) made
    with open(vertex / record_file) as f:
        record = json.load(f)
    assert record["parent"] == f"projects/{PROJECT}/locations/{REGION}"
    assert record["api_endpoint"] == f"{REGION}-aiplatform.googleapis.com"
    spec = record["custom_job"]["job_spec"]
    assert (spec["service_account"], spec["network"]) == (SERVICE_ACCOUNT, NETWORK)
    (pool,) = spec["worker_pool_specs"]
    assert pool["machine_spec"] == {"machine_type": "n1-standard-8"}
    assert pool["replica_count"] == 1
    assert pool["container_spec"]["image_uri"] == TRAINER_IMAGE
    command = pool["container_spec"]["command"]
    assert command[:5] == [
        "python", "-m", "tfx.scripts.run_executor",
        "--executor_class_path", "components.runtime_gate.TrainerExecutor",
    ]  # fmt: skip
    # The run's values were checked and folded into the trainer config before the job was created; they
    # travel in the job's command.
    properties = exec_properties_of(command)
    assert "train_epochs" not in properties and "target_top1" not in properties
    loop = json.loads(json.loads(properties["custom_config"])["trainer_config"])["loop"]
    assert {name: loop[name] for name in ("train_epochs", "target_top1")} == trainer_values()
    # A run of its own: the compiled name plus its start, the pipeline's labels and the run's (by which the run's
    # exit handler finds the job, components.run_cleanup), a timeout and restarts.
    custom_job = record["custom_job"]
    assert custom_job["display_name"].startswith("effnet-smoke-trainer-")
    assert {key: custom_job["labels"][key] for key in ("effnet-pipeline", "effnet-preset", "effnet_run")} == {
        "effnet-pipeline": "effnet-smoke",
        "effnet-preset": "smoke",
        "effnet_run": kfp_launcher.DEFAULT_RUN_ID,
    }
    assert spec["scheduling"]["restart_job_on_worker_restart"] is True
    assert spec["scheduling"]["timeout"] == "7200s"  # the smoke run's estimate is minutes: the 2-hour floor

    model = trainer.artifact("model")
    assert os.path.isfile(os.path.join(model["uri"], "Format-Serving", "saved_model.pb"))
    run_dir = trainer.artifact("model_run")["uri"]
    with open(os.path.join(run_dir, "config.json")) as f:
        config = json.load(f)
    loop = config["config"]["loop"]
    assert {name: loop[name] for name in ("train_epochs", "target_top1")} == trainer_values()
    with open(os.path.join(run_dir, "metrics.json")) as f:
        metrics = json.load(f)
    # The target (0.0) is met at the first evaluation, after one of the three epochs planned.
    assert metrics["target_top1"] == RUN["target_top1"] and metrics["target_reached"]
    assert metrics["steps"] == config["plan"]["total_steps"] // RUN["train_epochs"]


@pytest.mark.slow
def test_a_trainer_launcher_killed_mid_job_is_retried_and_follows_its_one_job_to_the_end(trainer, local_run):
    """The compiled retry policy (``spec_patches.RETRY_POLICY``) re-ran the killed task; the retry created no
    second job and cancelled nothing, and the job it followed wrote the model (the other tests of this module read
    it). Vertex's faults were met by both attempts' calls and waited out."""
    from pipeline import spec_patches

    assert kfp_launcher.retry_policy(local_run.job, TRAINER) == spec_patches.RETRY_POLICY
    assert trainer.attempts == 2
    vertex = local_run.out / "vertex"
    assert sorted(p.name for p in vertex.glob("custom_job-*.json")) == [
        "custom_job-1.json",
        "custom_job-1.pids.json",
    ]
    assert not list(vertex.glob("*.cancel.json"))
    assert {met["fault"] for met in trainer.faults_met} == {"503", "drop", "429", "500", "slow:2"}
    assert len({met["pid"] for met in trainer.faults_met}) == 2  # both attempts met faults
    log = pathlib.Path(trainer.result.log_path).read_text(errors="replace")
    assert "following training job projects/effnet-test-project/locations/us-central1/customJobs/1" in log


@pytest.mark.slow
def test_evaluator_gates_at_the_run_target(local_run, trainer, evaluator):
    evaluation = evaluator.artifact("evaluation")["uri"]
    top1 = overall_metrics(evaluation)["sparse_categorical_accuracy"]
    assert top1 < COMPILED["target_top1"]  # the compiled gate would refuse this model...
    blessing = evaluator.artifact("blessing")
    assert blessing["metadata"]["blessed"] == 1  # ...the run's target blesses it
    assert blessing["metadata"]["top1"] == top1  # what the Pusher hands on to the Model Registry
    assert os.path.exists(os.path.join(blessing["uri"], "BLESSED"))
    assert blessing["metadata"]["current_model_id"] == trainer.artifact("model")["name"]
    # The blessing names its pipeline: the compiled latest-blessed-model lookup asks for this pipeline's only.
    assert blessing["metadata"][runtime_gate.BASELINE_SCOPE_PROPERTY] == "effnet-smoke"
    assert tfma.load_validation_result(evaluation).validation_ok


@pytest.mark.slow
def test_the_run_page_gets_the_trainers_and_evaluators_metrics_and_the_report(local_run, trainer, evaluator):
    """The compiled Trainer and Evaluator declare ``system.Metrics`` outputs and the Trainer a ``system.HTML``
    one (what the Vertex and Kubeflow run pages show); their containers write them: the metrics as the
    artifacts' metadata, the Evaluator's top-1 TFMA's, the report one self-contained HTML file at its URI."""
    components = kfp_launcher.pipeline_spec(local_run.job)["components"]
    declared = {
        name: {
            key: d["artifactType"].get("schemaTitle")
            for key, d in components[name]["outputDefinitions"]["artifacts"].items()
        }
        for name in (TRAINER, EVALUATOR)
    }
    assert declared[TRAINER]["trainer_metrics"] == "system.Metrics"
    assert declared[TRAINER]["run_report"] == "system.HTML"
    assert declared[EVALUATOR]["evaluator_metrics"] == "system.Metrics"

    trained = trainer.artifact("trainer_metrics")["metadata"]
    with open(os.path.join(trainer.artifact("model_run")["uri"], "metrics.json")) as f:
        result = json.load(f)
    assert trained["trainer_top1"] == result["final_top1"] and trained["steps"] == result["steps"]
    assert trained["display_name"] == "Trainer: the training run"
    # Where the Trainer step's time went: its goodput and largest badput parts, from the account beside its
    # metrics: the training's own parts, and around them the job's queue and start-up (create_time to start_time,
    # then to the training's start) and the step's own time.
    account = result["time_account"]
    assert account["start"] < result["training_time_account"]["start"] and account["wall_seconds"] > 0
    assert {"PROVISIONING", "WORKER_SETUP", "GOODPUT", "TRAINER_STEP"} <= set(account["parts"])
    assert trained["goodput"] == pytest.approx(account["goodput"], abs=1e-4) and 0 < trained["goodput"] < 1
    assert trained["wall_seconds"] == pytest.approx(account["wall_seconds"], abs=1e-2)
    badput = {key: value for key, value in trained.items() if key.startswith("badput_")}
    assert len(badput) == 3 and all(value > 0 for value in badput.values()), badput
    gate = evaluator.artifact("evaluator_metrics")["metadata"]
    evaluation = overall_metrics(evaluator.artifact("evaluation")["uri"])
    assert gate["evaluator_top1"] == evaluation["sparse_categorical_accuracy"]
    assert gate["blessed"] == 1.0 and "not_blessed_because" not in gate
    assert gate["gate_top1"] == RUN["target_top1"]
    # Experiments merges a run's metrics artifacts into one row: no key but the label is in both.
    assert set(trained) & set(gate) == {"display_name"}

    report = trainer.artifact("run_report")["uri"]
    with open(report) as f:  # the file itself, at the artifact's URI
        page = f.read()
    assert page.startswith("<!doctype html>")
    assert "data:image/png;base64," in page and 'src="report_' not in page
    # Drawn again with the step's account and the plan on the run's machine beside what was measured.
    assert "goodput (training steps that count" in page and "time: plan / measured" in page
    planned = result["planned"]  # the estimate on the compiled accelerator, and the hours the job held it
    assert planned["hours"] > 0 and planned["held_hours"] > 0 and planned["accelerator"] == "cpu"


@pytest.mark.slow
def test_sharding_step_reads_and_writes_gcs(gcs_bucket, clean_archives, tmp_path):
    """The sharding step with its archives and the compiled gs:// root on the GCS emulator, as on Vertex.

    Only this step runs on gs:// here: the Trainer, TFMA and the Pusher go through TensorFlow's own gs://, which
    cannot reach the emulator. Beam's GCS client finds it through STORAGE_EMULATOR_HOST, given to the container.
    """
    emulator, bucket = gcs_bucket
    archives = gcs_emulator.upload_archives(f"{bucket}/vertex-inputs", clean_archives)
    root = f"{bucket}/vertex-root"
    job = compile_job(tmp_path, root, *archives)
    parameters = kfp_launcher.runtime_parameters(job, {"train_shards": RUN["train_shards"]})
    result = kfp_launcher.run_task(
        job, SHARDS, root, str(tmp_path / "launcher"), parameters,
        env={"STORAGE_EMULATOR_HOST": emulator.host},
    )  # fmt: skip
    uri = result.artifact("examples")["uri"]
    assert uri == f"{root}/{SHARDS}/examples/1"
    assert result.artifact("examples")["metadata"]["train_records"] == len(clean_archives.train)
    # Everything the step left under the root: the shards and the manifest, no spill, no Beam temp files.
    left = emulator.list_objects(bucket.removeprefix("gs://"), "vertex-root/")
    assert left == [f"{uri}/{name}" for name in shard_files()]
    manifest = Manifest.read(f"{uri}/manifest.json")
    assert manifest.split(schema.VALIDATION).num_examples == len(clean_archives.validation)


def smoke_run(out_dir, clean_archives, *extra) -> LocalRun:
    """The smoke preset compiled for CPU machines with ``extra`` flags, to be run on a local root."""
    output = os.path.join(out_dir, "effnet.json")
    argv = [
        "--output", output, "--project", PROJECT, "--region", REGION, "--pipeline-root", "gs://b/p",
        "--image", PIPELINE_IMAGE, "--trainer-image", TRAINER_IMAGE, "--accelerator", "cpu", "--preset", "smoke",
        "--train-archive", clean_archives.train_archive, "--val-archive", clean_archives.val_archive,
        "--param", "target_top1=0.0", *extra,
    ]  # fmt: skip
    assert kubeflow_v2_runner.main(argv) == 0
    with open(output) as f:
        job = json.load(f)
    return LocalRun(job, out_dir, kfp_launcher.runtime_parameters(job))


def _wait_for(predicate, what: str, timeout: float = 300.0, process=None) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the task ended (exit {process.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout:.0f} s")
        time.sleep(0.5)


@pytest.mark.slow
def test_stopping_the_training_task_cancels_its_job(local_run, shards):
    """A cancelled pipeline run stops its tasks with SIGTERM: the Trainer task cancels its training job (no
    machine left training and billing) and fails with one line, instead of exiting while the job runs on."""
    import signal

    vertex = local_run.out / "vertex-cancel"
    # Many epochs: the job is still training when the task is stopped.
    parameters = {**local_run.parameters, "train_epochs": 200, "target_top1": 1.0}
    started = kfp_launcher.start_task(
        local_run.job, TRAINER, local_run.root, str(local_run.out / "launcher-cancel"), parameters,
        {SHARDS: shards}, execution=2, wrapper=fake_vertex.wrapper(str(vertex)),
    )  # fmt: skip
    replica_log = vertex / fake_vertex.LOG_FILE.format(n=1, replica="workerpool0-0")

    def training() -> bool:  # the replica has started its train-and-eval loop
        return replica_log.exists() and "Training model." in replica_log.read_text(errors="replace")

    _wait_for(training, "training in the job", process=started.process)
    started.process.send_signal(signal.SIGTERM)
    assert started.process.wait(timeout=120) != 0
    with open(vertex / fake_vertex.CANCEL_FILE.format(n=1)) as f:
        cancel = json.load(f)
    assert cancel["name"] == f"projects/{PROJECT}/locations/{REGION}/customJobs/1"
    assert cancel["running"] == ["workerpool0-0"]  # it was training when cancelled
    log = pathlib.Path(started.log_path).read_text(errors="replace")
    assert (
        "training job projects/effnet-test-project/locations/us-central1/customJobs/1 is JOB_STATE_CANCELLED"
        in log
    )
    assert "TaskStopped: the pipeline task received SIGTERM" in log


@pytest.mark.slow
def test_multi_worker_training_through_the_cloud_executor(tmp_path, clean_archives):
    """Two CPU machines, one replica each, as Vertex runs them: every replica runs the TFX executor the job's
    command names, with the TF_CONFIG Vertex sets (chief + worker 0), MultiWorkerMirroredStrategy over loopback.
    Only the chief writes the model; the worker's executor ends without TFX's model check, whichever finishes
    first, and the job succeeds."""
    run = smoke_run(tmp_path, clean_archives, "--machines", "2", "--set", "data.num_cores=2",
                    "--param", "train_shards=2", "--param", "val_shards=2")  # fmt: skip
    shards = run.run(SHARDS)
    vertex = tmp_path / "vertex"
    trainer = run.run(TRAINER, [shards], wrapper=fake_vertex.wrapper(str(vertex)))
    with open(vertex / fake_vertex.RECORD_FILE.format(n=1)) as f:
        pools = json.load(f)["custom_job"]["job_spec"]["worker_pool_specs"]
    assert [pool["replica_count"] for pool in pools] == [1, 1]
    model = trainer.artifact("model")
    assert os.path.isfile(os.path.join(model["uri"], "Format-Serving", "saved_model.pb"))
    worker_log = (vertex / fake_vertex.LOG_FILE.format(n=1, replica="workerpool1-0")).read_text()
    assert "run_fn failed to generate model" not in worker_log
    with open(os.path.join(trainer.artifact("model_run")["uri"], "metrics.json")) as f:
        metrics = json.load(f)
    assert metrics["replicas"] == 2


@pytest.mark.slow
def test_tuning_step_runs_parallel_trials_as_a_vertex_job_and_writes_the_best_values(
    tmp_path, clean_archives, shards
):
    """``--tune``: the compiled Tuner task starts one Vertex job of two machines (TFX's tuning flock: the
    chief runs the search's oracle and trials, the worker trials), each trial a run of the trainer, and writes
    the best values. (The shards are the module's: the sharding step is the same whatever follows it.) That the
    compiled Trainer takes this output is tests/test_vertex.py's; that TFX's Trainer trains with the Tuner's
    values, the local ``--tune`` pipeline's (tests/test_pipeline.py): the Trainer task is not run again here."""
    tune = ["--tune", "--tune-search", "random", "--tune-max-trials", "2", "--tune-max-epochs", "1"]
    run = smoke_run(tmp_path, clean_archives, *tune, "--tune-parallel-trials", "2")
    vertex = tmp_path / "vertex"
    tuner = run.run("Tuner", [shards], wrapper=fake_vertex.wrapper(str(vertex)))
    with open(vertex / fake_vertex.RECORD_FILE.format(n=1)) as f:
        custom_job = json.load(f)["custom_job"]
    pools = custom_job["job_spec"]["worker_pool_specs"]
    assert [pool["replica_count"] for pool in pools] == [1, 1]
    assert (
        "tfx.extensions.google_cloud_ai_platform.tuner.executor._WorkerExecutor"
        in pools[0]["container_spec"]["command"]
    )
    assert custom_job["display_name"].startswith("effnet-smoke-tuner-")
    best_file = os.path.join(tuner.artifact("best_hyperparameters")["uri"], "best_hyperparameters.txt")
    with open(best_file) as f:
        best = json.load(f)["values"]
    assert "schedule.lr_per_256" in best  # a value of the search's space, which the Trainer task would take
    # The flock ran both of the search's trials and scored them.
    results = os.path.join(tuner.artifact("tuner_results")["uri"], "tuner_results.json")
    with open(results) as f:
        assert len(json.load(f)) == 2
