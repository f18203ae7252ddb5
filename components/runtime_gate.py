"""TFX's Trainer and Evaluator with two more execution parameters: ``train_epochs`` and ``target_top1``.

A compiled Kubeflow / Vertex pipeline binds a runtime parameter only to a whole execution parameter, never to
a field inside the Trainer's ``custom_config`` JSON or the Evaluator's ``EvalConfig``. These components take
the two values a user changes at submission as parameters of their own and fold them into what TFX's
executors read, so one ``target_top1`` both stops the training and gates the blessing:

- ``Trainer`` / ``VertexTrainer``: they replace ``loop.train_epochs`` / ``loop.target_top1`` of the trainer
  config. ``VertexTrainer`` folds (and so checks) them before it creates its Vertex AI custom job
  (``components.vertex_training``): a bad value fails the step before any accelerator is provisioned.
- ``Evaluator``: ``target_top1`` becomes the top-1 threshold's lower bound; its blessing names the pipeline
  (``BASELINE_SCOPE_PROPERTY``), so a compiled pipeline's baseline lookup takes its own blessings only
  (``pipeline.spec_patches``). Left as None (the local runner), a parameter leaves the config as built.
"""

from __future__ import annotations

import time
from typing import Any

import tensorflow_model_analysis as tfma
from google.protobuf import json_format
from tfx.components.evaluator import executor as evaluator_executor
from tfx.components.trainer import executor as trainer_executor
from tfx.components.util import udf_utils
from tfx.dsl.components.base import base_executor, executor_spec
from tfx.types import artifact_utils, component_spec, standard_component_specs
from tfx.utils import json_utils, name_utils

from components import beam_executor, evaluation_results, run_label, trainer_account, vertex_training
from components import tfx_api as tfx
from components.parameters import TARGET_TOP1_KEY, TOP1_METRIC, TRAIN_EPOCHS_KEY
from effnet_common import cloud_retry

BASELINE_SCOPE_KEY = "baseline_scope"
# The blessing's custom property (artifact metadata on Vertex) naming the pipeline that blessed it.
BASELINE_SCOPE_PROPERTY = "effnet_baseline_scope"
BLESSING_KEY = "blessing"


def trainer_custom_config(custom_config_json: str, train_epochs: Any, target_top1: Any) -> str:
    """``custom_config`` JSON with the trainer config's epochs and target replaced (None keeps them)."""
    from trainer_module import tfx_trainer
    from trainer_module.config import TrainerConfig, replace

    custom_config = json_utils.loads(custom_config_json)
    given = {
        f"loop.{name}": kind(value)
        for name, kind, value in (
            (TRAIN_EPOCHS_KEY, int, train_epochs),
            (TARGET_TOP1_KEY, float, target_top1),
        )
        if value is not None
    }
    if given:
        config = TrainerConfig.from_json(custom_config[tfx_trainer.CONFIG_KEY])
        try:
            folded = replace(config, given)
        except (TypeError, ValueError) as error:
            named = ", ".join(f"{name.split('.')[1]}={value}" for name, value in given.items())
            raise ValueError(f"runtime parameters {named} do not fit the compiled preset: {error}") from None
        custom_config[tfx_trainer.CONFIG_KEY] = folded.to_json()
    return json_utils.dumps(custom_config)


def gated_eval_config(eval_config_json: str, target_top1: Any) -> str:
    """``EvalConfig`` JSON whose top-1 value threshold's lower bound is ``target_top1`` (None keeps it).

    Raises:
      ValueError: the config has no top-1 value threshold to move.
    """
    if target_top1 is None:
        return eval_config_json
    config = json_format.Parse(eval_config_json, tfma.EvalConfig())
    moved = 0
    for spec in config.metrics_specs:
        for metric in spec.metrics:
            if metric.class_name == TOP1_METRIC and metric.threshold.HasField("value_threshold"):
                metric.threshold.value_threshold.lower_bound.value = float(target_top1)
                moved += 1
    if not moved:
        raise ValueError(f"the EvalConfig has no {TOP1_METRIC} value threshold for target_top1 to set")
    return json_format.MessageToJson(config, indent=None)


