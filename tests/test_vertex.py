"""Compiling for Vertex / Kubeflow: accelerators, the preset check, runtime parameters, images, networking.

Nothing here reaches Google Cloud: the compiled spec is parsed with KFP's own PipelineSpec proto and the
Vertex ``PipelineJob`` is built locally with anonymous credentials (the SDK validates it without the
network). ``test_vertex_steps.py`` runs the compiled steps.
"""

import json
import pathlib
import urllib.error
import urllib.request

import fake_vertex
import faults
import pytest
import yaml
from google.auth.credentials import AnonymousCredentials
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from components import accelerators, runtime_gate, vertex_pusher
from pipeline import compiler, kfp_submission, kubeflow_v2_runner, pipeline_def, submission, vertex_submission
from pipeline.template import Template, pipeline_tasks
from trainer_module import tfx_trainer
from trainer_module.config import TrainerConfig
from trainer_module.presets import get_preset

DIGEST = "@sha256:" + "0123456789abcdef" * 4
IMAGE = "us-docker.pkg.dev/my-project/effnet/pipeline" + DIGEST
TRAINER_IMAGE = "us-docker.pkg.dev/my-project/effnet/trainer-tpu" + DIGEST
PROJECT_NUMBER = 123456
NETWORK = f"projects/{PROJECT_NUMBER}/global/networks/effnet-vpc"
BASE = [
    "--project", "my-project", "--region", "us-central1", "--image", IMAGE, "--trainer-image", TRAINER_IMAGE,
    "--pipeline-root", "gs://my-bucket/pipelines",
    "--train-archive", "gs://my-bucket/ILSVRC2012_img_train.tar",
    "--val-archive", "gs://my-bucket/ILSVRC2012_img_val.tar",
]  # fmt: skip


def _compile(tmp_path, *extra, name="effnet.json"):
    output = tmp_path / name
    code = kubeflow_v2_runner.main(["--output", str(output), *BASE, *extra])
    return code, output


def _job(output):
    with open(output) as f:
        return json.load(f)


def _spec(job) -> pipeline_spec_pb2.PipelineSpec:
    spec = pipeline_spec_pb2.PipelineSpec()
    json_format.ParseDict(job["pipelineSpec"], spec, ignore_unknown_fields=True)
    return spec


def _tasks(job) -> dict:
    """The compiled steps by name (under the DAG the exit handler follows)."""
    return pipeline_tasks(job["pipelineSpec"])


def _custom_config(job) -> dict:
    parameters = _tasks(job)["Trainer"]["inputs"]["parameters"]
    return json.loads(parameters["custom_config"]["runtimeValue"]["constant"])


def _executor_args(job, task) -> list[str]:
    return job["pipelineSpec"]["deploymentSpec"]["executors"][f"{task}_executor"]["container"]["args"]


# ---- accelerators ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,machines,spec,replicas,strategy",
    [
        ("tpu-v3-8", 1, {"machine_type": "cloud-tpu", "accelerator_type": "TPU_V3", "accelerator_count": 8}, 8, "tpu"),
        ("tpu-v2-8", 1, {"machine_type": "cloud-tpu", "accelerator_type": "TPU_V2", "accelerator_count": 8}, 8, "tpu"),
        ("tpu-v5litepod-8", 1, {"machine_type": "ct5lp-hightpu-8t", "tpu_topology": "2x4"}, 8, "tpu"),
        ("tpu-v5litepod-4", 1, {"machine_type": "ct5lp-hightpu-4t", "tpu_topology": "2x2"}, 4, "tpu"),
        ("gpu-h100x8", 1, {"machine_type": "a3-highgpu-8g", "accelerator_type": "NVIDIA_H100_80GB",
                           "accelerator_count": 8}, 8, "mirrored"),
        ("gpu-a100x8", 4, {"machine_type": "a2-highgpu-8g", "accelerator_type": "NVIDIA_TESLA_A100",
                           "accelerator_count": 8}, 32, "multi_worker"),
        ("cpu", 1, {"machine_type": "n1-standard-8"}, 1, "one_device"),
    ],
)  # fmt: skip
def test_accelerators_compile_to_vertex_machine_specs(name, machines, spec, replicas, strategy):
    machine = accelerators.get(name, machines)
    assert machine.machine_spec() == spec
    assert (machine.replicas, machine.strategy) == (replicas, strategy)
    pools = machine.worker_pool_specs("img")
    # The primary pool is one replica; several machines add a worker pool of the rest, every pool with the image.
    assert [pool["replica_count"] for pool in pools] == ([1, machines - 1] if machines > 1 else [1])
    assert all(
        pool["container_spec"]["image_uri"] == "img" and pool["machine_spec"] == spec for pool in pools
    )
    # TensorFlow on v5e needs the PJRT plug-in variables; no other machine gets any.
    env = {e["name"]: e["value"] for e in pools[0]["container_spec"].get("env", [])}
    pjrt = {"NEXT_PLUGGABLE_DEVICE_USE_C_API": "true", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/lib/libtpu.so"}
    assert env == (pjrt if name.startswith("tpu-v5") else {})


@pytest.mark.parametrize(
    "name,machines,message",
    [
        (
            "tpu-v3-48",
            1,
            "TPU v3 comes as tpu-v3-8 on Vertex AI .* or slices of 32, .* through the Cloud TPU API",
        ),
        (
            "tpu-v4-8",
            1,
            "TPU v4 comes as slices of 16, 32, .*4096 TensorCores through the Cloud TPU API, not 8",
        ),
        ("tpu-v6e-8", 1, "no TensorFlow training on TPU v6e"),
        ("tpu-v3-512", 2, "--machines 2: tpu-v3-512 runs on one machine"),
        ("tpu-v3-8", 2, "--machines 2: tpu-v3-8 runs on one machine"),
        ("gpu-h100x8", 0, "--machines 0"),
        ("h100", 1, "--accelerator='h100' is not one of 'tpu-v2-8', 'tpu-v3-8'"),
    ],
)
def test_accelerators_vertex_does_not_offer_are_refused_with_where_to_go(name, machines, message):
    with pytest.raises(accelerators.AcceleratorMismatch, match=message):
        accelerators.get(name, machines)


def test_preset_is_checked_against_the_accelerator():
    paper = get_preset("b5-lars-1024x65536")
    with pytest.raises(
        accelerators.AcceleratorMismatch, match="^preset b5 needs 1024 replicas; tpu-v3-8 has 8$"
    ):
        accelerators.get("tpu-v3-8").check("b5", paper)
    with pytest.raises(accelerators.AcceleratorMismatch, match="needs 8 replicas; 2 x gpu-h100x8 has 16"):
        accelerators.get("gpu-h100x8", 2).check("b0", get_preset("b0-rmsprop-8x2048"))
    accelerators.get("tpu-v3-8").check("b0", get_preset("b0-rmsprop-8x2048"))  # fits: no exception
    accelerators.get("gpu-h100x8").check("b0", get_preset("b0-rmsprop-8x2048"))


# ---- the runner: checks before anything is written ------------------------------------------------------


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--preset", "b5-lars-1024x65536"], "error: preset b5-lars-1024x65536 needs 1024 replicas; tpu-v3-8 has 8"),
        (["--accelerator", "tpu-v3-48"], "error: --accelerator tpu-v3-48: TPU v3 comes as tpu-v3-8"),
        (["--network", "effnet-vpc"], "error: --network 'effnet-vpc' must be projects/PROJECT_NUMBER/"),
        (["--param", "epochs=3"], "error: --param epochs: not a runtime parameter; declared: target_top1,"),
        (["--param", "train_epochs=three"], "error: --param train_epochs=three: train_epochs takes int"),
        (["--param", "train_epochs=2.5"], "error: --param train_epochs=2.5: train_epochs takes int"),
        (["--provisioning", "cheap"], "error: --provisioning='cheap' is not one of 'standard', 'spot', 'flex-start'"),
        (["--provisioning", "spot", "--reservation", "projects/p/zones/us-central1-a/reservations/r"],
         "error: --reservation takes reserved machines; --provisioning spot asks for others"),
        (["--reservation", "r1"], "error: --reservation 'r1' must be projects/PROJECT/zones/ZONE/reservations/NAME"),
        (["--region", "asia-east1"],
         "error: --region asia-east1: Vertex AI training offers tpu-v3-8 in us-central1, us-east1, europe-west4"),
        (["--accelerator", "tpu-v5litepod-8", "--region", "europe-west1"],
         "Vertex AI training offers tpu-v5litepod-8 in us-central1,"),
        # Provisioning the service refuses for the machine: flex-start takes only some GPUs, a reservation
        # holds no Cloud TPU v2/v3 node and lies in the job's region.
        (["--provisioning", "flex-start"], "error: --provisioning flex-start: Vertex's Dynamic Workload Scheduler "
         "takes only L4, A100, H100, H200 and B200 GPUs, and --accelerator tpu-v3-8 is a TPU; use --provisioning "
         "standard or spot"),
        (["--provisioning", "flex-start", "--accelerator", "tpu-v5litepod-8"], "tpu-v5litepod-8 is a TPU"),
        (["--provisioning", "flex-start", "--accelerator", "cpu", "--preset", "smoke"], "cpu is a CPU machine"),
        (["--max-wait-hours", "6"], "error: --max-wait-hours is flex-start's wait for machines; --provisioning "
         "standard does not wait"),
        (["--provisioning", "flex-start", "--accelerator", "gpu-h100x8", "--max-wait-hours", "-1"],
         "error: --max-wait-hours -1.0 must be >= 0"),
        (["--reservation", "projects/p/zones/us-central1-a/reservations/r"],
         "error: --reservation: tpu-v3-8 runs on a Cloud TPU node, which no Compute Engine reservation holds"),
        (["--accelerator", "gpu-h100x8", "--reservation", "projects/p/zones/europe-west4-a/reservations/r"],
         "error: --reservation projects/p/zones/europe-west4-a/reservations/r: zone europe-west4-a is not in "
         "--region us-central1"),
        (["--checkpoint-root", "/tmp/ckpt"], "error: --checkpoint-root '/tmp/ckpt' must be a gs:// path"),
        (["--evaluator-max-workers", "0"], "error: --evaluator-disk-gb must be >= 0 and --evaluator-max-workers"),
        (["--param", "train_shards=1000", "--accelerator", "gpu-a100x8", "--machines", "16", "--set",
          "data.num_cores=128"], "train_shards=1000 must be a multiple of num_hosts=16"),
        (["--vertex-endpoint", "effnet"], "error: --vertex-endpoint needs --serving-image"),
        # The pipeline trains on one split and gates on the other: one alone would pay for Dataflow, then fail.
        (["--val-archive", ""], "error: no validation input: the pipeline trains on the training split and gates "
         "on the validation split; give --val-archive or --val-dir"),
        (["--param", "train_archive="], "error: no training input: "),
        # The README's placeholder: a digest that is none (a tag's warning would tell to give what was given).
        (["--image", "REGION-docker.pkg.dev/PROJECT/effnet/pipeline@sha256:DIGEST"],
         "error: --image REGION-docker.pkg.dev/PROJECT/effnet/pipeline@sha256:DIGEST: 'sha256:DIGEST' is not an "
         "image digest (sha256: and 64 hex digits)"),
    ],
)  # fmt: skip
def test_bad_requests_exit_2_with_one_line_and_write_nothing(extra, message, tmp_path, capsys):
    code, output = _compile(tmp_path, *extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len([line for line in err if not line.startswith("warning:")]) == 1
    assert message in err[-1], err
    assert not output.exists() and list(tmp_path.iterdir()) == []


def test_an_output_directory_that_does_not_exist_is_refused_and_nothing_written(tmp_path, capsys):
    # Checked through gfile after the settings and the plan (TensorFlow loads for it), still before any write.
    output = tmp_path / "missing" / "effnet.json"
    code = kubeflow_v2_runner.main(["--output", str(output), *BASE])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"error: --output {output}: directory {tmp_path / 'missing'} does not exist"]
    assert list(tmp_path.iterdir()) == []


