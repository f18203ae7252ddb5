"""TFX's Trainer and Evaluator with two more execution parameters: ``train_epochs`` and ``target_top1``.

A compiled Kubeflow / Vertex pipeline can only bind a runtime parameter to a whole execution parameter of a
component (int, float or str), never to a field inside the Trainer's ``custom_config`` JSON or the
Evaluator's ``EvalConfig``. These components add the two values a user changes at submission as parameters
of their own, and their executors fold them into what TFX's executors read, so one runtime parameter
``target_top1`` both stops the training at the target and gates the blessing:

- ``Trainer`` / ``VertexTrainer``: ``train_epochs`` and ``target_top1`` replace ``loop.train_epochs`` and
  ``loop.target_top1`` of the trainer config in ``custom_config`` (``trainer_module.tfx_trainer.CONFIG_KEY``),
  then TFX's generic executor runs ``run_fn`` as before. ``VertexTrainer`` folds (and so checks) them before
  it creates the Vertex AI custom job that runs that same executor (``components.vertex_training``: the job
  TFX's Vertex Trainer extension builds, with the timeout of the run's own epochs, found again by a retried
  task, cancelled when the task is stopped), so a value the trainer would refuse fails the step in one line
  before any accelerator is provisioned.
- ``Evaluator``: ``target_top1`` becomes the lower bound of the top-1 value threshold of the ``EvalConfig``;
  and ``baseline_scope`` (the pipeline's name, a constant) is written on the blessing it produces
  (``BASELINE_SCOPE_PROPERTY``), so that the latest-blessed-model lookup of a compiled pipeline can ask for
  blessings of its own pipeline only (``pipeline.spec_patches`` adds that condition to the lookup's query).

Left as None (the local runner), each parameter leaves the config as it was built.

The steps that start cloud jobs (``VertexTrainer``, ``Evaluator`` on Dataflow, ``components.vertex_tuner``) also put the run's
id (an argument of every task of a compiled Vertex pipeline, the output URIs on Kubeflow: ``components.run_label``)
on their job as the run's label, by which the pipeline's exit handler finds what a run left running (``components.run_cleanup``).
"""

from __future__ import annotations

from typing import Any

import tensorflow_model_analysis as tfma
from google.protobuf import json_format
from tfx.components.evaluator import executor as evaluator_executor
from tfx.components.trainer import executor as trainer_executor
from tfx.components.util import udf_utils
from tfx.dsl.components.base import base_executor, executor_spec
from tfx.types import component_spec, standard_component_specs
from tfx.utils import json_utils, name_utils

from components import beam_executor, evaluation_results, run_label, vertex_training
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


def _with_trainer_parameters(exec_properties: dict[str, Any]) -> dict[str, Any]:
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

        properties = _with_trainer_parameters(exec_properties)
        if strategies.is_chief_task():
            super().Do(input_dict, output_dict, properties)
            return
        self._log_startup(input_dict, output_dict, properties)
        run_fn = udf_utils.get_fn(properties, "run_fn")
        run_fn(self._GetFnArgs(input_dict, output_dict, properties))


def run_timeout(input_dict, exec_properties: dict[str, Any], custom_config: dict) -> int | None:
    """The training (or tuning) job's timeout for the run this execution trains: the compiled ``TimeoutRule``
    applied to its config (the run's epochs folded in) with the epoch of its shards' manifest, as the trainer will
    train it. None when the pipeline was compiled without a rule."""
    rule = vertex_training.TimeoutRule.from_config(custom_config)
    if rule is None:
        return None
    from tfx.components.trainer import fn_args_utils

    from trainer_module import resolve, tfx_trainer

    fn_args = fn_args_utils.get_common_fn_args(input_dict, exec_properties)
    run = resolve.ResolvedRun(tfx_trainer.config_from_fn_args(fn_args))
    return rule.seconds(run.with_data(resolve.data_sizes(fn_args.train_files, fn_args.eval_files)).config)


def labelled_with_run(
    custom_config: dict, args_key: str, task_args: list[str] | None, output_dict: dict | None = None
) -> dict:
    """``custom_config`` whose job (under ``args_key``) also carries the label of the run named among the task's
    arguments, or on Kubeflow in its ``output_dict``'s URIs (``run_label``; none outside a compiled pipeline)."""
    run_id, _ = run_label.take_run_id(task_args or [], output_dict)
    job_args = custom_config[args_key]
    labels = {**job_args.get("labels", {}), **run_label.labels(run_id)}
    return {**custom_config, args_key: {**job_args, "labels": labels}}


class VertexTrainerExecutor(base_executor.BaseExecutor):
    """Checks the runtime parameters, then runs ``TrainerExecutor`` in a Vertex AI custom job to its end.

    The job is TFX's (``custom_config`` carries its region, project, worker pools, scheduling and labels, to which
    the run's label is added), with the timeout of the run this execution trains (``run_timeout``); a retried task
    follows the job its earlier attempt started, and the job is cancelled if this task is stopped or fails while it
    runs (``components.vertex_training``).
    """

    def Do(self, input_dict, output_dict, exec_properties):  # noqa: N802 - TFX's executor interface
        # tfx.v1's extensions import the Vertex AI SDK, which this step uses anyway.
        from tfx.v1.extensions import google_cloud_ai_platform as vertex

        properties = _with_trainer_parameters(exec_properties)  # a bad value fails here, before any job
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
        vertex_training.run_job(request, patience=cloud_retry.take_patience(self._extra_flags or [])[0])


