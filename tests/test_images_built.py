"""The images as built by a real Docker daemon (scripts/images.sh), and the compiled pipeline run in them.

``kfp_launcher`` runs each task of the compiled Vertex PipelineJob as ``docker run`` of the image the spec names,
with the spec's command as the entry point and its args filled in as the launcher fills them; the Trainer task's
Vertex AI custom job runs its replica as ``docker run`` of the job's image (``fake_vertex.ReplicaImages``). The
cloud services are the suite's fakes on 127.0.0.1 (Vertex's job service, Dataflow's jobs API, the metadata
server); the deviations are kfp_launcher's (the DirectRunner for the sharding step, no baseline, a local root).
The images stand on this machine's stand-ins for what it cannot reach (docs/images.md).
"""

import json
import os
import pathlib
import shutil
import subprocess

import fake_vertex
import kfp_launcher
import pytest
import suite_env

from components import run_cleanup
from pipeline import kubeflow_v2_runner

pytestmark = pytest.mark.slow

PROJECT = "effnet-test-project"
RUN_ID = "5d2e8f10-images-run"
# Values no model meets compiled in, and the run's, which bless a model trained briefly.
COMPILED = {"target_top1": 0.99, "train_epochs": 6, "train_shards": 2}
RUN = {"target_top1": 0.0, "train_epochs": 4, "train_shards": 2}
DOCKER_SOCKET = "/var/run/docker.sock"


def docker_run(image: str, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", "run", "--rm", "--network", "none", image, *command],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_trainer_tpu_image_has_the_tpu_build_of_tensorflow_alone_and_imports_the_project(local_images):
    listed = docker_run(local_images["trainer-tpu"], "pip", "list", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    installed = {p["name"].lower(): p["version"] for p in json.loads(listed.stdout)}
    assert installed["tensorflow-tpu"] == "2.16.2" and "libtpu" in installed
    assert "tensorflow" not in installed
    imported = docker_run(
        local_images["trainer-tpu"],
        "python", "-c", "import beam_preprocess, components, effnet_common, pipeline, trainer_module, tensorflow as tf; "
        "print(tf.__version__)",
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr[-2000:]
    assert imported.stdout.strip().splitlines()[-1] == "2.16.2"


def test_the_pipeline_image_starts_with_the_boot_program_and_has_the_cpu_build(local_images):
    listed = docker_run(
        local_images["pipeline"], "--version"
    )  # the entry point: Beam's boot (a stand-in here)
    inspect = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config.Entrypoint}}", local_images["pipeline"]],
        capture_output=True,
        text=True,
    )
    assert json.loads(inspect.stdout) == ["/opt/apache/beam/boot"]
    assert listed.returncode != 0  # the stand-in says what it is and fails
    pip = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "pip", local_images["pipeline"], "list",
         "--format", "json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    installed = {p["name"].lower() for p in json.loads(pip.stdout)}
    assert "tensorflow" in installed and "tensorflow-tpu" not in installed


def compile_job(out: pathlib.Path, images: dict, train_archive: str, val_archive: str) -> dict:
    """The Vertex PipelineJob the cloud runner writes for the demo preset with the images built here."""
    output = out / "effnet.json"
    argv = [
        "--output", str(output), "--project", PROJECT, "--pipeline-root", "gs://effnet-test-bucket/pipelines",
        "--image", images["pipeline"], "--trainer-image", images["trainer-tpu"], "--accelerator", "cpu",
        "--preset", "demo", "--set", "loop.eval_every_epochs=2",
        "--train-archive", train_archive, "--val-archive", val_archive,
        *[f"--param={name}={value}" for name, value in COMPILED.items()],
    ]  # fmt: skip
    assert kubeflow_v2_runner.main(argv) == 0
    return json.loads(output.read_text())


