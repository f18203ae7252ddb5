"""``components.tfx_api``: TFX's names without ``tfx.v1``, so the local pipeline loads no Vertex AI SDK."""

import functools
import subprocess
import sys
from types import SimpleNamespace

import pytest

from components import tfx_api

NAMESPACES = ("components", "dsl", "orchestration", "proto", "types")


def _leaves(namespace: SimpleNamespace, prefix: str):
    for name, value in vars(namespace).items():
        if isinstance(value, SimpleNamespace):
            yield from _leaves(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def test_every_name_is_the_object_tfx_v1_exports_under_the_same_path():
    from tfx import v1

    leaves = [leaf for space in NAMESPACES for leaf in _leaves(getattr(tfx_api, space), f"{space}.")]
    assert len(leaves) == 18
    for path, value in leaves:
        assert functools.reduce(getattr, path.split("."), v1) is value, path


@pytest.mark.slow  # a fresh interpreter importing TensorFlow, Beam and TFX
def test_the_local_pipeline_and_its_executors_load_no_vertex_sdk():
    # What `python -m pipeline.local_runner` imports to build and run the pipeline, and the executors the
    # LocalDagRunner then loads: none of them may pull in tfx.v1 (whose extensions load the Vertex AI SDK).
    code = """
import sys
from pipeline import local_runner, local_steps, outcome, pipeline_def, runs_page
from trainer_module import tfx_trainer
from components import imagenet_shards, latest_blessed, runtime_gate
from tfx.components.pusher import executor
print(sorted(m for m in ("tfx.v1", "google.cloud.aiplatform", "google.cloud.bigquery_storage") if m in sys.modules))
"""
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
