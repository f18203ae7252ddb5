"""The paper's scale from the cloud runner: multi-host TPU slices planned, refused before anything is written,
and compiled for Vertex AI Pipelines and Kubeflow with the Trainer on a queued resource (components.tpu_vm)."""

import json
import pathlib

import fake_vertex
import kfp_launcher
import pytest
import yaml

from components import accelerators, tpu_slices
from pipeline import kubeflow_v2_runner

IMAGE = "us-docker.pkg.dev/p/effnet/pipeline@sha256:" + "a" * 64
SLICE_RUN = [
    "--project", "p", "--region", "us-central2", "--image", IMAGE, "--pipeline-root", "gs://b/root",
    "--accelerator", "tpu-v4-32", "--preset", "smoke", "--provisioning", "spot",
    "--set", "data.num_cores=16", "--set", "data.global_batch_size=64", "--set", "data.num_train_examples=256",
    "--param", "train_shards=4", "--param", "val_shards=4",
    "--train-archive", "gs://b/ILSVRC2012_img_train.tar", "--val-archive", "gs://b/ILSVRC2012_img_val.tar",
]  # fmt: skip


@pytest.mark.parametrize(
    "name, chips, replicas, hosts, grid, torus",
    [
        ("tpu-v3-32", 16, 32, 4, (4, 4), False),
        ("tpu-v3-1024", 512, 1024, 128, (16, 32), False),
        ("tpu-v3-2048", 1024, 2048, 256, (32, 32), True),
        ("tpu-v4-32", 16, 16, 4, (2, 2, 4), False),
        ("tpu-v4-128", 64, 64, 16, (4, 4, 4), True),
        ("tpu-v5p-1024", 512, 512, 128, (8, 8, 8), True),
        ("tpu-v5litepod-16", 16, 16, 4, (4, 4), False),
        ("tpu-v5litepod-256", 256, 256, 64, (16, 16), True),
    ],
)
def test_the_slice_catalog_counts_chips_replicas_hosts_and_the_grid(
    name, chips, replicas, hosts, grid, torus
):
    slice_type = tpu_slices.SLICES[name]
    assert (slice_type.chips, slice_type.replicas, slice_type.hosts) == (chips, replicas, hosts)
    assert (slice_type.grid, slice_type.torus) == (grid, torus)
    machine = accelerators.get(name)
    assert (machine.backend, machine.replicas, machine.hosts, machine.units) == (
        "tpu_vm",
        replicas,
        hosts,
        chips,
    )
    assert machine.trainer_settings() == {"loop.strategy": "tpu", "data.replicas_per_host": replicas // hosts}


def test_the_plan_of_the_papers_b5_on_a_v3_1024_pod_gives_hosts_per_host_batch_groups_and_cost(capsys):
    code = kubeflow_v2_runner.main(
        ["--plan", "--preset", "b5-lars-1024x65536", "--accelerator", "tpu-v3-1024"]
    )
    assert code == 0
    plan = json.loads(capsys.readouterr().out)
    pod = plan["tpu_vm"]
    assert (plan["derived"]["replicas"], plan["derived"]["hosts"]) == (1024, 128)
    assert (pod["hosts"], pod["replicas_per_host"], pod["per_host_batch"], pod["shards_per_host"]) == (
        128,
        8,
        512,
        8,
    )
    assert pod["batch_norm_groups"] == {
        "replicas_per_group": 2,
        "groups": 512,
        "each_on": "the cores of one chip",
    }
    assert pod["runtime_version"] == tpu_slices.POD_RUNTIME and "europe-west4-a" in pod["zones"]
    cost = pod["cost_usd"]
    assert cost["chip_hours"] == pytest.approx(plan["estimate"]["accelerator_hours"], abs=0.1)
    assert cost["on_demand"] == round(cost["chip_hours"] * 2.00) and cost["spot"] < cost["on_demand"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--plan", "--preset", "b5-lars-1024x65536", "--accelerator", "tpu-v4-1024"],
            "error: preset b5-lars-1024x65536 needs 1024 replicas; tpu-v4-1024 has 512 (TensorFlow sees one device "
            "per v4 chip)",
        ),
        (
            ["--output", "OUT", *SLICE_RUN[:-8], "--param", "train_shards=6", *SLICE_RUN[-4:]],
            "error: train_shards=6 must be a multiple of num_hosts=4 (or 0 to derive)",
        ),
        (
            ["--output", "OUT", *SLICE_RUN, "--zone", "us-central2-a"],
            "error: --zone us-central2-a: tpu-v4-32 is offered in us-central2-b",
        ),
        (
            ["--output", "OUT", *SLICE_RUN, "--region", "us-east1"],
            "error: --region us-east1: tpu-v4-32 is offered in the zones us-central2-b (--skip-region-check if it is "
            "offered in us-east1 now)",
        ),
        (
            ["--output", "OUT", *SLICE_RUN, "--tune"],
            "error: --tune: the Tuner's trials run on Vertex AI machines, and tpu-v4-32 is a TPU VM slice",
        ),
    ],
)
def test_a_slice_that_does_not_fit_is_refused_in_one_line_before_anything_is_written(
    argv, message, tmp_path, capsys
):
    output = tmp_path / "pod.json"
    argv = [str(output) if arg == "OUT" else arg for arg in argv]
    assert kubeflow_v2_runner.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message), err
    assert not output.exists()


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_pod_run_compiles_its_trainer_onto_a_queued_resource_and_its_exit_task_onto_the_zone(
    suffix, tmp_path, capsys
):
    output = tmp_path / f"pod{suffix}"
    assert kubeflow_v2_runner.main(["--output", str(output), *SLICE_RUN]) == 0
    assert "on tpu-v4-32 (16 replicas)" in capsys.readouterr().out
    text = output.read_text()
    spec = json.loads(text)["pipelineSpec"] if suffix == ".json" else yaml.safe_load(text)
    executors = spec["deploymentSpec"]["executors"]
    trainer = next(e for name, e in executors.items() if name.startswith("Trainer"))["container"]
    args = trainer["args"]
    assert "components.tpu_vm_trainer.TpuVmTrainerExecutor" in args
    tasks = spec["components"]["tfx-dag"]["dag"]["tasks"]
    compiled = tasks["Trainer"]["inputs"]["parameters"]["custom_config"]
    custom_config = json.loads(compiled["runtimeValue"]["constant"])
    assert custom_config["tpu_vm"] == {
        "project": "p",
        "zone": "us-central2-b",
        "accelerator": "tpu-v4-32",
        "tier": "spot",
        "reservation": "",
        "max_wait_seconds": 24 * 3600,
        "service_account": "",
        "max_recreations": 2,
        "labels": {"effnet-pipeline": "effnet-smoke", "effnet-preset": "smoke"},
        "api_endpoint": "tpu.googleapis.com",
        "image": IMAGE,  # no --trainer-image: worker 0 trains in --image
        "poll_seconds": 30.0,
    }
    cleanup = json.dumps(spec["root"]["dag"]["tasks"]) + json.dumps(spec.get("components", {}))
    assert '"tpu_zone"' in cleanup and "us-central2-b" in json.dumps(spec)


