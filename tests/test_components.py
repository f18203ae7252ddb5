"""ImageNetShardGen: the executor on generated archives, its Examples artifact read back through TFX's own
readers (the Trainer's fn_args, the Evaluator's Beam source, the split TFXIO of StatisticsGen / Transform), the
failure budget, the component compiled for Kubeflow, and one LocalDagRunner run recorded in MLMD."""

import io
import json
import os
import re

import apache_beam as beam
import numpy as np
import pytest
import tensorflow as tf
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to
from ml_metadata.metadata_store import metadata_store
from PIL import Image
from tfx.components.trainer import fn_args_utils
from tfx.components.util import tfxio_utils
from tfx.dsl.components.base import executor_spec
from tfx.orchestration.kubeflow.v2 import kubeflow_v2_dag_runner
from tfx.types import artifact_utils
from tfx.utils import io_utils, proto_utils
from tfx_bsl.tfxio import dataset_options, dataset_util

from beam_preprocess import tfrecord
from beam_preprocess.config import ShardingConfig
from beam_preprocess.run import FailureBudgetExceeded
from components import imagenet_shards
from components import tfx_api as tfx
from components.imagenet_shards import ImageNetShardGen
from effnet_common import schema
from effnet_common.manifest import LabelConvention, Manifest, Shard, SplitManifest
from trainer_module.data import input_pipeline

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# --setup_file is what Dataflow needs to ship beam_preprocess to its workers; the DirectRunner ignores it, and
# with it TFX does not build a 50 MB sdist of its own installation for the workers on every executor start.
BEAM_ARGS = ["--direct_num_workers=1", f"--setup_file={os.path.join(REPO_ROOT, 'setup.py')}"]
TRAIN_SHARDS, VAL_SHARDS = 4, 2
TELEMETRY = ["test_components"]


def _config(archives, **overrides) -> ShardingConfig:
    values = dict(
        output_dir="replaced-by-the-artifact-uri",
        train_archive=archives.train_archive,
        val_archive=archives.val_archive,
        num_hosts=2,
        train_shards=TRAIN_SHARDS,
        val_shards=VAL_SHARDS,
    )
    return ShardingConfig(**{**values, **overrides})


def _run_executor(config: ShardingConfig, uri: str, tmp_dir: str):
    examples = tfx.types.standard_artifacts.Examples()
    examples.uri = uri
    context = imagenet_shards.Executor.Context(beam_pipeline_args=BEAM_ARGS, tmp_dir=tmp_dir, unique_id="1")
    imagenet_shards.Executor(context).Do(
        {},
        {imagenet_shards.EXAMPLES_KEY: [examples]},
        {imagenet_shards.SHARDING_CONFIG_KEY: config.to_json()},
    )
    return examples


def _column(batches, key: str) -> list:
    """One value per record of a single-valued tf.Example feature, across Arrow record batches."""
    return [values[0] for batch in batches for values in batch.column(key).to_pylist()]


@pytest.fixture(scope="module")
def sharded(clean_archives, tmp_path_factory):
    """(Examples artifact, manifest) of one executor run into a URI where a failed attempt left a shard."""
    uri = str(tmp_path_factory.mktemp("shardgen") / "examples")
    stale = os.path.join(uri, "Split-train", "train-00000-of-00009")
    os.makedirs(os.path.dirname(stale))
    with open(stale, "wb") as f:
        f.write(b"an earlier attempt's shard")
    examples = _run_executor(_config(clean_archives), uri, str(tmp_path_factory.mktemp("executor_tmp")))
    with open(os.path.join(uri, "manifest.json")) as f:
        return examples, json.load(f)


def _expected(archives, split: str) -> dict[str, str]:
    return archives.train if split == schema.TRAIN else archives.validation


# --------------------------------------------------------------------------------------------------
# The artifact on disk and in its properties.


@pytest.mark.parametrize("split,num_shards", [(schema.TRAIN, TRAIN_SHARDS), (schema.VALIDATION, VAL_SHARDS)])
def test_split_directory_holds_exactly_the_manifest_shards(sharded, clean_archives, split, num_shards):
    examples, manifest = sharded
    split_dir = artifact_utils.get_split_uri([examples], split)
    assert split_dir == os.path.join(examples.uri, f"Split-{split}")
    # TFX reads every file of the split directory: the earlier attempt's shard must be gone, nothing else there.
    assert sorted(os.listdir(split_dir)) == [
        schema.shard_name(split, i, num_shards) for i in range(num_shards)
    ]
    info = manifest["splits"][split]
    assert info["num_shards"] == num_shards and info["directory"] == f"Split-{split}"
    assert info["records"] == len(_expected(clean_archives, split)) and info["failed"] == 0
    for shard in info["shards"]:
        with open(os.path.join(examples.uri, shard["path"]), "rb") as f:
            # read_records checks the CRCs of plain TFRecord framing: the file is not compressed.
            assert sum(1 for _ in tfrecord.read_records(f)) == shard["records"]
    assert sorted(os.listdir(examples.uri)) == ["Split-train", "Split-validation", "manifest.json"]