def test_a_region_missing_from_the_table_compiles_with_skip_region_check(tmp_path):
    code, _ = _compile(tmp_path, "--region", "asia-east1", "--skip-region-check")
    assert code == 0
    code, _ = _compile(tmp_path, "--region", "europe-west4", name="eu.json")
    assert code == 0


def test_plan_shows_the_trainer_on_the_accelerator(capsys):
    code = kubeflow_v2_runner.main(["--plan", "--preset", "b0-rmsprop-8x2048", "--accelerator", "gpu-h100x8"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0
    assert plan["accelerator"]["machine_type"] == "a3-highgpu-8g"
    assert plan["accelerator"]["units"] == 8  # the GPUs a quota must allow
    assert plan["config"]["loop"]["strategy"] == "mirrored"
    assert (plan["derived"]["replicas"], plan["derived"]["per_replica_batch_size"]) == (8, 256)


# ---- the compiled pipeline -------------------------------------------------------------------------------


def test_compiled_job_trains_on_the_accelerator_in_the_trainer_image(tmp_path, capsys):
    code, output = _compile(
        tmp_path, "--accelerator", "gpu-h100x8", "--machines", "2", "--set", "data.num_cores=16",
        "--service-account", "effnet@my-project.iam.gserviceaccount.com", "--network", NETWORK,
        "--subnetwork", "regions/us-central1/subnetworks/effnet",
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    job = _job(output)
    spec = _spec(job)
    assert {"ImageNetShardGen", "Trainer", "Evaluator", "Pusher"} <= set(spec.components["tfx-dag"].dag.tasks)
    # Every step runs the pipeline image; the training job runs the trainer image on both pools.
    for executor in job["pipelineSpec"]["deploymentSpec"]["executors"].values():
        if "container" in executor:
            assert executor["container"]["image"] == IMAGE
    custom = _custom_config(job)
    training = custom["ai_platform_training_args"]
    assert training["project"] == "my-project" and custom["ai_platform_vertex_region"] == "us-central1"
    pools = training["job_spec"]["worker_pool_specs"]
    assert [pool["replica_count"] for pool in pools] == [1, 1]
    assert {pool["container_spec"]["image_uri"] for pool in pools} == {TRAINER_IMAGE}
    assert pools[0]["machine_spec"]["accelerator_type"] == "NVIDIA_H100_80GB"
    assert training["job_spec"]["service_account"] == "effnet@my-project.iam.gserviceaccount.com"
    assert training["job_spec"]["network"] == NETWORK
    # The trainer config is bound to the machines: MultiWorkerMirroredStrategy over 2 x 8 GPUs.
    config = TrainerConfig.from_json(custom[tfx_trainer.CONFIG_KEY])
    assert (config.loop.strategy, config.data.num_cores, config.data.replicas_per_host) == (
        "multi_worker",
        16,
        8,
    )
    # Dataflow: service account, network and labels of every Beam step; each step its own workers (the
    # Evaluator runs the EfficientNet in every SDK worker process: more memory than the sharding step).
    workers = {
        "ImageNetShardGen": ["--worker_machine_type=n1-standard-4", "--disk_size_gb=50", "--max_num_workers=100"],
        "Evaluator": ["--worker_machine_type=n1-highmem-8", "--disk_size_gb=50", "--max_num_workers=20"],
    }  # fmt: skip
    for step, own in workers.items():
        args = _executor_args(job, step)
        for flag in [
            "--runner=DataflowRunner", "--project=my-project", "--region=us-central1",
            "--service_account_email=effnet@my-project.iam.gserviceaccount.com", "--network=effnet-vpc",
            "--subnetwork=regions/us-central1/subnetworks/effnet", f"--sdk_container_image={IMAGE}",
            "--labels=effnet-pipeline=effnet-b0-rmsprop-8x2048", "--labels=effnet-preset=b0-rmsprop-8x2048", *own,
        ]:  # fmt: skip
            assert flag in args, (step, flag)
        assert len([a for a in args if a.startswith("--worker_machine_type=")]) == 1
    # Given by digest: no warning about tags.
    assert "warning" not in capsys.readouterr().err


def test_runtime_parameters_are_root_inputs_with_the_presets_defaults(tmp_path):
    code, output = _compile(tmp_path, "--param", "train_epochs=30", "--param", "target_top1=0.5")
    assert code == 0
    job = _job(output)
    root = job["pipelineSpec"]["root"]
    declared = root["inputDefinitions"]["parameters"]
    assert set(declared) == set(compiler.RUNTIME_PARAMETERS)
    # PipelineSpec 2.1: typed parameters with plain defaults, values in runtimeConfig.parameterValues.
    assert job["pipelineSpec"]["schemaVersion"] == "2.1.0"
    assert declared["train_epochs"] == {"parameterType": "NUMBER_INTEGER", "defaultValue": 30}
    assert declared["target_top1"] == {"parameterType": "NUMBER_DOUBLE", "defaultValue": 0.5}
    assert declared["train_shards"]["defaultValue"] == 1024 and declared["val_shards"]["defaultValue"] == 128
    assert declared["train_archive"] == {
        "parameterType": "STRING",
        "defaultValue": "gs://my-bucket/ILSVRC2012_img_train.tar",
    }
    assert job["runtimeConfig"]["parameterValues"]["train_epochs"] == 30
    tasks = _tasks(job)
    bound = {
        task: {
            name
            for name, value in tasks[task]["inputs"]["parameters"].items()
            if "componentInputParameter" in value
        }
        for task in ("ImageNetShardGen", "Trainer", "Evaluator")
    }
    assert bound == {
        "ImageNetShardGen": {
            "train_archive",
            "val_archive",
            "train_dir",
            "val_dir",
            "train_shards",
            "val_shards",
        },
        "Trainer": {"train_epochs", "target_top1"},
        "Evaluator": {"target_top1"},
    }
    # The compiled trainer config carries the same values, so the spec reads consistently.
    config = TrainerConfig.from_json(_custom_config(job)[tfx_trainer.CONFIG_KEY])
    assert (config.loop.train_epochs, config.loop.target_top1) == (30, 0.5)


def test_vertex_job_takes_parameter_values_without_recompiling(tmp_path):
    code, output = _compile(tmp_path)
    assert code == 0
    template = Template.read(str(output))
    assert template.parameters == {
        name: compiler.PARAMETER_TYPES[kind] for name, kind in compiler.RUNTIME_PARAMETERS.items()
    }
    params = template.parse(["train_epochs=3", "target_top1=0.25", "val_dir=gs://b/val"])
    job = vertex_submission.vertex_pipeline_job(template, params, True, credentials=AnonymousCredentials())
    assert job.project == "my-project" and job.location == "us-central1"
    values = job.runtime_config.parameter_values
    assert (values["train_epochs"], values["target_top1"], values["val_dir"]) == (3, 0.25, "gs://b/val")
    assert values["train_archive"] == "gs://my-bucket/ILSVRC2012_img_train.tar"  # compiled default
    assert job.runtime_config.gcs_output_directory == "gs://my-bucket/pipelines"


def test_kubeflow_yaml_spec_is_what_kfp_loads_typed_with_its_defaults(tmp_path):
    """The .yaml is a PipelineSpec 2.1.0 that kfp's own loader reads as a pipeline with typed, defaulted inputs
    (the form the Kubeflow Pipelines API server requires: schema 2.1.0, every input parameter typed)."""
    from kfp import components

    code, output = _compile(tmp_path, "--accelerator", "tpu-v5litepod-8", name="effnet.yaml")
    assert code == 0
    with open(output) as f:
        spec = yaml.safe_load(f)
    assert spec["schemaVersion"] == "2.1.0" and spec["pipelineInfo"]["name"] == "effnet-b0-rmsprop-8x2048"
    assert spec["defaultPipelineRoot"] == "gs://my-bucket/pipelines"
    loaded = components.load_component_from_file(str(output))
    kinds = {name: (spec.type, spec.default) for name, spec in loaded.component_spec.inputs.items()}
    assert kinds["train_epochs"] == ("Integer", 350)
    assert kinds["target_top1"] == ("Float", 0.763)
    assert kinds["train_archive"] == ("String", "gs://my-bucket/ILSVRC2012_img_train.tar")
    assert set(kinds) == set(compiler.RUNTIME_PARAMETERS)
    assert Template.read(str(output)).defaults["val_shards"] == 128


@pytest.mark.parametrize("name", ["effnet.json", "effnet.yaml"])
def test_the_trainer_and_evaluator_declare_what_the_run_page_shows_and_run_the_step_that_makes_it(
    tmp_path, name
):
    """The Vertex and Kubeflow run pages show ``system.Metrics`` and ``system.HTML`` outputs: the compiled
    Trainer declares both, the Evaluator a metrics output, typed as the KFP SDK types its own; their containers
    run ``components.run_page`` (TFX's entry point with those outputs made beside), the other steps TFX's."""
    from components import run_page

    code, output = _compile(tmp_path, name=name)
    assert code == 0
    with open(output) as f:
        spec = yaml.safe_load(f)  # JSON is YAML too
    spec = spec.get("pipelineSpec", spec)
    declared = {
        component: {
            key: definition["artifactType"]
            for key, definition in spec["components"][component]["outputDefinitions"]["artifacts"].items()
            if "schemaTitle" in definition["artifactType"]
        }
        for component in ("Trainer", "Evaluator", "Pusher")
    }
    metrics = {"schemaTitle": "system.Metrics", "schemaVersion": "0.0.1"}
    assert declared == {
        "Trainer": {"trainer_metrics": metrics, "run_report": {**metrics, "schemaTitle": "system.HTML"}},
        "Evaluator": {"evaluator_metrics": metrics},
        "Pusher": {},
    }
    commands = {
        label.removesuffix("_executor"): executor["container"]["command"]
        for label, executor in spec["deploymentSpec"]["executors"].items()
        if "container" in executor
    }
    assert commands.pop("Trainer") == commands.pop("Evaluator") == ["python", "-m", run_page.ENTRY_POINT]
    assert {tuple(command) for command in commands.values()} == {("python", "-m", run_page.TFX_ENTRY_POINT)}


def test_tags_are_warned_about_and_the_vertex_pusher_is_optional(tmp_path, capsys):
    tagged = ["--image", "pipeline:latest", "--trainer-image", "trainer-tpu:latest"]
    serving = "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest"
    code, output = _compile(tmp_path, *tagged, "--vertex-endpoint", "effnet", "--serving-image", serving)
    err = capsys.readouterr().err
    assert code == 0
    assert err.count("warning:") == 2 and "pipeline:latest is a tag" in err and "trainer-tpu:latest" in err
    job = _job(output)
    tasks = _tasks(job)
    assert {"Pusher", "VertexPusher"} <= set(tasks)
    config = json.loads(
        tasks["VertexPusher"]["inputs"]["parameters"]["custom_config"]["runtimeValue"]["constant"]
    )
    target = config[vertex_pusher.CONFIG_KEY]
    assert target["serving_image"] == serving and target["endpoint"] == "effnet"
    assert target["pipeline"] == "effnet-b0-rmsprop-8x2048"
    assert target["labels"] == {
        "effnet-pipeline": "effnet-b0-rmsprop-8x2048",
        "effnet-preset": "b0-rmsprop-8x2048",
    }
    executor = job["pipelineSpec"]["deploymentSpec"]["executors"]
    pusher_executor = next(e for name, e in executor.items() if "VertexPusher" in name)
    assert "components.vertex_pusher.VertexPusherExecutor" in json.dumps(pusher_executor)


@pytest.mark.parametrize(
    "image,outcome",
    [
        # The newest TensorFlow image the pinned SDK lists: TensorFlow 2.15, which serves the 2.16 export.
        ("us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest", None),
        ("europe-docker.pkg.dev/vertex-ai/prediction/tf2-gpu.2-15:latest", None),
        (
            "europe-docker.pkg.dev/vertex-ai/prediction/tf2-gpu.2-12:latest",
            "serves with TensorFlow 2.12, older than 2.15",
        ),
        # Images the pinned SDK does not list (the refusal names the one to use).
        (
            "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-16:latest",
            "lists no such prebuilt prediction image",
        ),
        (
            "us-docker.pkg.dev/vertex-ai/prediction/tf2-gpu.2-17:latest",
            "lists no such prebuilt prediction image",
        ),
        ("gcr.io/me/my-server:1", "is not a prebuilt Vertex TensorFlow image"),
    ],
)
def test_the_serving_image_is_checked_against_the_sdks_prebuilt_images(tmp_path, capsys, image, outcome):
    code, _ = _compile(tmp_path, "--vertex-endpoint", "effnet", "--serving-image", image)
    err = capsys.readouterr().err
    if outcome is None:
        assert code == 0 and "serving" not in err
    elif "prebuilt Vertex" not in outcome:
        assert code == 2 and outcome in err and len(err.strip().splitlines()) == 1
        # The image it names instead is one the pinned SDK lists (us-central1's registry: us-docker).
        assert "use us-docker.pkg.dev/vertex-ai/prediction/tf2-" in err and ".2-15:latest" in err
    else:
        assert code == 0 and outcome in err


# ---- the runtime-parameter executors' folding ------------------------------------------------------------


def test_trainer_parameters_replace_the_config_epochs_and_target():
    config = get_preset("demo")
    custom = json.dumps({tfx_trainer.CONFIG_KEY: config.to_json(), "other": 1})
    folded = json.loads(runtime_gate.trainer_custom_config(custom, 30, 0.25))
    result = TrainerConfig.from_json(folded[tfx_trainer.CONFIG_KEY])
    assert (result.loop.train_epochs, result.loop.target_top1, folded["other"]) == (30, 0.25, 1)
    unchanged = json.loads(runtime_gate.trainer_custom_config(custom, None, None))
    assert TrainerConfig.from_json(unchanged[tfx_trainer.CONFIG_KEY]) == config


def test_trainer_parameters_that_break_the_compiled_preset_name_the_parameter():
    custom = json.dumps({tfx_trainer.CONFIG_KEY: get_preset("demo").to_json()})
    assert get_preset("demo").loop.eval_every_epochs == 10
    with pytest.raises(ValueError) as raised:
        runtime_gate.trainer_custom_config(custom, 7, None)
    message = str(raised.value)
    assert message.startswith("runtime parameters train_epochs=7 do not fit the compiled preset: ")
    assert "loop.eval_every_epochs=10 exceeds loop.train_epochs=7" in message
    assert "\n" not in message


def test_evaluator_parameter_moves_the_top1_gate():
    import tensorflow_model_analysis as tfma

    compiled = json_format.MessageToJson(pipeline_def.eval_config(0.95))
    moved = json_format.Parse(runtime_gate.gated_eval_config(compiled, 0.5), tfma.EvalConfig())
    thresholds = [
        m.threshold.value_threshold.lower_bound.value
        for m in moved.metrics_specs[0].metrics
        if m.threshold.HasField("value_threshold")
    ]
    assert thresholds == [0.5]
    assert runtime_gate.gated_eval_config(compiled, None) == compiled
    with pytest.raises(ValueError, match="no SparseCategoricalAccuracy value threshold"):
        runtime_gate.gated_eval_config(json_format.MessageToJson(tfma.EvalConfig()), 0.5)


def test_a_compiled_job_is_submitted_only_under_its_own_root(tmp_path, capsys):
    code, output = _compile(tmp_path)
    assert code == 0
    capsys.readouterr()
    where = ["--project", "my-project", "--image", IMAGE, "--pipeline-root", "gs://other-bucket/p"]
    code = kubeflow_v2_runner.main(
        ["--template", str(output), *where, "--param", "train_epochs=3", "--submit"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert (
        err[0].startswith("error: --pipeline-root gs://other-bucket/p: ")
        and "gs://my-bucket/pipelines" in err[0]
    )


def test_the_baseline_is_this_pipelines_and_its_models_are_served_apart(tmp_path):
    """The latest-blessed-model lookup TFX compiles queries every blessing in the project; it is narrowed to
    the blessings of this pipeline (one per preset), and each pipeline pushes to a serving directory of its own."""
    code, output = _compile(tmp_path)
    assert code == 0
    job = _job(output)
    queries = [
        query["filter"]
        for executor in job["pipelineSpec"]["deploymentSpec"]["executors"].values()
        for query in executor.get("resolver", {}).get("outputArtifactQueries", {}).values()
        if "tfx.ModelBlessing" in query["filter"]
    ]
    assert queries == [
        'schema_title="tfx.ModelBlessing" AND state=LIVE AND metadata.blessed.number_value=1 AND '
        f'metadata.{runtime_gate.BASELINE_SCOPE_PROPERTY}.string_value="effnet-b0-rmsprop-8x2048"'
    ]
    evaluator = _tasks(job)["Evaluator"]["inputs"]["parameters"]
    assert evaluator["baseline_scope"]["runtimeValue"]["constant"] == "effnet-b0-rmsprop-8x2048"
    pusher = _tasks(job)["Pusher"]["inputs"]["parameters"]
    destination = json.loads(pusher["push_destination"]["runtimeValue"]["constant"])
    assert (
        destination["filesystem"]["base_directory"]
        == "gs://my-bucket/pipelines/serving_model/effnet-b0-rmsprop-8x2048"
    )


# ---- the training job: scheduling, provisioning, labels, the run's estimate --------------------------------


def _training_args(job) -> dict:
    return _custom_config(job)["ai_platform_training_args"]


@pytest.mark.parametrize(
    "extra,accelerator,scheduling",
    [
        ([], "tpu-v3-8", {}),
        (["--provisioning", "spot"], "tpu-v3-8", {"strategy": "SPOT"}),
        # Flex-start on GPUs it takes, with the wait for machines written into the job (a day by default).
        (["--provisioning", "flex-start"], "gpu-h100x8", {"strategy": "FLEX_START", "max_wait_duration": "86400s"}),
        (["--provisioning", "flex-start", "--max-wait-hours", "6"], "gpu-a100x8",
         {"strategy": "FLEX_START", "max_wait_duration": "21600s"}),
        (["--provisioning", "flex-start", "--max-wait-hours", "0"], "gpu-a100-80gbx8",
         {"strategy": "FLEX_START", "max_wait_duration": "0s"}),
        # The flag is an upper bound: below the estimate's timeout (44.5 h here) it is the timeout.
        (["--training-timeout-hours", "5"], "tpu-v3-8", {"timeout": "18000s"}),
        (["--training-timeout-hours", "100"], "tpu-v3-8", {}),
    ],
)  # fmt: skip
def test_training_job_has_a_timeout_from_the_plan_restarts_and_the_provisioning_asked(
    tmp_path, extra, accelerator, scheduling
):
    from google.cloud import aiplatform_v1

    code, output = _compile(tmp_path, "--accelerator", accelerator, *extra)
    assert code == 0
    training = _training_args(_job(output))
    machine = accelerators.get(accelerator)
    config = TrainerConfig.from_json(_custom_config(_job(output))[tfx_trainer.CONFIG_KEY])
    estimate = accelerators.estimate(config, machine)
    expected = {
        "timeout": f"{estimate.timeout_seconds}s",
        "restart_job_on_worker_restart": True,
        **scheduling,
    }
    assert training["job_spec"]["scheduling"] == expected
    assert training["display_name"] == "effnet-b0-rmsprop-8x2048-trainer"
    assert training["labels"] == {
        "effnet-pipeline": "effnet-b0-rmsprop-8x2048",
        "effnet-preset": "b0-rmsprop-8x2048",
    }
    # The job as TFX sends it is a valid CustomJob of the API (unknown or mistyped fields fail here).
    message = aiplatform_v1.CustomJob({k: v for k, v in training.items() if k != "project"})
    assert message.job_spec.scheduling.restart_job_on_worker_restart


def test_training_machines_can_come_from_a_reservation(tmp_path):
    reservation = "projects/my-project/zones/us-central1-a/reservations/effnet-h100"
    code, output = _compile(tmp_path, "--accelerator", "gpu-h100x8", "--reservation", reservation)
    assert code == 0
    for pool in _training_args(_job(output))["job_spec"]["worker_pool_specs"]:
        assert pool["machine_spec"]["reservation_affinity"] == {
            "reservation_affinity_type": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name",
            "values": [reservation],
        }


def test_multiply_adds_match_the_papers_flops():
    from trainer_module.models.efficientnet import multiply_adds

    paper = {"b0": 0.39, "b1": 0.70, "b2": 1.0, "b3": 1.8, "b4": 4.2, "b5": 9.9, "b6": 19.0, "b7": 37.0}
    for variant, billions in paper.items():
        assert multiply_adds(variant) / 1e9 == pytest.approx(billions, rel=0.05), variant


def test_plan_estimates_hours_accelerator_hours_and_the_timeout(capsys):
    code = kubeflow_v2_runner.main(["--plan", "--preset", "b0-rmsprop-8x2048", "--accelerator", "tpu-v3-8"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0
    estimate = plan["estimate"]
    derived = plan["derived"]
    assert estimate["training_images"] == derived["total_steps"] * 2048
    assert estimate["unit"] == "TPU v3 cores"
    assert estimate["accelerator_hours"] == pytest.approx(8 * estimate["hours"])
    # The reference trains this recipe in 23 hours on a TPU v2-8 (2.7x slower than a v3-8 at peak); the
    # estimate errs long, and the job's timeout is three times it.
    v2 = accelerators.estimate(get_preset("b0-rmsprop-8x2048"), accelerators.get("tpu-v2-8"))
    assert 23 < v2.hours < 3 * 23
    assert estimate["timeout_seconds"] == pytest.approx(3 * 3600 * estimate["hours"], abs=1)


# ---- the Vertex training executor -------------------------------------------------------------------------


def test_vertex_trainer_refuses_a_bad_runtime_value_before_any_job(monkeypatch):
    from google.cloud.aiplatform import gapic

    class NoJobs:
        def __init__(self, *args, **kwargs):
            raise AssertionError("a training job was about to be created")

    monkeypatch.setattr(gapic, "JobServiceClient", NoJobs)
    custom = json.dumps({tfx_trainer.CONFIG_KEY: get_preset("demo").to_json()})
    properties = {"custom_config": custom, "train_epochs": -1, "target_top1": 0.5}
    with pytest.raises(ValueError, match="^runtime parameters train_epochs=-1, target_top1=0.5 do not fit"):
        runtime_gate.VertexTrainerExecutor().Do({}, {}, properties)


# ---- submitting a compiled pipeline ------------------------------------------------------------------------


@pytest.fixture
def vertex_pipelines(monkeypatch, gcs_bucket):
    """Vertex AI Pipelines faked at its client, application-default credentials anonymous, polls at once.

    The SDK also checks the pipeline root's bucket before it submits: that goes to the GCS server on 127.0.0.1,
    and the project's number it compares the bucket's with to Resource Manager, answered here (the network is
    not reached: the SDK's retries of an unreachable Resource Manager took 40 s a submission).
    """
    import google.auth
    from fake_vertex import FakePipelineService
    from google.cloud import resourcemanager_v3

    def get_project(client, name=None, **kwargs):
        return resourcemanager_v3.Project(name=f"projects/{PROJECT_NUMBER}", project_id=name.split("/")[1])

    monkeypatch.setattr(google.auth, "default", lambda *a, **k: (AnonymousCredentials(), "my-project"))
    monkeypatch.setattr(resourcemanager_v3.ProjectsClient, "get_project", get_project)
    monkeypatch.setattr(submission, "POLL_SECONDS", 0.0)
    fake_vertex.fast_retries(monkeypatch.setattr)
    return FakePipelineService(act_as=[SERVICE_ACCOUNT]).install(monkeypatch)


SERVICE_ACCOUNT = "effnet@my-project.iam.gserviceaccount.com"


COMPILED_WHERE = [
    "--service-account", "effnet@my-project.iam.gserviceaccount.com", "--network", NETWORK,
]  # fmt: skip


@pytest.fixture(scope="module")
def template_file(tmp_path_factory):
    """A PipelineJob compiled with a service account and a network, for the submission tests (read only)."""
    code, output = _compile(tmp_path_factory.mktemp("template"), *COMPILED_WHERE)
    assert code == 0
    return str(output)


@pytest.mark.slow  # compiles, then submits and follows the run
def test_a_template_is_submitted_without_an_image_where_it_was_compiled_and_followed(
    template_file, capsys, vertex_pipelines
):
    # The README's command: no --image, no --project/--region (taken from the template), values of this run.
    code = kubeflow_v2_runner.main(
        ["--template", template_file, "--param", "train_epochs=30", "--param", "target_top1=0.5", "--submit", "--wait"]
    )  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    ((parent, job, _),) = vertex_pipelines.created
    assert parent == "projects/my-project/locations/us-central1"
    assert job.service_account == "effnet@my-project.iam.gserviceaccount.com" and job.network == NETWORK
    assert job.runtime_config.gcs_output_directory == "gs://my-bucket/pipelines"
    values = job.runtime_config.parameter_values
    assert (values["train_epochs"], values["target_top1"]) == (30, 0.5)
    assert out[0].startswith(
        "submitted Vertex PipelineJob projects/my-project/locations/us-central1/pipelineJobs/"
    )
    assert out[1].startswith(
        "follow it at https://console.cloud.google.com/vertex-ai/locations/us-central1/pipelines/runs/"
    )
    assert out[1].endswith("?project=my-project")
    assert out[2:] == ["run state: PIPELINE_STATE_RUNNING", "run state: PIPELINE_STATE_SUCCEEDED"]


def test_the_run_carries_the_labels_its_training_and_dataflow_jobs_carry(template_file, vertex_pipelines):
    """The SDK takes a PipelineJob's labels only from its argument: the compiled ones are passed, so one label
    finds the run, its training job and its Dataflow jobs."""
    assert kubeflow_v2_runner.main(["--template", template_file, "--submit"]) == 0
    ((_, job, _),) = vertex_pipelines.created
    job_dict = _job(template_file)
    expected = {"effnet-pipeline": "effnet-b0-rmsprop-8x2048", "effnet-preset": "b0-rmsprop-8x2048"}
    assert dict(job.labels) == job_dict["labels"]  # ours, and TFX's own (tfx_version, tfx_runner...)
    assert expected.items() <= job.labels.items()
    assert _training_args(job_dict)["labels"] == expected
    for step in ("ImageNetShardGen", "Evaluator"):
        dataflow = [arg for arg in _executor_args(job_dict, step) if arg.startswith("--labels=")]
        assert dataflow == [f"--labels={key}={value}" for key, value in expected.items()], step


@pytest.mark.parametrize(
    "labels,message",
    [
        ({"Effnet-Pipeline": "x"}, "label key 'Effnet-Pipeline' must be 1 to 63 characters and start with a lowercase"),
        ({"9pipeline": "x"}, "label key '9pipeline' must be 1 to 63 characters and start with a lowercase letter"),
        ({"effnet-pipeline": "B0.RMSProp"}, "label effnet-pipeline='B0.RMSProp': only lowercase letters, digits"),
        ({"effnet-pipeline": "x" * 64}, "label value 'xxxx"),
        ({f"k{n}": "v" for n in range(65)}, "65 labels: at most 64 are allowed"),
    ],
)  # fmt: skip
def test_the_pipeline_service_refuses_labels_against_its_rules_in_one_line(
    tmp_path, template_file, vertex_pipelines, capsys, labels, message
):
    bad = tmp_path / "labelled.json"
    bad.write_text(json.dumps({**_job(template_file), "labels": labels}))
    assert kubeflow_v2_runner.main(["--template", str(bad), "--submit"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"error: Vertex AI Pipelines refused the run of {bad}: 400 "
    ), err
    assert message in err[0]
    assert vertex_pipelines.created == []


def test_the_pipeline_service_refuses_a_service_account_the_caller_cannot_act_as(
    template_file, vertex_pipelines, capsys
):
    vertex_pipelines.act_as = ("someone-else@my-project.iam.gserviceaccount.com",)
    assert kubeflow_v2_runner.main(["--template", template_file, "--submit"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: Vertex AI Pipelines refused the run of {template_file}: 400 You do not have permission to act "
        f"as service_account: {SERVICE_ACCOUNT}. (or it may not exist)."
    ]
    assert vertex_pipelines.created == []


def test_wait_exits_1_when_the_run_fails(template_file, capsys, vertex_pipelines):
    vertex_pipelines.states = ["PIPELINE_STATE_RUNNING", "PIPELINE_STATE_FAILED"]
    assert kubeflow_v2_runner.main(["--template", template_file, "--submit", "--wait"]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "run state: PIPELINE_STATE_FAILED"


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--region", "europe-west4"], "--region europe-west4: the template was compiled for region us-central1"),
        (["--project", "other"], "--project other: the template was compiled for project my-project"),
        (["--service-account", "x@other.iam.gserviceaccount.com"], "compiled for service account effnet@"),
        (["--param", "train_epochs=-1"], "do not fit the compiled preset: loop.train_epochs=-1 must be at least 1"),
        (["--param", "target_top1=1.5"], "do not fit the compiled preset: loop.target_top1=1.5 is outside"),
        (["--param", "train_shards=-1"], "runtime parameters train_archive="),
        (["--param", "train_dir=gs://b/train"], "runtime parameters train_archive=gs://my-bucket/ILSVRC2012_img_train"),
        (["--param", "val_archive="], "no validation input (val_archive or val_dir): the pipeline trains on the "
         "training split"),
        (["--wait"], "--wait follows a submitted run: add --submit"),
    ],
)  # fmt: skip
def test_a_submission_that_cannot_run_as_asked_is_refused_in_one_line_before_anything_is_sent(
    template_file, capsys, vertex_pipelines, extra, message
):
    argv = ["--template", template_file, *extra]
    code = kubeflow_v2_runner.main(argv if "--wait" in extra else [*argv, "--submit"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("error: ") and message in err[0], err
    assert vertex_pipelines.created == []


def test_no_credentials_is_one_line(template_file, capsys, monkeypatch, vertex_pipelines):
    import google.auth
    from google.auth import exceptions

    def no_credentials(*args, **kwargs):
        raise exceptions.DefaultCredentialsError("no ADC")

    monkeypatch.setattr(google.auth, "default", no_credentials)
    assert kubeflow_v2_runner.main(["--template", template_file, "--submit"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: no Google Cloud credentials: run 'gcloud auth application-default login' or set "
        "GOOGLE_APPLICATION_CREDENTIALS to a service-account key"
    ]
    assert vertex_pipelines.created == []


# ---- open-source Kubeflow Pipelines ------------------------------------------------------------------------

NAMESPACE = "team-a"
# The backend the Kubeflow tests submit to: one that applies a retry policy in any DAG (no warning to print).
KFP_VERSION = "2.14.0"
IDENTITY = "system:serviceaccount:team-a:default-editor"
TOKEN = "eyJhbGciOiJSUzI1NiJ9.team-a-default-editor.signature"


@pytest.fixture
def kfp_server():
    """A multi-user Kubeflow Pipelines API server behind Kubeflow's gateway, on 127.0.0.1: it lets in the
    bearer token ``TOKEN`` as ``IDENTITY``, which may use namespace ``NAMESPACE`` only, and applies the backend's
    rules to submitted runs."""
    from fake_kfp_server import FakeKfpServer, User

    server = FakeKfpServer(users={TOKEN: User(IDENTITY, (NAMESPACE,))}, version=KFP_VERSION)
    yield server
    server.stop()


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "kfp-token"
    path.write_text(TOKEN + "\n")
    return str(path)


@pytest.fixture(scope="module")
def kubeflow_yaml(tmp_path_factory):
    code, output = _compile(tmp_path_factory.mktemp("kubeflow"), name="effnet.yaml")
    assert code == 0
    return str(output)


def _kfp(kubeflow_yaml, server, *extra):
    return kubeflow_v2_runner.main(
        ["--template", kubeflow_yaml, "--kfp-host", server.host, *extra, "--submit"]
    )


def test_a_multi_user_kubeflow_takes_the_run_in_the_namespace_with_the_token(
    kubeflow_yaml, kfp_server, token_file, capsys
):
    """The held-out check: --template effnet.yaml --kfp-host URL --kfp-namespace NS --kfp-token-file PATH --submit
    creates the run on a multi-user server that requires both; without the namespace, one line names it."""
    code = _kfp(kubeflow_yaml, kfp_server, "--kfp-namespace", NAMESPACE, "--kfp-token-file", token_file)
    out = capsys.readouterr().out.splitlines()
    assert code == 0, kfp_server.refused
    (run,) = kfp_server.runs
    assert kfp_server.experiments[run["experiment_id"]] == {
        "experiment_id": run["experiment_id"],
        "display_name": "effnet-b0-rmsprop-8x2048",
        "namespace": NAMESPACE,
    }
    assert out[0] == f"submitted Kubeflow run {run['run_id']} in namespace {NAMESPACE}"
    # Every call went through the gateway with the token, as the identity it stands for.
    assert kfp_server.calls and {identity for _, _, identity in kfp_server.calls} == {IDENTITY}

    code = _kfp(kubeflow_yaml, kfp_server, "--kfp-token-file", token_file)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0] == (
        f"error: --kfp-namespace: Kubeflow Pipelines at {kfp_server.host} is multi-user: name the namespace "
        "(your Kubeflow profile) to create the run in"
    )
    assert len(kfp_server.runs) == 1 and len(kfp_server.experiments) == 1  # nothing more created


def test_kfps_own_token_variable_is_honoured_and_the_run_followed(
    kubeflow_yaml, kfp_server, token_file, capsys, monkeypatch
):
    monkeypatch.setenv(kfp_submission.KFP_TOKEN_ENV, token_file)
    monkeypatch.setattr(submission, "POLL_SECONDS", 0.0)
    code = _kfp(
        kubeflow_yaml, kfp_server, "--kfp-namespace", NAMESPACE, "--param", "train_epochs=30", "--wait"
    )
    out = capsys.readouterr().out.splitlines()
    assert code == 0, kfp_server.refused
    (run,) = kfp_server.runs
    assert run["runtime_config"] == {
        "parameters": {"train_epochs": 30},
        "pipeline_root": "gs://my-bucket/pipelines",
    }
    assert out[1:] == [
        f"follow it at {kfp_server.host}/#/runs/details/{run['run_id']}",
        "run state: RUNNING",
        "run state: SUCCEEDED",
    ]
    assert {identity for _, _, identity in kfp_server.calls} == {IDENTITY}


def test_the_token_file_is_read_at_every_call(token_file):
    """A token refreshed in place (a projected service-account token, rotated by the kubelet) is the one sent
    while --wait follows a run for hours: kfp calls the hook before every request."""
    import kfp_server_api

    credentials = kfp_submission.kfp_credentials(token_file)
    config = kfp_server_api.Configuration()
    credentials.refresh_api_key_hook(config)
    assert config.api_key["authorization"] == TOKEN
    pathlib.Path(token_file).write_text("rotated-token\n")
    credentials.refresh_api_key_hook(config)
    assert config.api_key["authorization"] == "rotated-token"


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--kfp-namespace", NAMESPACE],
         "refused the call: 401 Unauthorized (no token sent: give --kfp-token-file PATH or set KF_PIPELINES_SA_"),
        (["--kfp-namespace", NAMESPACE, "--kfp-token-file", "{wrong}"],
         "refused the call: 401 Unauthorized: Jwt verification fails (the token of --kfp-token-file {wrong})"),
        (["--kfp-namespace", "team-b", "--kfp-token-file", "{token}"],
         f"refused the run: List experiments failed: Failed to authorize with API: Failed to authorize with API: "
         f"PermissionDenied: User '{IDENTITY}' is not authorized with reason: (request: &ResourceAttributes{{"
         "Namespace:team-b,Verb:list,Group:pipelines.kubeflow.org,"),
        (["--kfp-namespace", NAMESPACE, "--kfp-token-file", "{missing}"],
         "error: --kfp-token-file {missing}: no such file (it should hold the bearer token"),
        (["--kfp-namespace", NAMESPACE, "--kfp-token-file", "{empty}"],
         "error: --kfp-token-file {empty}: expected one bearer token, found nothing"),
    ],
)  # fmt: skip
def test_what_a_multi_user_kubeflow_refuses_is_one_line_and_creates_nothing(
    kubeflow_yaml, kfp_server, token_file, tmp_path, capsys, flags, message
):
    files = {
        "token": token_file,
        "wrong": tmp_path / "wrong",
        "missing": tmp_path / "missing",
        "empty": tmp_path / "empty",
    }
    files["wrong"].write_text("an-expired-token")
    files["empty"].write_text("\n")
    code = _kfp(kubeflow_yaml, kfp_server, *[_named(flag, files) for flag in flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert _named(message, files) in err[0]
    assert kfp_server.runs == [] and kfp_server.experiments == {}
    if "{missing}" in flags or "{empty}" in flags:
        assert kfp_server.calls == []  # refused before anything is sent


def _named(text: str, paths: dict) -> str:
    """``text`` with each ``{name}`` replaced by ``paths[name]``."""
    for name, path in paths.items():
        text = text.replace(f"{{{name}}}", str(path))
    return text


def test_the_fake_refuses_what_kfp_sends_without_a_namespace_as_the_server_does(kfp_server, monkeypatch):
    """kfp's own client, given the token and no namespace, is refused by the multi-user server's rule for
    experiments (what the runner's own check spares a user)."""
    import kfp
    import kfp_server_api

    monkeypatch.setattr(kfp.Client, "_LOCAL_KFP_CONTEXT", "/nonexistent/kfp/context.json")
    client = kfp.Client(host=kfp_server.host, existing_token=TOKEN)
    assert client.get_kfp_healthz().multi_user is True
    with pytest.raises(kfp_server_api.ApiException) as refused:
        client.create_experiment("effnet")
    assert refused.value.status == 400
    assert json.loads(refused.value.body)["message"] == (
        "List experiments failed: Failed to authorize with API: Invalid input error: An experiment cannot have an "
        "empty namespace in multi-user mode"
    )
    with pytest.raises(
        kfp_server_api.ApiException, match="Experiment id can not be empty in multi-user mode"
    ):
        client.run_pipeline(experiment_id="", job_name="effnet", pipeline_id="p", version_id="v")
    assert kfp_server.experiments == {} and kfp_server.runs == []
    # An identity header without a token does not get past the gateway (it sets the header from the token).
    request = urllib.request.Request(
        f"{kfp_server.host}/apis/v2beta1/experiments?namespace={NAMESPACE}",
        headers={"kubeflow-userid": IDENTITY},
    )
    with pytest.raises(urllib.error.HTTPError) as unauthenticated:
        urllib.request.urlopen(request, timeout=10)
    assert (unauthenticated.value.code, unauthenticated.value.read()) == (401, b"Unauthorized")


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--template", "{yaml}", "--submit"],
         "error: --kfp-host: {yaml} is a Kubeflow Pipelines PipelineSpec; give --kfp-host URL to submit it"),
        (["--output", "{new_yaml}", *BASE, "--submit"],
         "error: --kfp-host: {new_yaml} is a Kubeflow Pipelines PipelineSpec; give --kfp-host URL to submit it"),
        (["--template", "{json}", "--kfp-host", "http://127.0.0.1:1", "--submit"],
         "error: --kfp-host takes a PipelineSpec: compile to .yaml, not {json}"),
        (["--template", "{json}", "--kfp-namespace", NAMESPACE, "--submit"],
         "error: --kfp-namespace goes with --kfp-host (a Kubeflow Pipelines endpoint)"),
        (["--template", "{json}", "--kfp-token-file", "token", "--submit"],
         "error: --kfp-token-file goes with --kfp-host (a Kubeflow Pipelines endpoint)"),
    ],
)  # fmt: skip
def test_a_yaml_goes_to_kubeflow_only_and_its_flags_with_it(
    kubeflow_yaml, template_file, tmp_path, capsys, vertex_pipelines, argv, message
):
    names = {"yaml": kubeflow_yaml, "json": template_file, "new_yaml": tmp_path / "effnet.yaml"}
    code = kubeflow_v2_runner.main([_named(arg, names) for arg in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(_named(message, names)), err
    assert vertex_pipelines.created == [] and list(tmp_path.iterdir()) == []


def test_a_single_user_kubeflow_takes_the_yaml_without_namespace_or_token(kubeflow_yaml, capsys, monkeypatch):
    """Standalone Kubeflow Pipelines (single-user, reached without a gateway, as through kubectl port-forward)
    still takes the run as before: no identity, no namespace."""
    from fake_kfp_server import FakeKfpServer

    monkeypatch.setattr(submission, "POLL_SECONDS", 0.0)
    server = FakeKfpServer(version=KFP_VERSION)
    try:
        code = _kfp(kubeflow_yaml, server, "--param", "train_epochs=30", "--wait")
    finally:
        server.stop()
    out = capsys.readouterr().out.splitlines()
    assert code == 0, server.refused
    (run,) = server.runs
    assert run["runtime_config"] == {
        "parameters": {"train_epochs": 30},
        "pipeline_root": "gs://my-bucket/pipelines",
    }
    assert run["display_name"].startswith(
        "effnet-b0-rmsprop-8x2048-"
    )  # the pipeline's name, when, a random part
    assert out == [
        f"submitted Kubeflow run {run['run_id']}",
        f"follow it at {server.host}/#/runs/details/{run['run_id']}",
        "run state: RUNNING",
        "run state: SUCCEEDED",
    ]
    # Without the lookup of the latest blessed model: the backend runs no resolver node.
    executors = yaml.safe_load(pathlib.Path(kubeflow_yaml).read_text())["deploymentSpec"]["executors"]
    assert not [label for label, executor in executors.items() if "resolver" in executor]


def test_the_kubeflow_yaml_says_it_has_no_baseline(tmp_path, capsys):
    code, _ = _compile(tmp_path, name="effnet.yaml")
    assert code == 0
    assert "note: Kubeflow Pipelines runs no TFX resolver node" in capsys.readouterr().out


def test_the_backends_rules_refuse_what_tfx_emits_by_default(kubeflow_yaml, template_file):
    """The server's rules bite: TFX's default schema 2.0.0 (untyped parameters, old constants) and the Vertex
    job's resolver nodes are refused, which is why the runner compiles 2.1.0 and a .yaml without them."""
    from fake_kfp_server import RunRefused, check_run

    accepted = yaml.safe_load(pathlib.Path(kubeflow_yaml).read_text())
    check_run(accepted, {"train_epochs": 30})  # what the runner compiles: accepted
    with pytest.raises(RunRefused, match="KFP only supports schema version 2.1.0, but .* has version 2.0.0"):
        check_run({**accepted, "schemaVersion": "2.0.0"}, {})
    legacy = json.loads(json.dumps(accepted))
    legacy["root"]["inputDefinitions"]["parameters"]["train_epochs"] = {"type": "INT"}
    with pytest.raises(RunRefused, match="input parameter train_epochs has unspecified type"):
        check_run(legacy, {"train_epochs": 30})
    with pytest.raises(RunRefused, match="train_epochs is not optional, yet has neither default"):
        check_run(legacy, {})
    with pytest.raises(RunRefused, match="not required by pipeline: epochs"):
        check_run(accepted, {"epochs": 3})
    with pytest.raises(RunRefused, match="requires type NUMBER_INTEGER"):
        check_run(accepted, {"train_epochs": "30"})
    vertex_spec = _job(template_file)["pipelineSpec"]
    with pytest.raises(RunRefused, match="resolver_executor\\): non-container and non-importer executor"):
        check_run(vertex_spec, {})


def test_a_run_kubeflow_refuses_is_one_line(tmp_path, template_file, kfp_server, token_file, capsys):
    spec = tmp_path / "with-resolver.yaml"
    spec.write_text(yaml.safe_dump(_job(template_file)["pipelineSpec"]))
    code = _kfp(str(spec), kfp_server, "--kfp-namespace", NAMESPACE, "--kfp-token-file", token_file)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith(
        f"error: Kubeflow Pipelines at {kfp_server.host} refused the run: Failed to compile job"
    )
    assert kfp_server.runs == []


# ---- tuning on Vertex --------------------------------------------------------------------------------------


def test_tuning_compiles_to_a_vertex_job_of_parallel_trials_feeding_the_trainer(tmp_path):
    code, output = _compile(tmp_path, "--tune", "--tune-parallel-trials", "3", "--tune-max-epochs", "35")
    assert code == 0
    job = _job(output)
    tasks = _tasks(job)
    executor = job["pipelineSpec"]["deploymentSpec"]["executors"]["Tuner_executor"]["container"]["args"]
    assert executor[:2] == ["--executor_class_path", "components.vertex_tuner.VertexTunerExecutor"]
    custom = json.loads(tasks["Tuner"]["inputs"]["parameters"]["custom_config"]["runtimeValue"]["constant"])
    tuning_args = custom["ai_platform_tuning_args"]
    pools = tuning_args["job_spec"]["worker_pool_specs"]
    assert [pool["replica_count"] for pool in pools] == [1, 2]  # a machine per parallel trial
    assert {pool["container_spec"]["image_uri"] for pool in pools} == {TRAINER_IMAGE}
    assert pools[0]["machine_spec"]["accelerator_type"] == "TPU_V3"
    assert tuning_args["display_name"] == "effnet-b0-rmsprop-8x2048-tuner"
    assert custom["tuning"]["directory"] == "gs://my-bucket/pipelines/tuning/effnet-b0-rmsprop-8x2048"
    assert custom["tuning"]["max_epochs"] == 35
    # The Trainer trains with what the Tuner found.
    hyperparameters = tasks["Trainer"]["inputs"]["artifacts"]["hyperparameters"]["taskOutputArtifact"]
    assert hyperparameters == {"outputArtifactKey": "best_hyperparameters", "producerTask": "Tuner"}


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--accelerator", "gpu-h100x8", "--machines", "2", "--set", "data.num_cores=16"],
         "--tune: Vertex runs each tuning trial on one machine and 2 x gpu-h100x8 is 2"),
        (["--tune-search", "grid"], "--search='grid' is not one of 'hyperband'"),
        (["--tune-parallel-trials", "0"], "--tune-parallel-trials 0 must be at least 1"),
    ],
)  # fmt: skip
def test_tuning_that_vertex_cannot_run_is_refused_at_compile_time(tmp_path, capsys, extra, message):
    code, output = _compile(tmp_path, "--tune", *extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and message in err[-1], err
    assert not output.exists()


# ---- the compiler, called from code ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["effnet.json", "effnet.yaml"])
def test_the_compiler_takes_typed_settings_and_writes_what_the_cli_writes(tmp_path, name):
    """``pipeline.compiler`` takes typed values (``CloudSettings``, a preset, typed changes and parameters), no
    command line; the runner is only its CLI, so the same run compiled either way is the same file."""
    from pipeline import presets
    from pipeline.cloud import CloudSettings

    code, cli_output = _compile(
        tmp_path, "--tune", "--set", "loop.train_epochs=40", "--param", "target_top1=0.5", name=name
    )
    assert code == 0
    settings = CloudSettings(
        project="my-project",
        region="us-central1",
        image=IMAGE,
        pipeline_root="gs://my-bucket/pipelines",
        trainer_image=TRAINER_IMAGE,
    )
    inputs = {"train_archive": BASE[BASE.index("--train-archive") + 1], "val_archive": BASE[-1]}
    tune = {"search": "hyperband", "max_epochs": 0, "max_trials": 10}
    compiled = compiler.plan_pipeline(
        presets.get("b0-rmsprop-8x2048"),
        settings,
        inputs,
        {"loop.train_epochs": 40},
        {"target_top1": 0.5},
        tune,
        parallel_trials=2,
    )
    assert compiled.defaults["train_epochs"] == 40 and compiled.defaults["target_top1"] == 0.5
    output = tmp_path / "from_code" / name
    output.parent.mkdir()
    assert compiler.compile_pipeline(compiled, settings, str(output)) == str(output)
    assert output.read_bytes() == cli_output.read_bytes()


# ---- caching per task, backends' versions, faults at submission -------------------------------------------------


def _caching(spec) -> dict[str, bool]:
    """Each container task's ``enableCache`` in a submitted spec, by task name (in any DAG)."""
    spec = json_format.MessageToDict(spec) if not isinstance(spec, dict) else spec
    found = {}
    for dag in [spec["root"], *spec["components"].values()]:
        for name, task in dag.get("dag", {}).get("tasks", {}).items():
            if "dag" not in spec["components"][task["componentRef"]["name"]]:
                found[name] = task.get("cachingOptions", {}).get("enableCache", False)
    return found


@pytest.mark.parametrize("no_cache", [False, True], ids=["caching", "no-cache"])
def test_vertex_gets_the_clean_up_uncached_whatever_the_steps_caching(
    template_file, vertex_pipelines, no_cache
):
    """The request ``--submit`` sends: the exit task never cached (from the second run on a cached clean-up would
    be skipped and cancel nothing), the steps as ``--no-cache`` says."""
    assert (
        kubeflow_v2_runner.main(
            ["--template", template_file, "--submit", *(["--no-cache"] if no_cache else [])]
        )
        == 0
    )
    ((_, job, _),) = vertex_pipelines.created
    caching = _caching(type(job).to_dict(job)["pipeline_spec"])
    assert caching.pop("RunCleanup") is False
    assert {"ImageNetShardGen", "Trainer", "Evaluator", "Pusher"} <= set(caching)
    assert set(caching.values()) == {not no_cache}


def test_a_vertex_create_whose_answer_is_lost_is_not_made_twice_and_wait_outlasts_faults(
    template_file, vertex_pipelines, capsys
):
    """The create is made but its answer lost; the retry is refused ALREADY_EXISTS (the id is this submission's)
    and the job read instead. Following it, 503, 429 and a dropped connection are waited out."""
    vertex_pipelines.faults = faults.FaultSchedule(
        {"create_pipeline_job": ["lost", "503"], "get_pipeline_job": ["503", "429", "drop", "500", "504"]}
    )
    assert kubeflow_v2_runner.main(["--template", template_file, "--submit", "--wait"]) == 0
    assert len(vertex_pipelines.created) == 1 and len(vertex_pipelines.jobs) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "run state: PIPELINE_STATE_SUCCEEDED"
    assert not vertex_pipelines.faults.plan["get_pipeline_job"]  # every fault met


def test_wait_gives_up_in_one_line_when_the_api_stays_out(template_file, vertex_pipelines, capsys):
    vertex_pipelines.faults = faults.FaultSchedule({"get_pipeline_job": ["503*"]})
    argv = ["--template", template_file, "--submit", "--wait", "--api-outage-hours", "0.0003"]  # about 1 s
    assert kubeflow_v2_runner.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: reading the state of Vertex PipelineJob projects/")
    assert "no answer for 1.08 s: ServiceUnavailable: 503" in err[0] and "the run goes on: https://" in err[0]


@pytest.mark.parametrize("version", ["2.3.0", "2.4.1", "2.5.0-rc.1", "1.8.5"])
def test_a_kubeflow_older_than_the_minimum_is_refused_in_one_line_before_anything_is_created(
    kubeflow_yaml, token_file, capsys, version
):
    from fake_kfp_server import FakeKfpServer, User

    server = FakeKfpServer(users={TOKEN: User(IDENTITY, (NAMESPACE,))}, version=version)
    try:
        code = _kfp(kubeflow_yaml, server, "--kfp-namespace", NAMESPACE, "--kfp-token-file", token_file)
    finally:
        server.stop()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [
        f"error: Kubeflow Pipelines at {server.host} is {version}: this pipeline needs 2.5.0 or newer (from 2.5.0 "
        "the clean-up exit task gets its run's id, kubeflow/pipelines#11599; before 2.4.0 an exit task also decides "
        "the run's outcome, #10917)"
    ]
    assert server.runs == [] and server.experiments == {}
    assert [path for _, path, _ in server.calls] == ["/apis/v2beta1/healthz"]


def test_a_kubeflow_of_the_minimum_takes_the_run_and_no_cache_reaches_the_steps_inside_the_dag(
    kubeflow_yaml, token_file, capsys
):
    """2.5.0 takes the run (it applies no retry policy inside ``tfx-dag``: said once); ``--no-cache`` reaches every
    step, which kfp.Client's own override does not (root tasks only), and the clean-up is never cached."""
    from fake_kfp_server import FakeKfpServer, User

    server = FakeKfpServer(users={TOKEN: User(IDENTITY, (NAMESPACE,))}, version="2.5.0")
    try:
        for flags in ([], ["--no-cache"]):
            code = _kfp(
                kubeflow_yaml, server, "--kfp-namespace", NAMESPACE, "--kfp-token-file", token_file, *flags
            )
            assert code == 0, server.refused
    finally:
        server.stop()
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        err
        == [
            "warning: Kubeflow Pipelines 2.5.0 applies a task's retry policy to the root DAG's tasks only (every task "
            "from 2.14.0, kubeflow/pipelines#11908): a step whose pod is lost fails the run, and the clean-up cancels "
            "its job"
        ]
        * 2
    )
    cached, uncached = (_caching(run["pipeline_spec"]) for run in server.runs)
    assert cached.pop("RunCleanup") is False and uncached.pop("RunCleanup") is False
    assert set(cached.values()) == {True} and set(uncached.values()) == {False}
    assert {"ImageNetShardGen", "Trainer", "Evaluator"} <= set(cached)


def test_a_kubeflow_that_names_no_version_is_warned_about(kubeflow_yaml, capsys):
    from fake_kfp_server import FakeKfpServer

    server = FakeKfpServer(version="unknown")
    try:
        assert _kfp(kubeflow_yaml, server) == 0
    finally:
        server.stop()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"warning: Kubeflow Pipelines at {server.host} reports no version in its healthz (tag_name 'unknown'): this "
        "pipeline needs 2.5.0 or newer, whose driver gives the clean-up exit task its run's id"
    ]


def test_kubeflow_faults_are_retried_a_lost_create_is_not_made_twice_and_a_rotated_token_is_read_again(
    kubeflow_yaml, token_file, capsys, monkeypatch
):
    """Transient faults at every call; the create's answer lost (the run made): found by its name, not made twice;
    while ``--wait`` follows, the token expires and the file is rotated a moment later: the 401 is waited out and
    the new token read from the file."""
    from fake_kfp_server import FakeKfpServer, Refused, User

    fake_vertex.fast_retries(monkeypatch.setattr)
    monkeypatch.setattr(submission, "POLL_SECONDS", 0.0)
    rotated = "eyJhbGciOiJSUzI1NiJ9.team-a-default-editor.rotated"

    class Rotating(FakeKfpServer):
        def gateway(self, headers):
            if (
                headers.get("Authorization") == f"Bearer {TOKEN}"
                and self._polls
                and max(self._polls.values()) >= 2
            ):
                self.users = {rotated: self.users[TOKEN]}  # the old token expired...
                pathlib.Path(token_file).write_text(
                    rotated
                )  # ...and the kubelet rotates the file, a moment late
                raise Refused("Jwt is expired", 16, http_status=401)
            return super().gateway(headers)

    schedule = faults.FaultSchedule(
        {
            "GET /apis/v2beta1/healthz": ["503", "drop"],
            "GET /apis/v2beta1/experiments": ["500"],
            "POST /apis/v2beta1/runs": ["lost"],
            "GET /apis/v2beta1/runs/{id}": ["503", "drop", "429"],
        }
    )
    server = Rotating(
        states=("RUNNING", "RUNNING", "RUNNING", "SUCCEEDED"),
        users={TOKEN: User(IDENTITY, (NAMESPACE,))},
        version=KFP_VERSION,
        faults=schedule,
    )
    try:
        code = _kfp(
            kubeflow_yaml, server, "--kfp-namespace", NAMESPACE, "--kfp-token-file", token_file, "--wait"
        )
    finally:
        server.stop()
    assert code == 0, server.refused
    assert len(server.runs) == 1  # the lost create was found by its name
    assert capsys.readouterr().out.splitlines()[-1] == "run state: SUCCEEDED"
    assert not any(schedule.plan.values())  # every fault met
    assert "Jwt is expired" in server.refused