# ---- the compiled steps, run as their containers run them, against the rehearsal Cloud TPU API ------------

RUN_ID, OTHER_RUN = "4f1c2a3b-pod-run", "9e8d7c6b-other-run"


def _poll_every_second(job: dict) -> None:
    """Sets the compiled Trainer step's poll interval (its ``tpu_vm`` settings' ``poll_seconds``) to 1 s, as the
    local runner's rehearsal does: the rehearsed service answers at once, where Cloud TPU takes minutes, and the
    step's 30 s would be most of the test's time."""
    from components import tpu_vm

    constant = kfp_launcher.task_path(job, "Trainer")[-1]["inputs"]["parameters"]["custom_config"][
        "runtimeValue"
    ]
    custom_config = json.loads(constant["constant"])
    custom_config[tpu_vm.CONFIG_KEY]["poll_seconds"] = 1.0
    constant["constant"] = json.dumps(custom_config)


@pytest.mark.slow
def test_the_compiled_trainer_task_trains_on_the_slice_and_the_exit_task_deletes_the_runs_slices(
    tmp_path, clean_archives, local_images
):
    """The Vertex job's Trainer task on ``tpu-v4-32``, as its container runs it, against the rehearsal: one
    queued resource of that type with the TF pod runtime, Spot, the run's labels; the 4 workers report, and
    worker 0 alone trains, in the trainer-tpu image (the TPU build of TensorFlow, nothing installed at boot),
    with TPU_NAME naming the slice, which TensorFlow's resolver finds the 4 hosts of through the metadata
    server and the Cloud TPU API (then one logical CPU stands in for its 16 replicas, with the slice's global
    batch). Its first attempt is killed outright while worker 0 trains: the retry re-attaches to the slice,
    creates no second one, and its model is the Trainer's artifact; no slice or container is left. A slice a
    killed task left behind is deleted by the run's exit task, by the run's label; another run's is left
    alone."""
    from fake_dataflow import FakeDataflow

    from components import run_cleanup, run_label, slice_files, tpu_vm
    from pipeline import rehearsal_tpu_api

    output = tmp_path / "pod.json"
    argv = [arg for arg in SLICE_RUN]
    argv[argv.index("--image") + 1] = local_images["trainer-tpu"]  # every step's image: worker 0's too
    argv[argv.index("--train-archive") + 1] = clean_archives.train_archive
    argv[argv.index("--val-archive") + 1] = clean_archives.val_archive
    argv += ["--set", "data.num_train_examples=300", "--param", "target_top1=0.0"]
    assert kubeflow_v2_runner.main(["--output", str(output), *argv]) == 0
    job = json.loads(output.read_text())
    _poll_every_second(job)
    parameters = kfp_launcher.runtime_parameters(job)
    root, scratch = str(tmp_path / "root"), str(tmp_path / "launcher")
    # One logical CPU stands in for the slice's 16 replicas: tracing a step per replica takes minutes here.
    scenario = rehearsal_tpu_api.Scenario(stand_in_replicas=1)
    with rehearsal_tpu_api.RehearsalTpuApi(str(tmp_path / "hosts"), scenario, shared=(str(tmp_path),)) as api:
        env = {tpu_vm.ENDPOINT_VARIABLE: api.endpoint}
        shards = kfp_launcher.run_task(
            job, "ImageNetShardGen", root, scratch, parameters, env=env, run_id=RUN_ID
        )
        seen = {}

        def worker_0_trains(started) -> bool:
            homes = sorted((tmp_path / "hosts").glob("*/worker-*"))
            logs = [home / "startup-script.log" for home in homes]
            training = [log for log in logs if "Training model." in _text(log)]
            if not training:
                return False
            seen.update(homes=homes, logs=training, text=_text(training[0]))
            return True

        trainer, attempts = kfp_launcher.run_task_retried(
            job, "Trainer", root, scratch, parameters, {"ImageNetShardGen": shards}, kill_first_when=worker_0_trains,
            backoff_scale=0.0, env=env, run_id=RUN_ID,
        )  # fmt: skip
        assert attempts == 2
        # While it trained: four hosts, a trainer on worker 0 alone, which TPU_NAME named the slice.
        assert [home.name for home in seen["homes"]] == [f"worker-{n}" for n in range(4)]
        assert [log.parent.name for log in seen["logs"]] == ["worker-0"]
        node_name = seen["logs"][0].parent.parent.name
        assert (
            f"rehearsal: TPUClusterResolver('{node_name}') found the slice's 4 TPU workers through the Cloud TPU "
            "API: 127.0.0.1:8470, 127.0.0.1:8471, 127.0.0.1:8472, 127.0.0.1:8473\n"
        ) in seen["text"]
        assert f"stand in for the replicas of TPU slice {node_name}\n" in seen["text"]
        assert api.calls("GET", f"/v1/projects/p/locations/us-central2-b/nodes/{node_name}")
        (created,) = api.calls("POST", "/queuedResources")  # the retry re-attached
        body = created["body"]
        node = body["tpu"]["nodeSpec"][0]["node"]
        assert (node["acceleratorType"], node["runtimeVersion"]) == ("v4-32", tpu_slices.POD_RUNTIME)
        assert body["spot"] == {} and node["labels"][run_label.RUN_LABEL] == run_label.run_value(RUN_ID)
        assert node["labels"]["effnet-pipeline"] == "effnet-smoke"
        model_run = trainer.artifact("model_run")["uri"]
        attempt_dir = (
            pathlib.Path(model_run) / slice_files.STATUS_DIR / created["query"]["queuedResourceId"][0]
        )
        reports = {p.name: json.loads(p.read_text()) for p in attempt_dir.glob("*.json")}
        assert sorted(reports) == ["trainer.json", *(f"worker-{n}.json" for n in range(4))]
        assert reports["trainer.json"]["exit_code"] == 0
        # Worker 0 trained with the TPU build alone; the others installed and ran nothing.
        assert reports["worker-0.json"]["image"] == local_images["trainer-tpu"]
        assert reports["worker-0.json"]["tensorflow"] == ["libtpu==2.16.0rc0", "tensorflow-tpu==2.16.2"]
        for n in range(1, 4):
            assert set(reports[f"worker-{n}.json"]) == {"worker", "setup", "host"}, reports
        command = json.loads((pathlib.Path(model_run) / slice_files.STATUS_DIR / "command.json").read_text())
        assert "tfx.scripts.run_executor" in command["command"]
        config = json.loads((pathlib.Path(model_run) / "config.json").read_text())["config"]
        assert config["data"]["global_batch_size"] == 64  # the slice's batch, on its stand-in
        model = trainer.artifact("model")["uri"]
        assert (pathlib.Path(model) / "Format-Serving" / "saved_model.pb").is_file()
        assert api.slices() == {} and list((tmp_path / "hosts").iterdir()) == []  # hosts and their disks gone
        assert not _containers(f"effnet-trainer-{node_name}")

        # Slices a killed task left (its pod evicted before it could delete them), of this run and another.
        client = tpu_vm.client_for(api.endpoint)
        requests = [
            tpu_vm.SliceRequest(
                settings=tpu_vm.SliceSettings(
                    project="p",
                    zone="us-central2-b",
                    accelerator="tpu-v4-32",
                    image="unused",
                    tier="spot",
                    max_wait_seconds=60,
                    labels={run_label.RUN_LABEL: run_label.run_value(run)},
                    api_endpoint=api.endpoint,
                ),
                name=f"effnet-left-by-{run}",
                status_dir=str(tmp_path / run),
                startup_script="#!/bin/bash\nsleep 600\n",
                runtime_version=tpu_slices.POD_RUNTIME,
            )  # fmt: skip
            for run in (RUN_ID, OTHER_RUN)
        ]
        for request in requests:
            tpu_vm.create(client, request, 0)
        mine, other = requests
        dataflow = FakeDataflow()
        try:
            jobs_file = str(tmp_path / "custom_jobs.json")
            fake_vertex.FakeProjectJobs(jobs_file, {"p": "123456789012"}).write([])
            cleanup = kfp_launcher.run_task(
                job, run_cleanup.STEP_ID, root, scratch, parameters, env=env, run_id=RUN_ID,
                dataflow=dataflow.beam_args(),
                wrapper=fake_vertex.project_jobs_wrapper(str(tmp_path / "vertex"), jobs_file),
            )  # fmt: skip
        finally:
            dataflow.stop()
        assert list(api.slices()) == [other.queued_resource_name(0)]  # another run's, left alone
        log = pathlib.Path(cleanup.log_path).read_text()
        assert f"run {RUN_ID}: cancelled 1 TPU slice ({mine.attempt_id(0)}: DELETED)" in log, log[-3000:]


def _text(path: pathlib.Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _containers(name: str) -> list[str]:
    """The containers (running or not) of this name."""
    import subprocess

    found = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"name=^{name}$"], capture_output=True, text=True, check=True
    )
    return found.stdout.split()