def test_artifact_records_splits_formats_and_counts(sharded, clean_archives):
    examples, manifest = sharded
    assert artifact_utils.decode_split_names(examples.split_names) == ["train", "validation"]
    expected = {
        "file_format": "tfrecords_gzip",
        "payload_format": "FORMAT_TF_EXAMPLE",
        "compression": "none",
        "train_records": len(clean_archives.train),
        "validation_records": len(clean_archives.validation),
        "train_shards": TRAIN_SHARDS,
        "validation_shards": VAL_SHARDS,
        "failed_inputs": 0,
    }
    assert {key: examples.get_custom_property(key) for key in expected} == expected
    assert manifest["compression"] == "none" and manifest["options"]["output_dir"] == examples.uri


# --------------------------------------------------------------------------------------------------
# Read back through TFX's own reader paths.


@pytest.mark.parametrize(
    "split,files_attr", [(schema.TRAIN, "train_files"), (schema.VALIDATION, "eval_files")]
)
def test_trainer_fn_args_read_every_record_uncompressed(sharded, clean_archives, split, files_attr):
    examples, manifest = sharded
    fn_args = fn_args_utils.get_common_fn_args(
        {"examples": [examples]},
        {
            "train_args": proto_utils.proto_to_json(tfx.proto.TrainArgs(splits=[schema.TRAIN])),
            "eval_args": proto_utils.proto_to_json(tfx.proto.EvalArgs(splits=[schema.VALIDATION])),
        },
    )
    files = getattr(fn_args, files_attr)
    assert files == [os.path.join(examples.uri, f"Split-{split}", "*")]
    # The compression tf.data readers in tfx_bsl choose for these files: "" (none), not GZIP.
    assert dataset_util.detect_compression_type(tf.constant(files)).numpy() == b""
    options = dataset_options.RecordBatchesOptions(batch_size=64, num_epochs=1, shuffle=False)
    batches = list(fn_args.data_accessor.record_batch_factory(files, options, None))
    expected = _expected(clean_archives, split)
    filenames = [name.decode() for name in _column(batches, schema.FILENAME)]
    assert sorted(filenames) == sorted(expected)
    synsets = [s.decode() for s in _column(batches, schema.SYNSET)]
    assert synsets == [expected[name] for name in filenames]
    assert _column(batches, schema.LABEL) == [schema.synset_to_label()[s] for s in synsets]
    # One image parsed to pixels: a JPEG of the size the Example declares.
    pixels = np.asarray(Image.open(io.BytesIO(_column(batches, schema.IMAGE_ENCODED)[0])))
    height, width = _column(batches, schema.HEIGHT)[0], _column(batches, schema.WIDTH)[0]
    assert pixels.shape == (height, width, 3) == (24, 24, 3)
    # The trainer's own epoch-size count agrees (it reads manifest.json at the artifact root).
    counts = input_pipeline.record_counts(input_pipeline.list_files(files))
    assert sum(counts) == manifest["splits"][split]["records"] == len(expected)


def test_evaluator_beam_source_reads_the_validation_split(sharded, clean_archives):
    examples, _ = sharded
    # What the Evaluator (TFMA) does: a TFXIO from the artifact, one per split URI, read as a Beam source.
    make_tfxio = tfxio_utils.get_tfxio_factory_from_artifact([examples], TELEMETRY)
    split_uri = artifact_utils.get_split_uri([examples], schema.VALIDATION)
    source = make_tfxio(io_utils.all_files_pattern(split_uri)).BeamSource()
    expected = sorted((name, schema.synset_to_label()[s]) for name, s in clean_archives.validation.items())
    with test_pipeline.TestPipeline() as p:
        rows = (
            p
            | source
            | beam.FlatMap(
                lambda batch: zip(
                    _column([batch], schema.FILENAME), _column([batch], schema.LABEL), strict=True
                )
            )
            | beam.MapTuple(lambda name, label: (name.decode(), label))
        )
        assert_that(rows, equal_to(expected))


def test_split_tfxio_accepts_the_file_format(sharded, clean_archives):
    examples, _ = sharded
    # StatisticsGen and Transform pass the file_format custom property through make_tfxio's check.
    split_tfxio = tfxio_utils.get_split_tfxio([examples], schema.TRAIN, TELEMETRY)
    options = dataset_options.RecordBatchesOptions(batch_size=1000, num_epochs=1, shuffle=False)
    assert sum(batch.num_rows for batch in split_tfxio.RecordBatches(options)) == len(clean_archives.train)


