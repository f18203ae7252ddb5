"""The pipeline: ImageNet shards -> Trainer -> latest blessed model -> Evaluator (top-1 gate) -> Pusher.

``create_pipeline`` is pure: it builds the same ``tfx.dsl.Pipeline`` for the LocalDagRunner and for Kubeflow /
Vertex; the runners only choose where it runs (metadata store, Beam runner options, the Trainer's executor).
"""

from __future__ import annotations

import json

import tensorflow_model_analysis as tfma
from tfx import v1 as tfx

from beam_preprocess import schema
from beam_preprocess.config import ShardingConfig
from components import runtime_gate
from components.imagenet_shards import ImageNetShardGen
from trainer_module import export, tfx_trainer
from trainer_module.config import TrainerConfig

RUN_FN = "trainer_module.tfx_trainer.run_fn"
TUNER_FN = "trainer_module.tfx_trainer.tuner_fn"
TUNER_STEP = "Tuner"
TOP1 = "sparse_categorical_accuracy"
TOP5 = "top5_accuracy"
SHARDING_STEP = "ImageNetShardGen"
EVALUATOR_STEP = "Evaluator"
# The latest blessed model may tie; only a strictly worse model is refused.
CHANGE_TOLERANCE = 1e-10


def eval_config(target_top1: float) -> tfma.EvalConfig:
    """Top-1 and top-5 on the validation split through ``serving_default``; blessed only when top-1 reaches
    ``target_top1`` and is not worse than the last blessed model (when there is one)."""
    return tfma.EvalConfig(
        model_specs=[
            tfma.ModelSpec(
                signature_name="serving_default",
                label_key=schema.LABEL,
                prediction_key=export.PROBABILITIES,
                model_type="tf_generic",
            )
        ],
        slicing_specs=[tfma.SlicingSpec()],
        metrics_specs=[
            tfma.MetricsSpec(
                metrics=[
                    tfma.MetricConfig(
                        class_name="SparseCategoricalAccuracy",
                        threshold=tfma.MetricThreshold(
                            value_threshold=tfma.GenericValueThreshold(lower_bound={"value": target_top1}),
                            change_threshold=tfma.GenericChangeThreshold(
                                direction=tfma.MetricDirection.HIGHER_IS_BETTER,
                                absolute={"value": -CHANGE_TOLERANCE},
                            ),
                        ),
                    ),
                    tfma.MetricConfig(
                        class_name="SparseTopKCategoricalAccuracy", config=json.dumps({"k": 5, "name": TOP5})
                    ),
                ]
            )
        ],
    )


