"""``ImageNetShardGen``: the sharding Beam pipeline as a TFX component producing an ``Examples`` artifact.

Spec, executor and component in one small module. The executor is a thin shell around ``beam_preprocess``:
it points a ``ShardingConfig`` at the artifact, runs ``ShardImageNet`` in the Beam pipeline TFX configures
(``beam_pipeline_args``: the DirectRunner locally, Dataflow on Kubeflow), enforces the failure budget and
describes the shards on the artifact so that TFX's readers find them.

The inputs (archives, directories, a tensorflow-datasets dir; local or gs://) are execution parameters inside
the config, not input artifacts: the default driver resolves nothing and stats no file, so listing and
reading the inputs happens on Beam workers only.

TFX's readers take every direct child of ``<uri>/Split-<split>/`` as data, so only shards sit there and
``manifest.json`` is at the artifact root. Why the artifact says ``file_format='tfrecords_gzip'`` for
uncompressed shards: docs/sharding.md, 'In the pipeline'.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from tfx.components.util import examples_utils
from tfx.dsl.components.base import base_beam_executor, executor_spec
from tfx.orchestration import data_types
from tfx.proto import example_gen_pb2
from tfx.types import artifact_utils, component_spec

from beam_preprocess import run
from beam_preprocess.config import SPLIT_INPUTS, ShardingConfig, splits_without_input
from components import beam_executor, parameters
from components import tfx_api as tfx
from effnet_common import schema
from effnet_common.manifest import Manifest

SHARDING_CONFIG_KEY = "sharding_config"
# Execution parameters that replace the config's field of the same name when given: the inputs and the
# shard layout, so that a compiled pipeline can bind them to runtime parameters (set at submission).
OVERRIDE_PARAMETERS = parameters.SHARDING_PARAMETERS
EXAMPLES_KEY = "examples"
# TFX's artifact layout: Examples readers look for <uri>/Split-<name>/.
SPLIT_DIR_TEMPLATE = "Split-{split}"
# The one TFRecord file format TFX readers accept; compression comes from the file suffix (none here), despite
# the name (docs/sharding.md, 'In the pipeline').
TFRECORD_FILE_FORMAT = "tfrecords_gzip"

logger = logging.getLogger("components.imagenet_shards")


def artifact_config(config_json: str, uri: str, overrides: dict[str, Any] | None = None) -> ShardingConfig:
    """The sharding config of one execution: its output is the Examples artifact at ``uri``.

    ``output_dir`` and ``split_dir_template`` of the given config are replaced; ``overwrite`` is set because
    the artifact's directory belongs to this execution alone, so anything already there is a failed earlier
    attempt's leftovers, which TFX's ``Split-<name>/*`` readers must not see. ``overrides`` (the execution's
    input and layout parameters; None entries are absent) replace the config's fields and are validated
    with it.
    """
    config = ShardingConfig.from_json(config_json)
    given = {key: value for key, value in (overrides or {}).items() if value is not None}
    unknown = sorted(set(given) - set(OVERRIDE_PARAMETERS))
    if unknown:
        raise ValueError(f"unknown sharding parameters: {', '.join(unknown)}")
    config = dataclasses.replace(
        config, **given, output_dir=uri, split_dir_template=SPLIT_DIR_TEMPLATE, overwrite=True
    )
    missing = splits_without_input(config)
    if missing:
        needed = " and ".join(" or ".join(SPLIT_INPUTS[split][:2]) for split in missing)
        raise ValueError(f"no {' and no '.join(missing)} input ({needed}): {parameters.BOTH_SPLITS}")
    return config


def describe_artifact(examples: tfx.types.standard_artifacts.Examples, manifest: Manifest) -> None:
    """Records splits, file format, payload format and the manifest's counts on ``examples``.

    Custom properties: ``file_format``, ``payload_format`` (what TFX readers need), ``compression``
    ('none'), ``<split>_records`` and ``<split>_shards`` for every split written, ``failed_inputs``.

    Raises:
      RuntimeError: a split holds no record (the pipeline trains on one and gates on the other: an artifact
        without both would be reused by every later run only for its Trainer to fail).
    """
    splits = [s for s in schema.SPLITS if s in manifest.splits and manifest.splits[s].records > 0]
    if len(splits) < len(schema.SPLITS):
        counts = {name: (info.read, info.failed) for name, info in manifest.splits.items()}
        empty = [s for s in schema.SPLITS if s not in splits]
        raise RuntimeError(
            f"no {' and no '.join(empty)} record was written; (read, failed) inputs per split: {counts}"
        )
    examples.split_names = artifact_utils.encode_split_names(splits)
    examples_utils.set_file_format(examples, TFRECORD_FILE_FORMAT)
    examples_utils.set_payload_format(examples, example_gen_pb2.PayloadFormat.FORMAT_TF_EXAMPLE)
    examples.set_string_custom_property("compression", manifest.compression)
    for split in splits:
        examples.set_int_custom_property(f"{split}_records", manifest.split(split).num_examples)
        examples.set_int_custom_property(f"{split}_shards", manifest.split(split).num_shards)
    examples.set_int_custom_property("failed_inputs", len(manifest.failures))


class Executor(
    beam_executor.StoppableBeamExecutor,
    beam_executor.InstalledTfxOnLocalRunners,
    base_beam_executor.BaseBeamExecutor,
):
    """Runs ``ShardImageNet`` into the Examples artifact, then enforces the failure budget. On Dataflow, the
    job carries the run's label and is cancelled if the task is stopped
    (``beam_executor.StoppableBeamExecutor``)."""

    def Do(  # noqa: N802 - TFX's executor interface
        self,
        input_dict: dict[str, list],
        output_dict: dict[str, list],
        exec_properties: dict[str, Any],
    ) -> None:
        """Writes the shards and ``manifest.json`` under the output artifact's URI and describes it.

        Args:
          input_dict: unused (the inputs are named in the config).
          output_dict: ``{'examples': [Examples]}``.
          exec_properties: ``{'sharding_config': ShardingConfig JSON}`` and any of the input and layout
            parameters (``OVERRIDE_PARAMETERS``), which replace the config's fields.

        Raises:
          FailureBudgetExceeded: more inputs failed than ``max_failures``; the message lists them.
        """
        del input_dict
        examples = artifact_utils.get_single_instance(output_dict[EXAMPLES_KEY])
        overrides = {key: exec_properties.get(key) for key in OVERRIDE_PARAMETERS}
        config = artifact_config(exec_properties[SHARDING_CONFIG_KEY], examples.uri, overrides)
        start = time.time()
        self.take_run_outputs(output_dict)
        result = run.run(config, beam_pipeline=self._make_beam_pipeline())
        logger.info("%s", result.report(time.time() - start))
        describe_artifact(examples, result.manifest)


class ImageNetShardGenSpec(component_spec.ComponentSpec):
    """The ShardingConfig JSON, optional parameters overriding its inputs and layout, one Examples output."""

    PARAMETERS = {
        SHARDING_CONFIG_KEY: component_spec.ExecutionParameter(type=str),
        **{
            key: component_spec.ExecutionParameter(type=kind, optional=True)
            for key, kind in OVERRIDE_PARAMETERS.items()
        },
    }
    INPUTS = {}
    OUTPUTS = {EXAMPLES_KEY: component_spec.ChannelParameter(type=tfx.types.standard_artifacts.Examples)}


class ImageNetShardGen(tfx.types.BaseBeamComponent):
    """ImageNet archives / directories / tensorflow-datasets -> per-host TFRecord shards as ``Examples``.

    Output ``examples``: ``Split-train/`` and ``Split-validation/`` of uncompressed TFRecord shards of
    ``tf.train.Example`` (keys in ``effnet_common.schema``) plus ``manifest.json`` at the root.
    Beam options come from the pipeline's ``beam_pipeline_args`` or ``with_beam_pipeline_args``; on Dataflow
    they must ship this project to the workers (``--setup_file ./setup.py``), which also stops TFX from
    packaging its own installation for them.
    """

    SPEC_CLASS = ImageNetShardGenSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(Executor)

    def __init__(self, sharding_config: ShardingConfig | str, **overrides):
        """Validates ``sharding_config`` now, so that a bad config fails when the pipeline is built.

        Args:
          sharding_config: the ``ShardingConfig`` (or its ``to_json()``) naming the inputs, shard counts and
            failure budget. Its ``output_dir`` is ignored: the shards go to the Examples artifact's URI,
            laid out as ``Split-<split>/``.
          **overrides: any of ``OVERRIDE_PARAMETERS`` (``train_archive``, ``val_archive``, ``train_dir``,
            ``val_dir``, ``train_shards``, ``val_shards``), each a value or a ``RuntimeParameter``; they
            replace the config's field at execution. Plain values are checked with the config now.
        """
        if isinstance(sharding_config, ShardingConfig):
            sharding_config = sharding_config.to_json()
        fixed = {key: value for key, value in overrides.items() if not _is_runtime_parameter(value)}
        artifact_config(sharding_config, ShardingConfig.from_json(sharding_config).output_dir, fixed)
        super().__init__(
            spec=ImageNetShardGenSpec(
                sharding_config=sharding_config,
                examples=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Examples),
                **overrides,
            )
        )


def _is_runtime_parameter(value: Any) -> bool:
    return isinstance(value, data_types.RuntimeParameter)
