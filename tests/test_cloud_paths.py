"""The trainer on a filesystem that is not the local disk: TensorFlow's in-memory ``ram://``, which fails every
call that bypasses ``tf.io.gfile`` (as ``gs://`` does on Vertex). Shards, manifest and model directory all live
there: train, resume, export, and nothing local appears."""

import os
import re
import uuid

import numpy as np
import pytest
import tensorflow as tf

from trainer_module import export, presets, report, run, train
from trainer_module.__main__ import main
from trainer_module.config import with_overrides
from trainer_module.recorder import read_run_log
from trainer_module.resolve import ResolvedRun


def _copy_tree(source: str, target: str) -> None:
    for directory, _, names in tf.io.gfile.walk(source):
        relative = os.path.relpath(directory, source)
        destination = target if relative == "." else f"{target}/{relative}"
        tf.io.gfile.makedirs(destination)
        for name in names:
            tf.io.gfile.copy(os.path.join(directory, name), f"{destination}/{name}", overwrite=True)


@pytest.fixture(scope="module")
def ram_shards(digit_shards):
    """The shared digit shards (tests/conftest.py) copied with their manifest to ram://."""
    remote = f"ram://shards-{uuid.uuid4().hex}"
    _copy_tree(digit_shards["uri"], remote)
    return {
        "train": digit_shards["train"].replace(digit_shards["uri"], remote, 1),
        "eval": digit_shards["eval"].replace(digit_shards["uri"], remote, 1),
    }


@pytest.mark.slow
def test_train_resume_and_export_with_everything_on_ram(ram_shards, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a local 'ram:' folder would appear here
    model_dir = f"ram://model-{uuid.uuid4().hex}"
    paths = train.RunPaths(model_dir)
    config = with_overrides(presets.get_preset("smoke"), ["loop.train_epochs=1", "data.global_batch_size=16"])

    first = run.run(ResolvedRun(config), [ram_shards["train"]], [ram_shards["eval"]], paths)
    # The epoch size came from the manifest on ram://: 400 / 16 = 25 steps.
    assert first.steps == 25 and first.eval_examples == 100
    for name in ("metrics.json", "config.json", "run_log.jsonl", "checkpoints/history.json"):
        assert tf.io.gfile.exists(f"{model_dir}/{name}"), name
    assert tf.io.gfile.exists(f"{model_dir}/export/saved_model.pb")
    assert tf.io.gfile.glob(f"{model_dir}/tensorboard/events.out.tfevents.*")

    # A second run of the same model directory with a larger budget resumes from the checkpoint on ram://.
    longer = with_overrides(config, ["loop.train_epochs=2"])
    second = run.run(ResolvedRun(longer), [ram_shards["train"]], [ram_shards["eval"]], paths)
    assert [h["step"] for h in second.history] == [25, 50]
    starts = [e for e in read_run_log(f"{model_dir}/run_log.jsonl") if e["event"] == "start"]
    assert [(s["resumed"], s["step"]) for s in starts] == [(False, 0), (True, 25)]

    served = tf.saved_model.load(f"{model_dir}/export")
    record = next(iter(tf.data.TFRecordDataset(tf.io.gfile.glob(ram_shards["eval"])[0])))
    probabilities = served.signatures[export.EXAMPLES_SIGNATURE](examples=tf.constant([record.numpy()]))[
        "probabilities"
    ]
    np.testing.assert_allclose(probabilities.numpy().sum(), 1.0, rtol=1e-5)
    # The run report was drawn from the run's own data, beside metrics.json on ram://; and it can be redrawn.
    page = tf.io.gfile.GFile(f"{model_dir}/report.html").read()
    assert f"{second.peak_top1:.4f} at epoch" in page and "smoke" in page
    linked = re.findall(r'<img src="([^"]+)"', page)  # images/s only when the run has enough points for it
    assert {report.PLOTS[key] for key in ("accuracy", "schedule", "loss")} <= set(linked)
    for name in linked:
        png = tf.io.gfile.GFile(f"{model_dir}/{name}", "rb").read()
        assert tf.io.decode_png(png).shape[0] > 100, name
    tf.io.gfile.remove(f"{model_dir}/report.html")
    assert main(["report", model_dir]) == 0
    assert tf.io.gfile.exists(f"{model_dir}/report.html")
    assert os.listdir(tmp_path) == []