def create_pipeline(
    pipeline_name: str,
    pipeline_root: str,
    sharding: ShardingConfig,
    trainer_config: TrainerConfig,
    target_top1: float,
    serving_model_dir: str,
    metadata_connection_config=None,
    beam_pipeline_args: list[str] | None = None,
    trainer_class=runtime_gate.Trainer,
    trainer_custom_config: dict | None = None,
    enable_cache: bool = True,
    runtime: dict | None = None,
    extra_pusher=None,
    step_beam_args: dict[str, list[str]] | None = None,
    compare_with_latest_blessed: bool = True,
    tuning: dict | None = None,
    tuner_class=None,
    tuner_custom_config: dict | None = None,
    parallel_trials: int = 1,
) -> tfx.dsl.Pipeline:
    """The whole pipeline.

    Args:
      pipeline_name / pipeline_root: TFX's; the root holds every artifact (gs:// on Vertex).
      sharding: inputs and shard layout; its ``output_dir`` is replaced by the Examples artifact's URI.
      trainer_config: the Trainer's config, passed as JSON through ``custom_config``.
      target_top1: validation top-1 needed for blessing (and so for pushing).
      serving_model_dir: where the Pusher copies a blessed model.
      metadata_connection_config: the local SQLite store; None on Kubeflow / Vertex, which bring their own.
      beam_pipeline_args: options of the sharding component's Beam pipeline (DirectRunner or Dataflow).
      trainer_class: the Trainer component (``runtime_gate.Trainer`` here; the Vertex runner passes
        ``runtime_gate.VertexTrainer`` to train in a Vertex AI custom job).
      trainer_custom_config: extra ``custom_config`` entries for that Trainer (Vertex job spec, region...).
      enable_cache: reuse a step's outputs when its inputs and parameters are unchanged.
      runtime: values a compiled pipeline takes at submission, by name, each a ``RuntimeParameter`` (or a
        plain value): ``target_top1`` (the trainer's stop and the Evaluator's gate), ``train_epochs``, and
        the sharding step's inputs and layout (``imagenet_shards.OVERRIDE_PARAMETERS``).
      extra_pusher: a second Pusher beside the one into ``serving_model_dir``, built by a function of (model
        channel, blessing channel): the Vertex runner's push to the Vertex AI Model Registry and an endpoint.
      step_beam_args: Beam options of one Beam step, by component id (``SHARDING_STEP``, ``EVALUATOR_STEP``),
        added to ``beam_pipeline_args``: each step's own Dataflow workers.
      tuning: when given, a Tuner step searches hyperparameters first, each trial a run of the trainer on
        the shards (``trainer_module.tfx_trainer.tuner_fn``; the search's settings, ``TUNING_KEY``), and the
        Trainer trains with the best values it found.
      tuner_class / tuner_custom_config / parallel_trials: the Tuner component (TFX's; the Vertex runner
        passes TFX's Vertex Tuner, whose trials run in parallel on the accelerator's machines), its extra
        ``custom_config`` entries and its parallel trials.
      compare_with_latest_blessed: look up the latest blessed model (a TFX resolver node) as the Evaluator's
        baseline, so a model worse than it is not blessed. Open-source Kubeflow Pipelines runs no resolver
        node: without one the gate is the target top-1 alone.

    The Evaluator's baseline (the latest blessed model) is scoped to this pipeline: its blessings carry the
    pipeline's name (``runtime_gate.BASELINE_SCOPE_PROPERTY``), so a model blessed by another preset's
    pipeline is never the baseline; the local metadata store scopes the resolver by pipeline too.
    """
    runtime = dict(runtime or {})
    gate = runtime.pop(runtime_gate.TARGET_TOP1_KEY, None)
    epochs = runtime.pop(runtime_gate.TRAIN_EPOCHS_KEY, None)
    step_args = step_beam_args or {}
    shards = ImageNetShardGen(sharding_config=sharding.to_json(), **runtime).with_id(SHARDING_STEP)
    if step_args.get(SHARDING_STEP):
        shards.with_beam_pipeline_args(step_args[SHARDING_STEP])
    tuners = []
    if tuning is not None:
        # TFX's own Tuner runs one search in its executor and refuses TuneArgs; the Vertex Tuner takes them.
        parallel = (
            {"tune_args": tfx.proto.TuneArgs(num_parallel_trials=parallel_trials)} if tuner_class else {}
        )
        tuners.append(
            (tuner_class or tfx.components.Tuner)(
                tuner_fn=TUNER_FN,
                examples=shards.outputs["examples"],
                train_args=tfx.proto.TrainArgs(splits=[schema.TRAIN]),
                eval_args=tfx.proto.EvalArgs(splits=[schema.VALIDATION]),
                **parallel,
                custom_config={
                    tfx_trainer.CONFIG_KEY: trainer_config.to_json(),
                    tfx_trainer.TUNING_KEY: tuning,
                    **(tuner_custom_config or {}),
                },
            ).with_id(TUNER_STEP)
        )
    custom_config = {tfx_trainer.CONFIG_KEY: trainer_config.to_json(), **(trainer_custom_config or {})}
    trainer = trainer_class(
        examples=shards.outputs["examples"],
        run_fn=RUN_FN,
        train_args=tfx.proto.TrainArgs(splits=[schema.TRAIN]),
        eval_args=tfx.proto.EvalArgs(splits=[schema.VALIDATION]),
        custom_config=custom_config,
        train_epochs=epochs,
        target_top1=gate,
        hyperparameters=tuners[0].outputs["best_hyperparameters"] if tuners else None,
    ).with_id("Trainer")
    baseline = []
    if compare_with_latest_blessed:
        baseline.append(
            tfx.dsl.Resolver(
                strategy_class=tfx.dsl.experimental.LatestBlessedModelStrategy,
                model=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Model),
                model_blessing=tfx.dsl.Channel(type=tfx.types.standard_artifacts.ModelBlessing),
            ).with_id("latest_blessed_model_resolver")
        )
    evaluator = runtime_gate.Evaluator(
        examples=shards.outputs["examples"],
        model=trainer.outputs["model"],
        baseline_model=baseline[0].outputs["model"] if baseline else None,
        eval_config=eval_config(target_top1),
        example_splits=[schema.VALIDATION],
        target_top1=gate,
        baseline_scope=pipeline_name,
    ).with_id(EVALUATOR_STEP)
    if step_args.get(EVALUATOR_STEP):
        evaluator.with_beam_pipeline_args(step_args[EVALUATOR_STEP])
    pushers = [
        tfx.components.Pusher(
            model=trainer.outputs["model"],
            model_blessing=evaluator.outputs["blessing"],
            push_destination=tfx.proto.PushDestination(
                filesystem=tfx.proto.PushDestination.Filesystem(base_directory=serving_model_dir)
            ),
        )
    ]
    if extra_pusher is not None:
        pushers.append(extra_pusher(trainer.outputs["model"], evaluator.outputs["blessing"]))
    return tfx.dsl.Pipeline(
        pipeline_name=pipeline_name,
        pipeline_root=pipeline_root,
        components=[shards, *tuners, trainer, *baseline, evaluator, *pushers],
        enable_cache=enable_cache,
        metadata_connection_config=metadata_connection_config,
        beam_pipeline_args=beam_pipeline_args or [],
    )
