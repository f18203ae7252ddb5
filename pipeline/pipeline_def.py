"""The pipeline: ImageNet shards -> Trainer -> latest blessed model -> Evaluator (top-1 gate) -> Pusher.

``create_pipeline`` is pure: it builds the same ``tfx.dsl.Pipeline`` for the LocalDagRunner and for Kubeflow
/ Vertex; the runners only choose where it runs (metadata store, Beam runner options, the Trainer's executor).
"""

from __future__ import annotations

import dataclasses
import json

import tensorflow_model_analysis as tfma

from beam_preprocess.config import ShardingConfig
from components import evaluation_results, latest_blessed, parameters, runtime_gate
from components import tfx_api as tfx
from components.imagenet_shards import ImageNetShardGen
from effnet_common import schema
from trainer_module import export, tfx_trainer
from trainer_module.config import TrainerConfig

RUN_FN = "trainer_module.tfx_trainer.run_fn"
TUNER_FN = "trainer_module.tfx_trainer.tuner_fn"
TUNER_STEP = "Tuner"
TOP1 = parameters.TOP1_KEY
TOP5 = evaluation_results.TOP5
SHARDING_STEP = "ImageNetShardGen"
EVALUATOR_STEP = "Evaluator"
# The latest blessed model may tie; only a strictly worse model is refused.
CHANGE_TOLERANCE = 1e-10


