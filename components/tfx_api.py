"""The TFX names the pipeline uses, imported from the modules that define them instead of through
``tfx.v1``.

``tfx.v1`` is TFX's public index of these same objects, but importing any part of it imports all of it, and
its ``extensions`` package loads the Vertex AI SDK (google-cloud-aiplatform): seconds of CPU in every process
that builds or runs a pipeline, the local demo's and the Trainer's included (docs/performance.md), for names
that only some cloud steps use (the compiler, the Vertex Trainer and tuner steps), which import ``tfx.v1``
themselves.

Each name here is the very object ``tfx.v1`` exports under the same dotted path, so code reads as it would
with ``from tfx import v1 as tfx`` (``from components import tfx_api as tfx``); ``tests/test_tfx_api.py``
checks every one against ``tfx.v1`` and that the local pipeline's modules load no Vertex AI SDK.
"""

from __future__ import annotations

from types import SimpleNamespace

from tfx.components.evaluator.component import Evaluator
from tfx.components.pusher.component import Pusher
from tfx.components.trainer.component import Trainer
from tfx.components.tuner.component import Tuner
from tfx.dsl.components.base.base_beam_component import BaseBeamComponent
from tfx.dsl.components.common.resolver import Resolver
from tfx.dsl.input_resolution.strategies.latest_blessed_model_strategy import LatestBlessedModelStrategy
from tfx.orchestration.local.local_dag_runner import LocalDagRunner
from tfx.orchestration.metadata import sqlite_metadata_connection_config
from tfx.orchestration.pipeline import Pipeline
from tfx.proto.pusher_pb2 import PushDestination
from tfx.proto.trainer_pb2 import EvalArgs, TrainArgs
from tfx.proto.tuner_pb2 import TuneArgs
from tfx.types import standard_artifacts as _standard_artifacts
from tfx.types.channel import Channel

components = SimpleNamespace(Evaluator=Evaluator, Pusher=Pusher, Trainer=Trainer, Tuner=Tuner)
dsl = SimpleNamespace(
    Channel=Channel,
    Pipeline=Pipeline,
    Resolver=Resolver,
    experimental=SimpleNamespace(LatestBlessedModelStrategy=LatestBlessedModelStrategy),
)
orchestration = SimpleNamespace(
    LocalDagRunner=LocalDagRunner,
    metadata=SimpleNamespace(sqlite_metadata_connection_config=sqlite_metadata_connection_config),
)
proto = SimpleNamespace(
    EvalArgs=EvalArgs, PushDestination=PushDestination, TrainArgs=TrainArgs, TuneArgs=TuneArgs
)
types = SimpleNamespace(
    BaseBeamComponent=BaseBeamComponent,
    standard_artifacts=SimpleNamespace(
        Examples=_standard_artifacts.Examples,
        Model=_standard_artifacts.Model,
        ModelBlessing=_standard_artifacts.ModelBlessing,
    ),
)
