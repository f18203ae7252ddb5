"""The whole pipeline with the LocalDagRunner on the embedded data, and its compilation for Vertex / Kubeflow."""

import json
import os
import pathlib

import pytest
from google.auth.credentials import AnonymousCredentials
from kfp.pipeline_spec import pipeline_spec_pb2
from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

from pipeline import kubeflow_v2_runner, local_runner, presets

# A short demo run: 5 epochs reach about 0.4-0.6 top-1 on the embedded digits.
SHORT = ["--preset", "demo", "--set", "loop.train_epochs=5", "--set", "loop.eval_every_epochs=5"]


def _store(root):
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = str(root / "metadata.sqlite")
    return metadata_store.MetadataStore(config)


def _executions(store, component):
    """Executions of a component, oldest first (execution types are named by component class)."""
    return [
        e
        for e in store.get_executions()
        if store.get_execution_types_by_id([e.type_id])[0].name.endswith(f".{component}")
    ]


def result_report_path(out: str) -> str:
    return next(line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("run report: "))


@pytest.fixture(scope="module")
def blessed_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("local_pipeline")
    code = local_runner.main(["--pipeline-root", str(root), *SHORT, "--target-top1", "0.2"])
    return root, code


@pytest.mark.slow
def test_local_pipeline_trains_evaluates_blesses_and_pushes(blessed_run, capsys):
    root, code = blessed_run
    assert code == 0
    store = _store(root)
    types = {store.get_artifact_types_by_id([a.type_id])[0].name for a in store.get_artifacts()}
    assert {"Examples", "Model", "ModelRun", "ModelEvaluation", "ModelBlessing", "PushedModel"} <= types
    pushed = os.listdir(root / "serving_model")
    assert len(pushed) == 1
    assert os.path.exists(root / "serving_model" / pushed[0] / "saved_model.pb")
    examples = [a for a in store.get_artifacts_by_type("Examples")][0]
    assert examples.custom_properties["train_records"].int_value == 1438
    assert examples.custom_properties["validation_records"].int_value == 359
    # The run report of the Trainer's model directory carries the pipeline's verdict, and the runner names it.
    model_run = max(store.get_artifacts_by_type("ModelRun"), key=lambda a: a.id)
    page = (pathlib.Path(model_run.uri) / "report.html").read_text()
    assert "TFMA top-1 (validation split)" in page and "blessed by the Evaluator" in page


@pytest.mark.slow
def test_unreachable_target_reuses_cached_steps_blesses_nothing_and_pushes_nothing(blessed_run, capsys):
    root, _ = blessed_run
    capsys.readouterr()
    code = local_runner.main(["--pipeline-root", str(root), *SHORT, "--target-top1", "0.999"])
    out = capsys.readouterr().out
    assert code == local_runner.NOT_BLESSED_EXIT
    assert "NOT blessed" in out and "nothing pushed" in out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["model_run_uri"] and result_report_path(out) == f"{result['model_run_uri']}/report.html"
    assert result["blessed"] is False and result["pushed"] is False and 0.0 < result["top1"] < 0.999
    assert len(os.listdir(root / "serving_model")) == 1  # only the first run's model
    store = _store(root)
    cached = metadata_store_pb2.Execution.CACHED
    for component in ("ImageNetShardGen", "Trainer"):
        states = [e.last_known_state for e in _executions(store, component)]
        assert states[-1] == cached, component
    assert [e.last_known_state for e in _executions(store, "Evaluator")][
        -1
    ] == metadata_store_pb2.Execution.COMPLETE


def _settings():
    return kubeflow_v2_runner.CloudSettings(
        project="my-project",
        region="us-central1",
        image="us-docker.pkg.dev/my-project/effnet/pipeline:1",
        pipeline_root="gs://my-bucket/pipelines",
        tpu_type="TPU_V3",
        tpu_count=8,
    )


@pytest.mark.parametrize("preset", ["b5-lars-1024x65536", "demo"])
def test_compiles_to_a_vertex_pipeline_job_with_images_dataflow_and_tpu(preset, tmp_path):
    output = str(tmp_path / "effnet.json")
    code = kubeflow_v2_runner.main(
        [
            "--output", output, "--preset", preset,
            "--project", "my-project", "--region", "us-central1",
            "--image", "us-docker.pkg.dev/my-project/effnet/pipeline:1",
            "--pipeline-root", "gs://my-bucket/pipelines",
            "--train-archive", "gs://my-bucket/ILSVRC2012_img_train.tar",
            "--val-archive", "gs://my-bucket/ILSVRC2012_img_val.tar",
        ]
    )  # fmt: skip
    assert code == 0
    with open(output) as f:
        job = json.load(f)
    assert job["displayName"] == f"effnet-{preset}"
    assert job["runtimeConfig"]["gcsOutputDirectory"] == "gs://my-bucket/pipelines"
    spec = pipeline_spec_pb2.PipelineSpec()
    from google.protobuf import json_format

    json_format.ParseDict(job["pipelineSpec"], spec, ignore_unknown_fields=True)
    tasks = set(spec.root.dag.tasks)
    assert {"ImageNetShardGen", "Trainer", "Evaluator", "Pusher"} <= tasks
    assert any(task.startswith("latest_blessed_model_resolver") for task in tasks)
    executors = spec.deployment_spec["executors"]
    text = json.dumps(job["pipelineSpec"])
    for name, executor in executors.items():
        if "container" in executor:
            assert executor["container"]["image"] == "us-docker.pkg.dev/my-project/effnet/pipeline:1", name
    assert "DataflowRunner" in text and "--region=us-central1" in text
    assert "cloud-tpu" in text and "TPU_V3" in text and "ai_platform_training_args" in text
    assert "b5" in text if preset.startswith("b5") else "tiny" in text


def test_vertex_job_is_built_and_validated_without_the_network(tmp_path):
    output = str(tmp_path / "effnet.json")
    settings = _settings()
    pipeline = kubeflow_v2_runner.build_pipeline(
        "b2-lars-1024x32768", settings, {"train_archive": "gs://b/t.tar", "val_archive": "gs://b/v.tar"}, []
    )
    kubeflow_v2_runner.compile_pipeline(pipeline, settings.image, output)
    job = kubeflow_v2_runner.vertex_job(output, settings, credentials=AnonymousCredentials())
    assert job.project == "my-project" and job.location == "us-central1"
    assert job.pipeline_spec["pipelineInfo"]["name"] == "effnet-b2-lars-1024x32768"
    assert job.runtime_config.gcs_output_directory == "gs://my-bucket/pipelines"


def test_cloud_settings_refuse_a_local_root():
    with pytest.raises(ValueError, match="must be a gs:// path"):
        kubeflow_v2_runner.CloudSettings("p", "r", "img", "/tmp/root")


def test_paper_presets_shard_for_their_hosts():
    preset = presets.get("b5-lars-1024x65536")
    assert (preset.num_hosts, preset.train_shards % 128, preset.val_shards % 128) == (128, 0, 0)
    assert preset.target_top1 == 0.830
    assert presets.get("demo").target_top1 == 0.95
