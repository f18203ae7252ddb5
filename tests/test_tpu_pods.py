"""The paper's scale from the cloud runner: multi-host TPU slices planned, refused before anything is written,
and compiled for Vertex AI Pipelines and Kubeflow with the Trainer on a queued resource (components.tpu_vm)."""

import json

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
    assert "components.runtime_gate.TpuVmTrainerExecutor" in args
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
    }
    cleanup = json.dumps(spec["root"]["dag"]["tasks"]) + json.dumps(spec.get("components", {}))
    assert '"tpu_zone"' in cleanup and "us-central2-b" in json.dumps(spec)
