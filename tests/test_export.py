"""The TFX Trainer run_fn and the exported SavedModel, loaded and called in a fresh process."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tfx.components.trainer.fn_args_utils import FnArgs

from beam_preprocess.config import ShardingConfig
from beam_preprocess.run import run as shard
from trainer_module import presets, tfx_trainer
from trainer_module.config import with_overrides

PREDICT = """
import json, sys
import numpy as np
import tensorflow as tf
model = tf.saved_model.load(sys.argv[1])
records = [r.numpy() for r in tf.data.TFRecordDataset(sys.argv[2]).take(6)]
jpegs = [tf.train.Example.FromString(r).features.feature["image/encoded"].bytes_list.value[0] for r in records]
by_example = model.signatures["serving_default"](examples=tf.constant(records))
by_jpeg = model.signatures["serve_jpeg"](images=tf.constant(jpegs))
print(json.dumps({
    "signatures": sorted(model.signatures.keys()),
    "examples": by_example["probabilities"].numpy().tolist(),
    "jpeg": by_jpeg["probabilities"].numpy().tolist(),
    "classes": by_example["classes"].numpy().tolist(),
}))
"""


@pytest.fixture(scope="module")
def trained(clean_archives, tmp_path_factory):
    root = tmp_path_factory.mktemp("run_fn")
    shard(
        ShardingConfig(
            output_dir=str(root / "examples"),
            train_archive=clean_archives.train_archive,
            val_archive=clean_archives.val_archive,
            train_shards=2,
            val_shards=1,
            split_dir_template="Split-{split}",
        )
    )
    config = with_overrides(presets.get_preset("smoke"), ["loop.train_epochs=2"])
    fn_args = FnArgs(
        train_files=[str(root / "examples" / "Split-train" / "*")],
        eval_files=[str(root / "examples" / "Split-validation" / "*")],
        serving_model_dir=str(root / "serving_model"),
        model_run_dir=str(root / "model_run"),
        custom_config={tfx_trainer.CONFIG_KEY: config.to_json()},
    )
    tfx_trainer.run_fn(fn_args)
    return root, fn_args


def test_run_fn_trains_on_the_artifact_and_writes_metrics(trained, clean_archives):
    root, fn_args = trained
    with open(root / "model_run" / "metrics.json") as f:
        metrics = json.load(f)
    assert metrics["eval_examples"] == len(clean_archives.validation)
    with open(root / "model_run" / "config.json") as f:
        saved = json.load(f)
    # The epoch is the real training data (300 examples at batch 8 -> 37.5 steps), not the preset's 16.
    assert saved["config"]["data"]["num_train_examples"] == len(clean_archives.train)
    assert metrics["steps"] == int(2 * len(clean_archives.train) / 8)  # 37.5 steps per epoch: 75
    assert tf.io.gfile.glob(str(root / "model_run" / "tensorboard" / "events.out.tfevents.*"))


def test_export_predicts_in_a_fresh_process_with_both_signatures(trained):
    root, fn_args = trained
    shard_path = tf.io.gfile.glob(fn_args.eval_files[0])[0]
    result = subprocess.run(
        [sys.executable, "-c", PREDICT, fn_args.serving_model_dir, shard_path],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["signatures"] == ["serve_jpeg", "serving_default"]
    by_example, by_jpeg = np.array(out["examples"]), np.array(out["jpeg"])
    assert by_example.shape == (6, 1000)
    np.testing.assert_allclose(by_example.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(by_example, by_jpeg, atol=1e-6)
    assert out["classes"] == by_example.argmax(axis=1).tolist()
