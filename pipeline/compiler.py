"""Compiling the pipeline for Vertex AI Pipelines or Kubeflow: plan, build, compile, patch, write.

The same ``create_pipeline`` as the local runner, with: the pipeline image on every step, a gs:// pipeline
root, the sharding step's Beam pipeline on Dataflow, and the Trainer as a Vertex AI custom job on the
machines of the accelerator (``CloudSettings``). In order:

- ``plan_pipeline``: the run resolved as the local runner resolves it (``PipelinePreset.resolve``, checked
  against the accelerator), the runtime parameters' defaults read from it, and the tuning step, if any;
- ``compile_pipeline``: the TFX pipeline for the cloud (``build_pipeline``), compiled by TFX's
  ``KubeflowV2DagRunner``, its spec patched (``pipeline.spec_patches``), written as a Vertex PipelineJob
  (``.json``) or a bare Kubeflow PipelineSpec (``.yaml``).

Called with typed values (no command line): ``pipeline.kubeflow_v2_runner`` is its CLI.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from components import parameters
from pipeline.cloud import CloudSettings

if TYPE_CHECKING:
    from pipeline.presets import PipelinePreset, PipelineRun

# The runtime parameters of a compiled pipeline and their types (names as the Vertex run form shows them):
# the sharding step's inputs and layout, the Trainer's and Evaluator's run values, each declared by its
# component.
RUNTIME_PARAMETERS = {**parameters.SHARDING_PARAMETERS, **parameters.RUN_PARAMETERS}
INPUT_KEYS = tuple(parameters.INPUT_PARAMETERS)
# The PipelineSpec 2.1 type of each Python type above.
PARAMETER_TYPES = {str: "STRING", int: "NUMBER_INTEGER", float: "NUMBER_DOUBLE"}


@dataclasses.dataclass(frozen=True)
class VertexPush:
    """Optional push of the blessed model to the Vertex AI Model Registry, served on ``endpoint``: a version
    of the pipeline's registry model per blessed model, deployed alone (``components.vertex_pusher``)."""

    endpoint: str
    serving_image: str
    machine_type: str = "n1-standard-4"

    def component(self, settings: CloudSettings, pipeline: str, labels: dict[str, str]):
        """A builder of the Vertex push step from (model channel, blessing channel)."""
        from components import vertex_pusher

        target = vertex_pusher.PushTarget(
            project=settings.project,
            region=settings.region,
            pipeline=pipeline,
            endpoint=self.endpoint,
            serving_image=self.serving_image,
            machine_type=self.machine_type,
            labels=dict(labels),
        )
        config = {vertex_pusher.CONFIG_KEY: target.to_config()}

        def build(model, blessing):
            return vertex_pusher.VertexPusher(
                model=model, model_blessing=blessing, custom_config=config
            ).with_id("VertexPusher")

        return build

    def check(self, region: str) -> str | None:
        """The serving image against the pinned SDK's prebuilt images and the export: a warning or None.

        Raises:
          ValueError: a prebuilt image that the SDK does not list, or too old (``check_serving_image``).
        """
        from components import vertex_pusher

        return vertex_pusher.check_serving_image(self.serving_image, region)


@dataclasses.dataclass(frozen=True)
class Tuning:
    """The Tuner step of a compiled pipeline: its search settings (``trainer_module.tfx_trainer.TUNING_KEY``;
    the trials' directory under the pipeline root), its parallel trials, and the epochs it trains in all."""

    settings: dict
    parallel_trials: int
    epochs: int


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What ``plan_pipeline`` resolved: the pipeline run (``pipeline.presets.PipelineRun``: the trainer
    config with its target and epochs, the sharding step) and the tuning step (``Tuning``, or None without
    tuning)."""

    resolved: PipelineRun
    tuning: Tuning | None = None

    @property
    def name(self) -> str:
        return self.resolved.preset.pipeline_name

    @property
    def defaults(self) -> dict:
        """The runtime parameters' default values, read from the run."""
        sharding = self.resolved.sharding
        return {
            **{key: getattr(sharding, key) or "" for key in INPUT_KEYS},
            "train_shards": sharding.train_shards,
            "val_shards": sharding.val_shards,
            "train_epochs": self.resolved.trainer_config.loop.train_epochs,
            "target_top1": self.resolved.target_top1,
        }


