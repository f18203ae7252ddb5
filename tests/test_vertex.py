"""Compiling for Vertex / Kubeflow: accelerators, the preset check, runtime parameters, images, networking.

Nothing here reaches Google Cloud: the compiled spec is parsed with KFP's own PipelineSpec proto and the
Vertex ``PipelineJob`` is built locally with anonymous credentials (the SDK validates it without the
network). ``test_vertex_steps.py`` runs the compiled steps.
"""

import json

import pytest
import yaml
from google.auth.credentials import AnonymousCredentials
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from components import runtime_gate
from pipeline import accelerators, kubeflow_v2_runner, pipeline_def
from trainer_module import tfx_trainer
from trainer_module.config import TrainerConfig
from trainer_module.presets import get_preset

DIGEST = "@sha256:" + "0123456789abcdef" * 4
IMAGE = "us-docker.pkg.dev/my-project/effnet/pipeline" + DIGEST
TRAINER_IMAGE = "us-docker.pkg.dev/my-project/effnet/trainer-tpu" + DIGEST
NETWORK = "projects/123456/global/networks/effnet-vpc"
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


def _custom_config(job) -> dict:
    parameters = job["pipelineSpec"]["root"]["dag"]["tasks"]["Trainer"]["inputs"]["parameters"]
    return json.loads(parameters["custom_config"]["runtimeValue"]["constantValue"]["stringValue"])


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
        ("tpu-v3-512", 1, "offers TPU v3 only as tpu-v3-8 .*512-core slice .*standalone trainer on a TPU VM"),
        ("tpu-v5litepod-16", 1, "16-chip v5e slice spans several hosts"),
        ("tpu-v6e-8", 1, "no TensorFlow training on TPU v6e"),
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
        (["--accelerator", "tpu-v3-1024"], "error: --accelerator tpu-v3-1024: Vertex AI custom training offers"),
        (["--network", "effnet-vpc"], "error: --network 'effnet-vpc' must be projects/PROJECT_NUMBER/"),
        (["--param", "epochs=3"], "error: --param epochs: not a runtime parameter; declared: target_top1,"),
        (["--param", "train_epochs=three"], "error: --param train_epochs=three: train_epochs takes a int"),
        (["--param", "train_shards=1000", "--accelerator", "gpu-a100x8", "--machines", "16", "--set",
          "data.num_cores=128"], "train_shards=1000 must be a multiple of num_hosts=16"),
        (["--vertex-endpoint", "effnet"], "error: --vertex-endpoint needs --serving-image"),
    ],
)  # fmt: skip
def test_bad_requests_exit_2_with_one_line_and_write_nothing(extra, message, tmp_path, capsys):
    code, output = _compile(tmp_path, *extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len([line for line in err if not line.startswith("warning:")]) == 1
    assert message in err[-1], err
    assert not output.exists() and list(tmp_path.iterdir()) == []


def test_plan_shows_the_trainer_on_the_accelerator(capsys):
    code = kubeflow_v2_runner.main(["--plan", "--preset", "b0-rmsprop-8x2048", "--accelerator", "gpu-h100x8"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0
    assert plan["accelerator"]["machine_type"] == "a3-highgpu-8g"
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
    assert {"ImageNetShardGen", "Trainer", "Evaluator", "Pusher"} <= set(spec.root.dag.tasks)
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
    # Dataflow: machine type, disk, service account and network of the sharding step.
    args = _executor_args(job, "ImageNetShardGen")
    for flag in [
        "--runner=DataflowRunner", "--worker_machine_type=n1-standard-4", "--disk_size_gb=50",
        "--service_account_email=effnet@my-project.iam.gserviceaccount.com", "--network=effnet-vpc",
        "--subnetwork=regions/us-central1/subnetworks/effnet", f"--sdk_container_image={IMAGE}",
    ]:  # fmt: skip
        assert flag in args
    # Given by digest: no warning about tags.
    assert "warning" not in capsys.readouterr().err


def test_runtime_parameters_are_root_inputs_with_the_presets_defaults(tmp_path):
    code, output = _compile(tmp_path, "--param", "train_epochs=30", "--param", "target_top1=0.5")
    assert code == 0
    job = _job(output)
    root = job["pipelineSpec"]["root"]
    declared = root["inputDefinitions"]["parameters"]
    assert set(declared) == set(kubeflow_v2_runner.RUNTIME_PARAMETERS)
    assert declared["train_epochs"] == {"type": "INT", "defaultValue": 30}
    assert declared["target_top1"] == {"type": "DOUBLE", "defaultValue": 0.5}
    assert declared["train_shards"]["defaultValue"] == 1024 and declared["val_shards"]["defaultValue"] == 128
    assert declared["train_archive"]["defaultValue"] == "gs://my-bucket/ILSVRC2012_img_train.tar"
    assert job["runtimeConfig"]["parameters"]["train_epochs"] == {"intValue": "30"}
    tasks = root["dag"]["tasks"]
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
    settings = kubeflow_v2_runner.CloudSettings(
        "my-project", "us-central1", IMAGE, "gs://my-bucket/pipelines"
    )
    kinds = kubeflow_v2_runner.template_parameters(str(output))
    assert kinds == kubeflow_v2_runner.RUNTIME_PARAMETERS
    params = kubeflow_v2_runner.parse_params(
        ["train_epochs=3", "target_top1=0.25", "val_dir=gs://b/val"], kinds
    )
    job = kubeflow_v2_runner.vertex_job(str(output), settings, params, credentials=AnonymousCredentials())
    assert job.project == "my-project" and job.location == "us-central1"
    values = job.runtime_config.parameters
    assert (values["train_epochs"].int_value, values["target_top1"].double_value) == (3, 0.25)
    assert values["val_dir"].string_value == "gs://b/val"
    assert (
        values["train_archive"].string_value == "gs://my-bucket/ILSVRC2012_img_train.tar"
    )  # compiled default
    assert job.runtime_config.gcs_output_directory == "gs://my-bucket/pipelines"


def test_kubeflow_yaml_spec_has_the_defaults(tmp_path):
    code, output = _compile(tmp_path, "--accelerator", "tpu-v5litepod-8", name="effnet.yaml")
    assert code == 0
    with open(output) as f:
        spec = yaml.safe_load(f)
    assert spec["pipelineInfo"]["name"] == "effnet-b0-rmsprop-8x2048"
    assert spec["root"]["inputDefinitions"]["parameters"]["target_top1"]["defaultValue"] == 0.763
    assert kubeflow_v2_runner.template_parameters(str(output)) == kubeflow_v2_runner.RUNTIME_PARAMETERS


def test_tags_are_warned_about_and_the_vertex_pusher_is_optional(tmp_path, capsys):
    tagged = ["--image", "pipeline:latest", "--trainer-image", "trainer-tpu:latest"]
    serving = "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest"
    code, output = _compile(tmp_path, *tagged, "--vertex-endpoint", "effnet", "--serving-image", serving)
    err = capsys.readouterr().err
    assert code == 0
    assert err.count("warning:") == 2 and "pipeline:latest is a tag" in err and "trainer-tpu:latest" in err
    job = _job(output)
    tasks = job["pipelineSpec"]["root"]["dag"]["tasks"]
    assert {"Pusher", "VertexPusher"} <= set(tasks)
    config = json.loads(
        tasks["VertexPusher"]["inputs"]["parameters"]["custom_config"]["runtimeValue"]["constantValue"][
            "stringValue"
        ]
    )
    assert config["ai_platform_vertex_container_image_uri"] == serving
    assert config["ai_platform_serving_args"]["endpoint_name"] == "effnet"


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