# --------------------------------------------------------------------------------------------------
# The failure budget.


@pytest.mark.parametrize("budget_covers_failures", [False, True])
def test_failure_budget(quirky_archives, tmp_path, budget_covers_failures):
    max_failures = len(quirky_archives.bad) if budget_covers_failures else 0
    config = _config(quirky_archives, max_failures=max_failures)
    uri = str(tmp_path / "examples")
    if budget_covers_failures:
        examples = _run_executor(config, uri, str(tmp_path / "tmp"))
        assert examples.get_custom_property("failed_inputs") == len(quirky_archives.bad)
        assert examples.get_custom_property("train_records") == len(quirky_archives.train)
        return
    with pytest.raises(FailureBudgetExceeded) as raised:
        _run_executor(config, uri, str(tmp_path / "tmp"))
    message = str(raised.value)
    assert f"{len(quirky_archives.bad)} inputs could not be used" in message
    assert os.path.join(uri, "manifest.failed.json") in message
    # Nothing that looks like a finished output stays: no manifest.json, no shards.
    assert not os.path.exists(os.path.join(uri, "manifest.json"))
    assert not [f for _, _, files in os.walk(uri) for f in files if "-of-" in f]
    missing = [name for name in quirky_archives.bad if name not in message]
    assert not missing, f"failures not named in the error: {missing}\n{message}"


@pytest.mark.parametrize("written", [0, 5])
def test_artifact_without_records_in_both_splits_is_refused(written):
    """The pipeline trains on one split and gates on the other: an artifact missing one (its images all failed
    within the budget) would be reused by every later run, each failing at its Trainer."""
    examples = tfx.types.standard_artifacts.Examples()
    shards = (Shard("Split-train/train-00000-of-00001", written, 100),) if written else ()
    train = SplitManifest(
        "train",
        5,
        written,
        5 - written,
        100 if written else 0,
        "Split-train",
        "Split-train/train-*-of-*",
        shards,
    )
    only_failures = SplitManifest(
        "validation", 2, 0, 2, 0, "Split-validation", "Split-validation/validation-*-of-*", shards=()
    )
    manifest = Manifest(
        {"train": train, "validation": only_failures},
        LabelConvention(schema.LABEL_CONVENTION),
        schema.FEATURE_KEYS,
    )
    missing = "train and no validation" if not written else "validation"
    with pytest.raises(RuntimeError, match=rf"no {missing} record was written; .* 'validation': \(2, 2\)\}}"):
        imagenet_shards.describe_artifact(examples, manifest)
    assert not examples.has_custom_property("file_format")


@pytest.mark.parametrize(
    "overrides, missing",
    [
        ({"val_archive": ""}, "no validation input (val_archive or val_dir)"),
        ({"train_archive": ""}, "no train input (train_archive or train_dir)"),
    ],
)
def test_the_sharding_step_refuses_a_run_without_both_splits(clean_archives, overrides, missing):
    given = _config(clean_archives)
    with pytest.raises(ValueError, match=re.escape(missing) + ": the pipeline trains on the training split"):
        imagenet_shards.artifact_config(given.to_json(), "gs://bucket/examples/7", overrides)


# --------------------------------------------------------------------------------------------------
# The component and its spec.


def test_artifact_config_points_the_config_at_the_artifact(clean_archives):
    given = _config(clean_archives, max_failures=3)
    config = imagenet_shards.artifact_config(given.to_json(), "gs://bucket/root/ImageNetShardGen/examples/7")
    assert config.output_dir == "gs://bucket/root/ImageNetShardGen/examples/7" and config.overwrite
    assert config.split_dir("train") == "gs://bucket/root/ImageNetShardGen/examples/7/Split-train"
    assert config.manifest_path == "gs://bucket/root/ImageNetShardGen/examples/7/manifest.json"
    assert (config.train_archive, config.max_failures, config.train_shards) == (given.train_archive, 3, 4)