def plan_pipeline(
    preset: PipelinePreset,
    settings: CloudSettings,
    inputs: Mapping[str, str],
    changes: Mapping[str, object],
    params: Mapping[str, object],
    tune: Mapping[str, object] | None = None,
    parallel_trials: int = 1,
) -> Compiled:
    """Resolves and checks everything a compilation needs, before anything is written.

    The run is resolved as the local runner resolves it (``PipelinePreset.resolve``): the preset's trainer
    config bound to the accelerator (its strategy and replicas per host, which the config must fit), the
    person's typed ``changes`` by dotted key (``--set``), ``params`` (typed runtime parameter values: the
    target, the epochs, the inputs and the shard layout; an input given here replaces one of ``inputs``). The
    runtime parameters' defaults are read from that run (``Compiled.defaults``). ``tune`` (the search's
    settings: ``search``, ``max_epochs``, ``max_trials``) adds a Tuner step of ``parallel_trials`` machines,
    its search checked against the config.

    Raises:
      AcceleratorMismatch / ValueError / TypeError: one line naming the problem.
    """
    from trainer_module.resolve import UNSET

    if "train_epochs" in params:
        changes = {**changes, "loop.train_epochs": params["train_epochs"]}
    resolved = preset.resolve(
        changes,
        target_top1=params.get("target_top1", UNSET),
        inputs={key: params.get(key, inputs.get(key, "")) for key in INPUT_KEYS},
        machine=settings.machine,
        layout={key: params[key] for key in parameters.LAYOUT_PARAMETERS if key in params},
    )
    return Compiled(
        resolved, _tuning(preset.pipeline_name, resolved.trainer_config, settings, tune, parallel_trials)
    )