def with_trainer_parameters(exec_properties: dict[str, Any]) -> dict[str, Any]:
    properties = dict(exec_properties)
    properties[standard_component_specs.CUSTOM_CONFIG_KEY] = trainer_custom_config(
        properties.get(standard_component_specs.CUSTOM_CONFIG_KEY) or "{}",
        properties.pop(TRAIN_EPOCHS_KEY, None),
        properties.pop(TARGET_TOP1_KEY, None),
    )
    return properties


class TrainerExecutor(trainer_executor.GenericExecutor):
    """TFX's generic trainer executor, after folding ``train_epochs`` / ``target_top1`` into the config.

    Every replica of a multi-machine training job runs this executor. Only the chief writes the model (the
    trainer exports once), so TFX's check that ``run_fn`` wrote it applies on the chief only; another replica
    trains in step with the chief and ends when training ends, whichever replica finishes first.
    """

    def Do(self, input_dict, output_dict, exec_properties):  # noqa: N802 - TFX's executor interface
        from trainer_module.distribute import strategies

        properties = with_trainer_parameters(exec_properties)
        if strategies.is_chief_task():
            super().Do(input_dict, output_dict, properties)
            return
        self._log_startup(input_dict, output_dict, properties)
        run_fn = udf_utils.get_fn(properties, "run_fn")
        run_fn(self._GetFnArgs(input_dict, output_dict, properties))


def run_timeout(input_dict, exec_properties: dict[str, Any], custom_config: dict) -> int | None:
    """The training (or tuning) job's timeout for the run this execution trains: the compiled ``TimeoutRule``
    applied to its config (``run_config``). None when the pipeline was compiled without a rule."""
    rule = vertex_training.TimeoutRule.from_config(custom_config)
    if rule is None:
        return None
    return rule.seconds(run_config(input_dict, exec_properties))


def run_config(input_dict, exec_properties: dict[str, Any]):
    """The trainer config this execution trains: the run's epochs folded in, the epoch of its shards'
    manifest, as the trainer will train it."""
    from tfx.components.trainer import fn_args_utils

    from trainer_module import resolve, tfx_trainer

    fn_args = fn_args_utils.get_common_fn_args(input_dict, exec_properties)
    run = resolve.ResolvedRun(tfx_trainer.config_from_fn_args(fn_args))
    return run.with_data(resolve.data_sizes(fn_args.train_files, fn_args.eval_files)).config


def labelled_with_run(
    custom_config: dict, args_key: str, task_args: list[str] | None, output_dict: dict | None = None
) -> dict:
    """``custom_config`` whose job (under ``args_key``) also carries the label of the run named among the
    task's arguments, or on Kubeflow in its ``output_dict``'s URIs (``run_label``; none outside a compiled
    pipeline), by which the exit task finds a job the run left running (``components.run_cleanup``)."""
    run_id, _ = run_label.take_run_id(task_args or [], output_dict)
    job_args = custom_config[args_key]
    labels = {**job_args.get("labels", {}), **run_label.labels(run_id)}
    return {**custom_config, args_key: {**job_args, "labels": labels}}


class VertexTrainerExecutor(base_executor.BaseExecutor):
    """Checks the runtime parameters, then runs ``TrainerExecutor`` in a Vertex AI custom job to its end.

    The job is TFX's (``custom_config`` carries its region, project, worker pools, scheduling and labels, to
    which the run's label is added), with the timeout of the run this execution trains (``run_timeout``); a
    retried task follows the job its earlier attempt started, and the job is cancelled if this task is stopped
    or fails while it runs (``components.vertex_training``).
    """

    def Do(self, input_dict, output_dict, exec_properties):  # noqa: N802 - TFX's executor interface
        entered = time.time()
        # tfx.v1's extensions import the Vertex AI SDK, which this step uses anyway.
        from tfx.v1.extensions import google_cloud_ai_platform as vertex

        properties = with_trainer_parameters(exec_properties)  # a bad value fails here, before any job
        custom_config = labelled_with_run(
            json_utils.loads(properties[standard_component_specs.CUSTOM_CONFIG_KEY]),
            vertex.TRAINING_ARGS_KEY,
            self._extra_flags,
            output_dict,
        )
        request = vertex_training.job_request(
            input_dict,
            output_dict,
            properties,
            custom_config,
            name_utils.get_full_name(TrainerExecutor),
            task="trainer",
            timeout_seconds=run_timeout(input_dict, properties, custom_config),
        )
        job = vertex_training.run_job(request, patience=cloud_retry.take_patience(self._extra_flags or [])[0])
        if output_dict.get(standard_component_specs.MODEL_RUN_KEY):
            model_run = artifact_utils.get_single_uri(output_dict[standard_component_specs.MODEL_RUN_KEY])
            trainer_account.after_vertex_job(model_run, entered, job, input_dict, properties, custom_config)


