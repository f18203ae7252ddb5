"""Reproducible training: one config trained twice gives the same metrics and the same weights, bit for bit;
another seed gives another run (so the comparison can fail)."""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import config as tf_framework_config

from beam_preprocess.config import ShardingConfig
from beam_preprocess.run import run as shard
from effnet_common import schema
from trainer_module import presets, resolve, train
from trainer_module.config import with_overrides
from trainer_module.distribute import strategies
from trainer_module.recorder import read_run_log

# Checkpoint entries that are not training state: wall-clock seconds, the save count, and the object graph,
# which names each variable as Python did (Keras numbers its random streams' variables per process).
NOT_TRAINING_STATE = ("elapsed/", "save_counter/", "_CHECKPOINTABLE_OBJECT_GRAPH")


@pytest.fixture(scope="module")
def digit_shards(clean_archives, tmp_path_factory):
    """300 training / 100 validation digits as 2 + 1 shards."""
    out = tmp_path_factory.mktemp("determinism_shards")
    shard(
        ShardingConfig(
            output_dir=str(out),
            train_archive=clean_archives.train_archive,
            val_archive=clean_archives.val_archive,
            train_shards=2,
            val_shards=1,
        )
    )
    return [str(out / schema.TRAIN / "train-*")], [str(out / schema.VALIDATION / "validation-*")]


def _train(digit_shards, model_dir, seed):
    """The demo preset for 3 short epochs of 9 steps, with stochastic depth on so that every random part of
    the model (initial weights, dropout, stochastic depth) and of the input (order, crops) is exercised."""
    train_files, eval_files = digit_shards
    config = with_overrides(
        presets.get_preset("demo"),
        [
            "data.global_batch_size=32",
            "loop.train_epochs=3",
            "loop.eval_every_epochs=1",
            "loop.target_top1=none",
            "loop.steps_per_loop=3",
            "schedule.warmup_epochs=1",
            "model.drop_connect_rate=0.2",
            f"loop.seed={seed}",
        ],
    )
    assert config.loop.deterministic  # the demo's setting, tested as the demo runs it
    config = resolve.resolve_run(config, data=resolve.data_sizes(train_files, eval_files)).config
    result, _ = train.train_and_evaluate(
        config, train_files, eval_files, train.RunPaths(str(model_dir)), strategies.build_strategy(config)
    )
    return result


def _metrics(result):
    return [{k: h[k] for k in ("step", "top1", "top5", "loss", "examples")} for h in result.history]


def _training_losses(model_dir):
    """The mean training loss of every compiled loop call (3 steps each), from the run's log."""
    return [e["loss"] for e in read_run_log(str(model_dir / "run_log.jsonl")) if e["event"] == "progress"]


def _training_state(model_dir):
    reader = tf.train.load_checkpoint(str(model_dir / train.CHECKPOINT_DIR))
    names = [n for n in reader.get_variable_to_shape_map() if not n.startswith(NOT_TRAINING_STATE)]
    return {name: reader.get_tensor(name) for name in names}


@pytest.mark.slow
def test_same_config_trains_to_identical_metrics_and_weights_and_another_seed_does_not(
    digit_shards, tmp_path
):
    first = _train(digit_shards, tmp_path / "first", seed=0)
    assert not tf_framework_config.is_op_determinism_enabled()  # switched off again after the run
    second = _train(digit_shards, tmp_path / "second", seed=0)
    other_seed = _train(digit_shards, tmp_path / "other_seed", seed=1)

    history = _metrics(first)
    assert [h["step"] for h in history] == [9, 18, 28]  # 300 / 32 = 9.4 steps per epoch
    assert _metrics(second) == history
    assert _metrics(other_seed) != history
    losses = _training_losses(tmp_path / "first")
    assert len(losses) == 10
    assert _training_losses(tmp_path / "second") == losses
    assert _training_losses(tmp_path / "other_seed")[0] != losses[0]  # other initial weights, other batches

    state, again, other = (_training_state(tmp_path / d) for d in ("first", "second", "other_seed"))
    assert any(name.startswith("model/") for name in state)
    assert any(name.startswith("optimizer/") for name in state)
    assert any(name.startswith("random_states/") for name in state)  # dropout and stochastic depth
    assert sorted(again) == sorted(other) == sorted(state)
    for name, value in state.items():
        np.testing.assert_array_equal(again[name], value, err_msg=name)
    differing = [name for name, value in state.items() if not np.array_equal(other[name], value)]
    assert len(differing) > len(state) // 2, differing
