"""TFX's Vertex Tuner run as one Vertex AI custom job that this step follows to its end.

Apart from ``components.runtime_gate`` because TFX's Vertex Tuner component loads the Vertex AI SDK on import,
which the local pipeline never needs (``components.tfx_api``). The job carries the run's label like every
cloud job of a run (``components.run_label``), so the pipeline's exit handler finds it if the run is stopped.
"""

from __future__ import annotations

from tfx import v1 as tfx
from tfx.dsl.components.base import base_executor, executor_spec
from tfx.types import standard_component_specs
from tfx.utils import json_utils, name_utils

from components import vertex_training
from components.runtime_gate import labelled_with_run, run_timeout
from effnet_common import cloud_retry


class VertexTunerExecutor(base_executor.BaseExecutor):
    """Runs TFX's distributed tuning flock (its chief oracle and workers, each running trials) as a Vertex AI
    custom job to its end, cancelled if this task is stopped or fails (``components.vertex_training``), with
    the timeout of the search on this run's data (``run_timeout``).

    The job's worker pools (the primary, and ``parallel trials - 1`` workers) are compiled into the tuning
    args of ``custom_config``; TFX's Vertex Tuner would build the same job but only poll it.
    """

    def Do(self, input_dict, output_dict, exec_properties):  # noqa: N802 - TFX's executor interface
        from tfx.extensions.google_cloud_ai_platform.tuner import executor as vertex_tuner

        vertex = tfx.extensions.google_cloud_ai_platform
        custom_config = labelled_with_run(
            json_utils.loads(exec_properties[standard_component_specs.CUSTOM_CONFIG_KEY]),
            vertex.experimental.TUNING_ARGS_KEY,
            self._extra_flags,
            output_dict,
        )
        request = vertex_training.job_request(
            input_dict,
            output_dict,
            exec_properties,
            custom_config,
            name_utils.get_full_name(vertex_tuner._WorkerExecutor),  # noqa: SLF001 - TFX's worker entry point
            args_key=vertex.experimental.TUNING_ARGS_KEY,
            task="tuner",
            timeout_seconds=run_timeout(input_dict, exec_properties, custom_config),
        )
        vertex_training.run_job(request, patience=cloud_retry.take_patience(self._extra_flags or [])[0])


class VertexTuner(tfx.extensions.google_cloud_ai_platform.Tuner):
    """TFX's Vertex Tuner (parallel trials on the accelerator's machines), its job cancelled with its task."""

    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(VertexTunerExecutor)