def eval_config(target_top1: float) -> tfma.EvalConfig:
    """Top-1 and top-5 on the validation split through the export's tf.Example signature (its default one
    takes a client's JPEG bytes); blessed only when top-1 reaches ``target_top1`` and is not worse than the
    last blessed model (when there is one)."""
    return tfma.EvalConfig(
        model_specs=[
            tfma.ModelSpec(
                signature_name=export.EXAMPLES_SIGNATURE,
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
                        class_name=parameters.TOP1_METRIC,
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


@dataclasses.dataclass(frozen=True)
class TrainerStep:
    """The Trainer component and its extra ``custom_config`` entries (``runtime_gate.Trainer`` here; the
    Vertex runner passes ``runtime_gate.VertexTrainer`` and the Vertex job spec, region...)."""

    component_class: type = runtime_gate.Trainer
    custom_config: dict | None = None


@dataclasses.dataclass(frozen=True)
class TuningStep:
    """A Tuner step before the Trainer: it searches hyperparameters, each trial a run of the trainer on the
    shards (``trainer_module.tfx_trainer.tuner_fn``), and the Trainer trains with the best values it found.

    Attributes:
      search: the search's settings (``tfx_trainer.TUNING_KEY``).
      component_class: the Tuner component: None is TFX's; the Vertex runner passes TFX's Vertex Tuner, whose
        trials run in parallel on the accelerator's machines.
      custom_config: extra ``custom_config`` entries of that Tuner.
      parallel_trials: trials at a time (the Vertex Tuner's ``TuneArgs``).
    """

    search: dict
    component_class: type | None = None
    custom_config: dict | None = None
    parallel_trials: int = 1


@dataclasses.dataclass(frozen=True)
class PipelineSettings:
    """Everything a pipeline is built from.

    Attributes:
      name / root: TFX's pipeline name and root; the root holds every artifact (gs:// on Vertex).
      sharding: inputs and shard layout; its ``output_dir`` is replaced by the Examples artifact's URI.
      trainer_config: the Trainer's config, passed as JSON through ``custom_config``; its
        ``loop.target_top1`` is the run's target: the validation top-1 needed for blessing (and so for
        pushing), at which the trainer stops (``runtime`` may bind it to a parameter set at submission).
      serving_model_dir: where the Pusher copies a blessed model.
      metadata_connection_config: the local SQLite store; None on Kubeflow / Vertex, which bring their own.
      beam_pipeline_args: options of every Beam step (DirectRunner or Dataflow).
      step_beam_args: Beam options of one Beam step, by component id (``SHARDING_STEP``, ``EVALUATOR_STEP``),
        added to ``beam_pipeline_args``: each step's own Dataflow workers.
      enable_cache: reuse a step's outputs when its inputs and parameters are unchanged.
      runtime: values a compiled pipeline takes at submission, by name, each a ``RuntimeParameter`` (or a
        plain value): ``target_top1``, ``train_epochs``, and the sharding step's inputs and layout
        (``components.parameters``).
      trainer: the Trainer step (``TrainerStep``).
      tuning: a Tuner step first (``TuningStep``), or None.
      extra_pusher: a second Pusher beside the one into ``serving_model_dir``, built by a function of (model
        channel, blessing channel): the Vertex runner's push to the Vertex AI Model Registry and an endpoint.
      compare_with_latest_blessed: look up the latest blessed model (a TFX resolver node) as the Evaluator's
        baseline, so a model worse than it is not blessed. Open-source Kubeflow Pipelines runs no resolver
        node: without one the gate is the target top-1 alone.
      baseline_other_than_candidate: the baseline is the latest blessed model other than the Trainer's (the
        local runner: a rerun with nothing changed reuses its Evaluator and Pusher instead of comparing the
        model with itself and pushing it again; ``components.latest_blessed``).
    """

    name: str
    root: str
    sharding: ShardingConfig
    trainer_config: TrainerConfig
    serving_model_dir: str
    metadata_connection_config: object = None
    beam_pipeline_args: tuple[str, ...] = ()
    step_beam_args: dict | None = None
    enable_cache: bool = True
    runtime: dict | None = None
    trainer: TrainerStep = TrainerStep()
    tuning: TuningStep | None = None
    extra_pusher: object = None
    compare_with_latest_blessed: bool = True
    baseline_other_than_candidate: bool = False


def create_pipeline(settings: PipelineSettings) -> tfx.dsl.Pipeline:
    """The whole pipeline: shards -> (Tuner) -> Trainer -> (latest blessed model) -> Evaluator -> Pusher(s).

    The Evaluator's baseline (the latest blessed model) is scoped to this pipeline: its blessings carry the
    pipeline's name (``runtime_gate.BASELINE_SCOPE_PROPERTY``), so a model blessed by another preset's
    pipeline is never the baseline; the local metadata store scopes the resolver by pipeline too.
    """
    pipeline_name, pipeline_root, trainer_config = settings.name, settings.root, settings.trainer_config
    tuning, step_beam_args = settings.tuning, settings.step_beam_args
    runtime = dict(settings.runtime or {})
    gate = runtime.pop(runtime_gate.TARGET_TOP1_KEY, None)
    epochs = runtime.pop(runtime_gate.TRAIN_EPOCHS_KEY, None)
    step_args = step_beam_args or {}
    shards = ImageNetShardGen(sharding_config=settings.sharding.to_json(), **runtime).with_id(SHARDING_STEP)
    if step_args.get(SHARDING_STEP):
        shards.with_beam_pipeline_args(step_args[SHARDING_STEP])
    tuners = []
    if tuning is not None:
        # TFX's own Tuner runs one search in its executor and refuses TuneArgs; the Vertex Tuner takes them.
        parallel = (
            {"tune_args": tfx.proto.TuneArgs(num_parallel_trials=tuning.parallel_trials)}
            if tuning.component_class
            else {}
        )
        tuners.append(
            (tuning.component_class or tfx.components.Tuner)(
                tuner_fn=TUNER_FN,
                examples=shards.outputs["examples"],
                train_args=tfx.proto.TrainArgs(splits=[schema.TRAIN]),
                eval_args=tfx.proto.EvalArgs(splits=[schema.VALIDATION]),
                **parallel,
                custom_config={
                    tfx_trainer.CONFIG_KEY: trainer_config.to_json(),
                    tfx_trainer.TUNING_KEY: tuning.search,
                    **(tuning.custom_config or {}),
                },
            ).with_id(TUNER_STEP)
        )
    custom_config = {
        tfx_trainer.CONFIG_KEY: trainer_config.to_json(),
        **(settings.trainer.custom_config or {}),
    }
    trainer = settings.trainer.component_class(
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
    if settings.compare_with_latest_blessed and settings.baseline_other_than_candidate:
        baseline.append(latest_blessed.resolver(trainer.outputs["model"]))
    elif settings.compare_with_latest_blessed:
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
        eval_config=eval_config(trainer_config.loop.target_top1),
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
                filesystem=tfx.proto.PushDestination.Filesystem(base_directory=settings.serving_model_dir)
            ),
        )
    ]
    if settings.extra_pusher is not None:
        pushers.append(settings.extra_pusher(trainer.outputs["model"], evaluator.outputs["blessing"]))
    return tfx.dsl.Pipeline(
        pipeline_name=pipeline_name,
        pipeline_root=pipeline_root,
        components=[shards, *tuners, trainer, *baseline, evaluator, *pushers],
        enable_cache=settings.enable_cache,
        metadata_connection_config=settings.metadata_connection_config,
        beam_pipeline_args=list(settings.beam_pipeline_args),
    )