class TpuVmTrainerExecutor(base_executor.BaseExecutor):
    """Checks the runtime parameters, then runs ``TrainerExecutor`` on worker 0 of a multi-host TPU VM slice
    (``components.tpu_vm``), with the run's label on the slice; the slice is deleted when the training ends,
    fails, or this task is stopped, and a retried task re-attaches to its slice.

    ``custom_config[tpu_vm.CONFIG_KEY]`` holds the slice's settings (``pipeline.cloud.CloudSettings.tpu_vm_config``
    or the local runner's rehearsal), the trainer image among them. Worker 0 runs in that image the command a
    Vertex job's pool would run (TFX's executor entry point on this execution's inputs, outputs and parameters;
    ``components.tpu_worker``).
    """

    def Do(self, input_dict, output_dict, exec_properties):  # noqa: N802 - TFX's executor interface
        import os

        from tfx.types import artifact_utils

        from components import tpu_slices, tpu_vm, tpu_worker

        properties = _with_trainer_parameters(exec_properties)  # a bad value fails here, before any slice
        custom_config = json_utils.loads(properties[standard_component_specs.CUSTOM_CONFIG_KEY])
        settings = dict(custom_config[tpu_vm.CONFIG_KEY])
        run_id, _ = run_label.take_run_id(self._extra_flags or [], output_dict)
        labels = {
            **settings.pop("labels", {}),
            **run_label.labels(run_id),
            vertex_training.TASK_LABEL: "trainer",
        }
        endpoint = settings.pop("api_endpoint", tpu_vm.API_ENDPOINT)
        endpoint = os.environ.get(tpu_vm.ENDPOINT_VARIABLE) or endpoint  # a rehearsal's or a test's server
        poll_seconds = settings.pop("poll_seconds", None)
        (model_run,) = output_dict["model_run"]
        command = [
            "python", "-m", "tfx.scripts.run_executor",
            "--executor_class_path", name_utils.get_full_name(TrainerExecutor),
            "--inputs", artifact_utils.jsonify_artifact_dict(input_dict),
            "--outputs", artifact_utils.jsonify_artifact_dict(output_dict),
            "--exec-properties", json_utils.dumps(properties),
        ]  # fmt: skip
        tpu_worker.write_command(model_run.uri, command, {})
        request = tpu_vm.SliceRequest(
            name=tpu_vm.slice_name(vertex_training.outputs_digest(output_dict)),
            status_dir=model_run.uri,
            startup_script=tpu_worker.startup_script(settings.pop("image")),
            runtime_version=tpu_slices.POD_RUNTIME,
            labels=labels,
            api_endpoint=endpoint,
            **settings,
        )
        patience = cloud_retry.take_patience(self._extra_flags or [])[0]
        tpu_vm.run_slice(request, poll_seconds=poll_seconds, patience=patience)


class EvaluatorExecutor(
    beam_executor.StoppableBeamExecutor, beam_executor.InstalledTfxOnLocalRunners, evaluator_executor.Executor
):
    """TFMA's evaluator executor, after setting the top-1 gate to ``target_top1``; its blessing names the
    pipeline (``baseline_scope``) and carries the evaluation's top-1, top-5 and example count
    (``evaluation_results.BLESSING_METRICS``). On Dataflow, its job carries the run's label and is cancelled if the task is
    stopped (``beam_executor.StoppableBeamExecutor``)."""

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
    """``tfx.components.Trainer`` taking ``train_epochs`` and ``target_top1`` (values or RuntimeParameters)."""

    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(TrainerExecutor)

    def __init__(self, *, train_epochs=None, target_top1=None, **kwargs):
        super().__init__(**kwargs)
        _respec(self, RuntimeTrainerSpec, **{TRAIN_EPOCHS_KEY: train_epochs, TARGET_TOP1_KEY: target_top1})


class VertexTrainer(Trainer):
    """The same Trainer run as a Vertex AI custom job (``custom_config`` carries the job, as for TFX's)."""

    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(VertexTrainerExecutor)


class TpuVmTrainer(Trainer):
    """The same Trainer run on a multi-host TPU VM slice (``custom_config`` carries the slice's settings)."""

    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(TpuVmTrainerExecutor)


class Evaluator(tfx.components.Evaluator):
    """``tfx.components.Evaluator`` taking ``target_top1`` (a value or a RuntimeParameter) as its top-1 gate
    and ``baseline_scope`` (the pipeline's name) to write on its blessing."""

    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(EvaluatorExecutor)

    def __init__(self, *, target_top1=None, baseline_scope=None, **kwargs):
        super().__init__(**kwargs)
        _respec(
            self, RuntimeEvaluatorSpec, **{TARGET_TOP1_KEY: target_top1, BASELINE_SCOPE_KEY: baseline_scope}
        )