def test_the_compiled_pipeline_runs_task_by_task_in_its_images_and_pushes(
    local_images, clean_archives, gce_metadata, tmp_path
):
    from fake_dataflow import FakeDataflow

    job = compile_job(tmp_path, local_images, clean_archives.train_archive, clean_archives.val_archive)
    parameters = kfp_launcher.runtime_parameters(job, RUN)
    root, scratch = str(tmp_path / "root"), str(tmp_path / "launcher")
    docker = shutil.which("docker")
    archives = os.path.dirname(clean_archives.train_archive)
    images = kfp_launcher.Images(docker, shared=(str(tmp_path), archives))
    # The Trainer task's fake Vertex starts the job's replica in its image through this machine's daemon.
    trainer_images = kfp_launcher.Images(docker, shared=(str(tmp_path), archives, docker, DOCKER_SOCKET))
    replicas = fake_vertex.ReplicaImages(
        docker, (str(tmp_path),), {k: os.environ[k] for k in suite_env.PINNED if k in os.environ}
    )
    record = str(tmp_path / "vertex")

    def run(task, upstream=(), **kwargs):
        results = {result.task: result for result in upstream}
        return kfp_launcher.run_task(
            job, task, root, scratch, parameters, results, run_id=RUN_ID, images=kwargs.pop("images", images),
            **kwargs,
        )  # fmt: skip

    try:
        shards = run("ImageNetShardGen")
        trainer = run(
            "Trainer",
            [shards],
            images=trainer_images,
            wrapper=fake_vertex.wrapper(record, in_images=replicas),
        )
        evaluator = run("Evaluator", [shards, trainer])
        pusher = run("Pusher", [trainer, evaluator])
        jobs_file = str(tmp_path / "custom_jobs.json")
        fake_vertex.FakeProjectJobs(jobs_file, {PROJECT: "123456789012"}).write([])
        dataflow = FakeDataflow()
        try:
            cleanup = run(
                run_cleanup.STEP_ID, dataflow=dataflow.beam_args(),
                wrapper=fake_vertex.project_jobs_wrapper(str(tmp_path / "vertex-cleanup"), jobs_file),
            )  # fmt: skip
        finally:
            dataflow.stop()
    finally:
        fake_vertex.stop_all(record)

    ran = {}
    for result in (shards, trainer, evaluator, pusher, cleanup):
        argv = list(result.argv)
        # docker run ... --entrypoint COMMAND[0] IMAGE COMMAND[1:] ARGS: the spec's command, in the spec's image.
        image = argv[argv.index("--entrypoint") + 2]
        assert image == kfp_launcher.task_image(job, result.task)
        ran[result.task] = image
    assert ran == {
        "ImageNetShardGen": local_images["pipeline"],
        "Trainer": local_images["pipeline"],
        "Evaluator": local_images["pipeline"],
        "Pusher": local_images["pipeline"],
        run_cleanup.STEP_ID: local_images["pipeline"],
    }
    # The training job's replica ran in the trainer image.
    request = pathlib.Path(record) / fake_vertex.RECORD_FILE.format(n=1)
    assert not (pathlib.Path(record) / fake_vertex.RECORD_FILE.format(n=2)).exists()  # one job
    pool = json.loads(request.read_text())["custom_job"]["job_spec"]["worker_pool_specs"][0]
    assert pool["container_spec"]["image_uri"] == local_images["trainer-tpu"]
    replica_log = pathlib.Path(record) / fake_vertex.LOG_FILE.format(n=1, replica="workerpool0-0")
    assert "Training complete." in replica_log.read_text(errors="replace")

    blessing = pathlib.Path(evaluator.artifact("blessing")["uri"])
    assert (blessing / "BLESSED").exists()
    pushed = pusher.artifact("pushed_model")
    destination = pushed["metadata"]["pushed_destination"]
    assert pushed["metadata"]["pushed"] == 1
    assert (pathlib.Path(destination) / "saved_model.pb").is_file()
    assert f"run {RUN_ID}" in pathlib.Path(cleanup.log_path).read_text()
