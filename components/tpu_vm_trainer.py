"""The Trainer on a multi-host TPU VM slice: ``TpuVmTrainer``, whose executor runs TFX's Trainer executor on
worker 0 of a slice (``components.tpu_vm``) instead of in its own container.

The executor checks the runtime parameters (``components.runtime_gate``), writes the command a Vertex job's
pool would run (TFX's executor entry point on this execution's inputs, outputs and parameters) where worker 0
reads it (``components.slice_files``), and runs the slice under the settings compiled into ``custom_config``
(``tpu_vm.SliceSettings``) with the run's and the task's labels; worker 0 runs the command in the settings'
trainer image (``components.tpu_worker``).
"""

from __future__ import annotations

import dataclasses
import os
import time

from tfx.dsl.components.base import base_executor, executor_spec
from tfx.types import standard_component_specs
from tfx.utils import json_utils, name_utils

from components import run_label, runtime_gate, trainer_account, vertex_training
from effnet_common import cloud_retry


class TpuVmTrainerExecutor(base_executor.BaseExecutor):
    """Runs ``runtime_gate.TrainerExecutor`` on worker 0 of a TPU VM slice; the slice is deleted when the
    training ends, fails, or this task is stopped, and a retried task re-attaches to its slice."""

    def Do(self, input_dict, output_dict, exec_properties):  # noqa: N802 - TFX's executor interface
        entered = time.time()
        from tfx.types import artifact_utils

        from components import slice_files, tpu_slices, tpu_vm, tpu_worker

        properties = runtime_gate.with_trainer_parameters(exec_properties)  # a bad value fails before a slice
        custom_config = json_utils.loads(properties[standard_component_specs.CUSTOM_CONFIG_KEY])
        settings = tpu_vm.SliceSettings.from_config(custom_config[tpu_vm.CONFIG_KEY])
        run_id, _ = run_label.take_run_id(self._extra_flags or [], output_dict)
        settings = dataclasses.replace(
            settings,
            labels={**settings.labels, **run_label.labels(run_id), vertex_training.TASK_LABEL: "trainer"},
            # a rehearsal's or a test's service on this machine
            api_endpoint=os.environ.get(tpu_vm.ENDPOINT_VARIABLE) or settings.api_endpoint,
        )
        (model_run,) = output_dict["model_run"]
        command = [
            "python", "-m", "tfx.scripts.run_executor",
            "--executor_class_path", name_utils.get_full_name(runtime_gate.TrainerExecutor),
            "--inputs", artifact_utils.jsonify_artifact_dict(input_dict),
            "--outputs", artifact_utils.jsonify_artifact_dict(output_dict),
            "--exec-properties", json_utils.dumps(properties),
        ]  # fmt: skip
        slice_files.write_command(model_run.uri, command, {})
        request = tpu_vm.SliceRequest(
            settings=settings,
            name=tpu_vm.slice_name(vertex_training.outputs_digest(output_dict)),
            status_dir=model_run.uri,
            startup_script=tpu_worker.startup_script(settings.image),
            runtime_version=tpu_slices.POD_RUNTIME,
        )
        tpu_vm.run_slice(request, patience=cloud_retry.take_patience(self._extra_flags or [])[0])
        trainer_account.after_slice(model_run.uri, entered, settings, input_dict, properties)


class TpuVmTrainer(runtime_gate.Trainer):
    """The same Trainer run on a multi-host TPU VM slice (``custom_config`` carries the slice's settings)."""

    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(TpuVmTrainerExecutor)