def _tuning(
    name: str, config, settings: CloudSettings, tune: Mapping | None, parallel_trials: int
) -> Tuning | None:
    """The Tuner step of ``tune``, its search checked against the config; None without ``tune``.

    The search's name and what Vertex needs of the machines are checked first: KerasTuner, which checks the
    rest, loads TensorFlow (seconds before a misspelt name would be refused)."""
    if tune is None:
        return None
    from trainer_module.choices import SEARCHES

    SEARCHES.check(tune["search"])
    settings.check_tuning(parallel_trials)
    from trainer_module import tuning

    tune = dict(tune)
    tune["max_epochs"] = tune["max_epochs"] or max(1, config.loop.train_epochs // 10)
    search = tuning.search_of_config(config, ("<shards>",), ("<shards>",), **tune)
    root = settings.pipeline_root.rstrip("/")
    directory = f"{root}/tuning/{name}"
    return Tuning({**tune, "directory": directory}, parallel_trials, search.planned_trials_and_epochs()[1])


def compile_pipeline(
    compiled: Compiled, settings: CloudSettings, output: str, vertex_push: VertexPush | None = None
) -> str:
    """Writes the planned run as a Vertex PipelineJob (``output`` ending in ``.json``) or a Kubeflow
    PipelineSpec (``.yaml``): builds the pipeline, compiles it with TFX, patches the spec and writes it.

    PipelineSpec schema 2.1.0 (what the Kubeflow Pipelines API server accepts, and Vertex too): every input
    parameter typed (``parameterType``), constants as plain values. Both have an exit handler
    (``components.run_cleanup``), which runs after the pipeline's steps, whatever their state, and cancels the
    jobs the run left running, found by the run's label (``components.run_label``). Returns ``output``.
    """
    import yaml

    from pipeline import spec_patches
    from trainer_module import files

    is_job = output.endswith(".json")
    pipeline = build_pipeline(compiled, settings, vertex_push, for_kubeflow=not is_job)
    job = _tfx_compile(pipeline, settings, compiled.defaults, for_kubeflow=not is_job)
    spec_patches.patch(
        job,
        name=compiled.name,
        defaults=compiled.defaults,
        pipeline_root=settings.pipeline_root.rstrip("/"),
        labels=settings.labels(compiled.name, compiled.resolved.preset.name),
        enable_cache=settings.enable_cache,
    )
    if is_job:
        files.write_text(output, json.dumps(job, sort_keys=True))
    else:
        files.write_text(output, yaml.safe_dump(job["pipelineSpec"], sort_keys=True))
    return output


def build_pipeline(
    compiled: Compiled,
    settings: CloudSettings,
    vertex_push: VertexPush | None = None,
    for_kubeflow: bool = False,
):
    """The cloud pipeline: Dataflow sharding, training on the accelerator in Vertex, TFMA gate, Pusher(s).

    Each Beam step gets its own Dataflow workers; the pushed models of each pipeline (one per preset) go to a
    serving directory of its own, ``ROOT/serving_model/PIPELINE``. ``for_kubeflow`` leaves out the
    latest-blessed-model lookup (a TFX resolver node, which the open-source Kubeflow Pipelines backend does
    not run): the Evaluator then gates on the target top-1 alone; and it tells the steps to find their run's
    id in their output URIs, as Kubeflow fills no placeholder in arguments (``components.run_label``).
    """
    from tfx.orchestration import data_types

    from components import run_label
    from effnet_common import cloud_retry
    from pipeline import pipeline_def

    defaults = compiled.defaults
    runtime = {
        name: data_types.RuntimeParameter(name=name, ptype=kind, default=defaults[name])
        for name, kind in RUNTIME_PARAMETERS.items()
    }
    root = settings.pipeline_root.rstrip("/")
    name = compiled.name
    labels = settings.labels(name, compiled.resolved.preset.name)
    # Every task's arguments say where its run's id is, for the run's label on its jobs: filled in by Vertex,
    # or in the output URIs on Kubeflow.
    run_args = (run_label.kfp_run_arg(name) if for_kubeflow else run_label.RUN_ARG,)
    if (
        settings.api_outage_hours != cloud_retry.OUTAGE_HOURS
    ):  # the default compiles as before: same cache keys
        run_args += (cloud_retry.outage_arg(settings.api_outage_hours),)
    return pipeline_def.create_pipeline(
        pipeline_def.PipelineSettings(
            name=name,
            root=root,
            sharding=compiled.resolved.sharding,
            trainer_config=compiled.resolved.trainer_config,
            serving_model_dir=f"{root}/serving_model/{name}",
            metadata_connection_config=None,  # Vertex / Kubeflow bring their own metadata store
            beam_pipeline_args=(*settings.dataflow_args(labels), *run_args),
            step_beam_args={
                pipeline_def.SHARDING_STEP: settings.sharding_workers.args(),
                pipeline_def.EVALUATOR_STEP: settings.evaluator_workers.args(),
            },
            enable_cache=settings.enable_cache,
            runtime=runtime,
            trainer=_trainer_step(compiled, settings, name, labels),
            tuning=_tuning_step(compiled, settings, name, labels),
            extra_pusher=vertex_push.component(settings, name, labels) if vertex_push else None,
            compare_with_latest_blessed=not for_kubeflow,
        )
    )


def _trainer_step(compiled: Compiled, settings: CloudSettings, name: str, labels: dict):
    """The Trainer: a Vertex AI custom job on the accelerator, or a TPU VM slice (``components.tpu_vm``)."""
    from components import runtime_gate, tpu_vm_trainer
    from pipeline import pipeline_def

    if settings.machine.slice_type is not None:
        return pipeline_def.TrainerStep(tpu_vm_trainer.TpuVmTrainer, settings.tpu_vm_config(name, labels))
    config = settings.vertex_training_config(compiled.resolved.trainer_config, name, labels)
    return pipeline_def.TrainerStep(runtime_gate.VertexTrainer, config)


def _tuning_step(compiled: Compiled, settings: CloudSettings, name: str, labels: dict):
    """The Tuner step on Vertex: TFX's Vertex Tuner, trials in parallel on the accelerator (None: no
    tuning)."""
    tuning = compiled.tuning
    if tuning is None:
        return None
    from components import vertex_tuner
    from pipeline import pipeline_def

    config = settings.vertex_tuning_config(
        compiled.resolved.trainer_config, name, labels, tuning.parallel_trials, tuning.epochs
    )
    return pipeline_def.TuningStep(tuning.settings, vertex_tuner.VertexTuner, config, tuning.parallel_trials)


def _tfx_compile(pipeline, settings: CloudSettings, defaults: dict, for_kubeflow: bool) -> dict:
    """The PipelineJob TFX's ``KubeflowV2DagRunner`` compiles (schema 2.1.0, nothing written), with the
    runtime parameters' ``defaults`` in its ``runtimeConfig``, and the run's clean-up as its exit handler
    (``components.run_cleanup``), which reaches Dataflow as the pipeline's steps do, with their Beam options.
    On Vertex it finds its run's id among them too; ``for_kubeflow``, in its parameter: Kubeflow fills the
    run-id placeholder in input parameters only."""
    from tfx import v1 as tfx

    from components import run_cleanup, run_label

    runner = tfx.orchestration.experimental.KubeflowV2DagRunner(
        config=tfx.orchestration.experimental.KubeflowV2DagRunnerConfig(
            default_image=settings.image, use_pipeline_spec_2_1=True
        )
    )
    run_id = run_label.RUN_ID_PLACEHOLDER if for_kubeflow else None
    tpu_zone = settings.tpu_zone if settings.machine.slice_type is not None else ""
    cleanup = run_cleanup.RunCleanup(settings.project, settings.region, run_id, tpu_zone).with_id(
        run_cleanup.STEP_ID
    )
    runner.set_exit_handler(cleanup.with_beam_pipeline_args(pipeline.beam_pipeline_args))
    return runner.run(pipeline, parameter_values=defaults, write_out=False)