def test_component_spec_and_kubeflow_compilation(clean_archives, tmp_path):
    config = _config(clean_archives)
    component = ImageNetShardGen(sharding_config=config).with_beam_pipeline_args(["--runner=DataflowRunner"])
    assert component.id == "ImageNetShardGen"
    assert component.exec_properties == {"sharding_config": config.to_json()}
    assert ImageNetShardGen(sharding_config=config.to_json()).exec_properties == component.exec_properties
    assert component.outputs["examples"].type is tfx.types.standard_artifacts.Examples
    assert not component.inputs
    assert isinstance(component.executor_spec, executor_spec.BeamExecutorSpec)
    assert component.executor_spec.executor_class is imagenet_shards.Executor
    assert component.executor_spec.beam_pipeline_args == ["--runner=DataflowRunner"]

    pipeline = tfx.dsl.Pipeline(
        pipeline_name="shards", pipeline_root="gs://bucket/root", components=[component]
    )
    runner = kubeflow_v2_dag_runner.KubeflowV2DagRunner(
        config=kubeflow_v2_dag_runner.KubeflowV2DagRunnerConfig(
            default_image="image", use_pipeline_spec_2_1=True
        ),
        output_dir=str(tmp_path),
        output_filename="shards.json",
    )
    runner.run(pipeline)
    with open(tmp_path / "shards.json") as f:
        spec = json.load(f)["pipelineSpec"]
    container = spec["deploymentSpec"]["executors"]["ImageNetShardGen_executor"]["container"]
    assert container["args"][:2] == ["--executor_class_path", "components.imagenet_shards.Executor"]
    assert "--runner=DataflowRunner" in container["args"]
    parameter = spec["root"]["dag"]["tasks"]["ImageNetShardGen"]["inputs"]["parameters"]["sharding_config"]
    assert ShardingConfig.from_json(parameter["runtimeValue"]["constant"]) == config


@pytest.mark.parametrize(
    "config_json,message",
    [
        ('{"output_dir": "x"}', "no input"),
        ('{"output_dir": "x", "train_dir": "t", "shards": 3}', "unknown ShardingConfig fields"),
        ('{"output_dir": "x", "train_dir": "t", "num_hosts": 4, "train_shards": 6}', "multiple of num_hosts"),
    ],
)
def test_bad_config_fails_when_the_pipeline_is_built(config_json, message):
    with pytest.raises(ValueError, match=message):
        ImageNetShardGen(sharding_config=config_json)


@pytest.mark.slow
def test_local_dag_runner_records_the_examples_in_mlmd(clean_archives, tmp_path):
    connection = tfx.orchestration.metadata.sqlite_metadata_connection_config(str(tmp_path / "mlmd.sqlite"))
    pipeline = tfx.dsl.Pipeline(
        pipeline_name="shards",
        pipeline_root=str(tmp_path / "root"),
        components=[ImageNetShardGen(sharding_config=_config(clean_archives))],
        metadata_connection_config=connection,
        beam_pipeline_args=BEAM_ARGS,
    )
    tfx.orchestration.LocalDagRunner().run(pipeline)

    (artifact,) = metadata_store.MetadataStore(connection).get_artifacts_by_type("Examples")
    assert artifact.uri.startswith(str(tmp_path / "root" / "ImageNetShardGen" / "examples"))
    assert json.loads(artifact.properties["split_names"].string_value) == ["train", "validation"]
    custom = artifact.custom_properties
    assert custom["file_format"].string_value == "tfrecords_gzip"
    assert custom["payload_format"].string_value == "FORMAT_TF_EXAMPLE"
    assert custom["train_records"].int_value == len(clean_archives.train)
    assert custom["validation_records"].int_value == len(clean_archives.validation)
    assert sorted(os.listdir(os.path.join(artifact.uri, "Split-validation"))) == [
        schema.shard_name("validation", i, VAL_SHARDS) for i in range(VAL_SHARDS)
    ]


# ---- TFX's package for remote Beam workers --------------------------------------------------------------------


def _executors(beam_args):
    from components import run_cleanup, runtime_gate

    for executor in (imagenet_shards.Executor, runtime_gate.EvaluatorExecutor, run_cleanup.Executor):
        yield executor(executor.Context(beam_pipeline_args=list(beam_args)))


def test_local_beam_steps_build_no_tfx_package_and_keep_their_options(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where TFX would build it
    for args in (
        [],
        ["--direct_num_workers=2", "--direct_running_mode=multi_threading"],
        ["--runner=DirectRunner"],
    ):
        for executor in _executors(args):
            assert executor._beam_pipeline_args == args, type(executor).__name__
    assert os.listdir(tmp_path) == []


def test_a_remote_runner_without_an_image_still_gets_tfxs_package(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    args = ["--runner=DataflowRunner", "--project=p", "--region=us-central1"]
    executor = imagenet_shards.Executor(imagenet_shards.Executor.Context(beam_pipeline_args=args))
    packages = [a for a in executor._beam_pipeline_args if a.startswith("--extra_package=")]
    assert len(packages) == 1 and packages[0].startswith(f"--extra_package={tmp_path}/")
    assert packages[0].endswith(".tar.gz") and os.path.isfile(packages[0].partition("=")[2])
    # The compiled cloud steps name their SDK image: TFX builds nothing for them.
    image = [*args, "--sdk_container_image=gcr.io/p/effnet@sha256:" + "0" * 64, "--sdk_location=container"]
    for executor in _executors(image):
        assert not any(a.startswith("--extra_package") for a in executor._beam_pipeline_args)