class EvaluatorExecutor(
    beam_executor.StoppableBeamExecutor, beam_executor.InstalledTfxOnLocalRunners, evaluator_executor.Executor
):
    """TFMA's evaluator executor, after setting the top-1 gate to ``target_top1``; its blessing names the
    pipeline (``baseline_scope``) and carries the evaluation's top-1, top-5 and example count
    (``evaluation_results.BLESSING_METRICS``). On Dataflow, its job carries the run's label and is cancelled
    if the task is stopped (``beam_executor.StoppableBeamExecutor``)."""

    def Do(self, input_dict, output_dict, exec_properties):  # noqa: N802 - TFX's executor interface
        properties = dict(exec_properties)
        target = properties.pop(TARGET_TOP1_KEY, None)
        scope = properties.pop(BASELINE_SCOPE_KEY, None)
        key = standard_component_specs.EVAL_CONFIG_KEY
        properties[key] = gated_eval_config(properties[key], target)
        self.take_run_outputs(output_dict)  # TFMA's Do makes the Beam pipeline
        super().Do(input_dict, output_dict, properties)
        (evaluation,) = output_dict[standard_component_specs.EVALUATION_KEY]
        for blessing in output_dict.get(BLESSING_KEY, []):
            if scope:
                blessing.set_string_custom_property(BASELINE_SCOPE_PROPERTY, scope)
            for name, value in evaluation_results.blessing_metrics(evaluation.uri).items():
                blessing.set_float_custom_property(name, value)


def _optional(kind: type) -> component_spec.ExecutionParameter:
    return component_spec.ExecutionParameter(type=kind, optional=True)


class RuntimeTrainerSpec(standard_component_specs.TrainerSpec):
    PARAMETERS = {
        **standard_component_specs.TrainerSpec.PARAMETERS,
        TRAIN_EPOCHS_KEY: _optional(int),
        TARGET_TOP1_KEY: _optional(float),
    }


class RuntimeEvaluatorSpec(standard_component_specs.EvaluatorSpec):
    PARAMETERS = {
        **standard_component_specs.EvaluatorSpec.PARAMETERS,
        TARGET_TOP1_KEY: _optional(float),
        BASELINE_SCOPE_KEY: _optional(str),
    }


def _respec(component, spec_class, **parameters) -> None:
    """Rebuilds ``component.spec`` as ``spec_class`` with ``parameters`` added (validated by TFX's spec)."""
    spec = component.spec
    component.spec = spec_class(
        **spec.inputs,
        **spec.outputs,
        **spec.exec_properties,
        **{key: value for key, value in parameters.items() if value is not None},
    )


class Trainer(tfx.components.Trainer):
    """``tfx.components.Trainer`` taking ``train_epochs`` and ``target_top1`` (values or runtime params)."""

    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(TrainerExecutor)

    def __init__(self, *, train_epochs=None, target_top1=None, **kwargs):
        super().__init__(**kwargs)
        _respec(self, RuntimeTrainerSpec, **{TRAIN_EPOCHS_KEY: train_epochs, TARGET_TOP1_KEY: target_top1})


class VertexTrainer(Trainer):
    """The same Trainer run as a Vertex AI custom job (``custom_config`` carries the job, as for TFX's)."""

    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(VertexTrainerExecutor)


class Evaluator(tfx.components.Evaluator):
    """``tfx.components.Evaluator`` taking ``target_top1`` (a value or a RuntimeParameter) as its top-1 gate
    and ``baseline_scope`` (the pipeline's name) to write on its blessing."""

    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(EvaluatorExecutor)

    def __init__(self, *, target_top1=None, baseline_scope=None, **kwargs):
        super().__init__(**kwargs)
        _respec(
            self, RuntimeEvaluatorSpec, **{TARGET_TOP1_KEY: target_top1, BASELINE_SCOPE_KEY: baseline_scope}
        )
