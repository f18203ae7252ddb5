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
from effnet_common import schema
from trainer_module import export, presets, tfx_trainer
from trainer_module.config import with_overrides

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
# In a fresh process: the export loaded as TensorFlow Serving loads it (tests/tf_serving.py: TensorFlow's C++
# LoadSavedModel), asked in TF Serving's REST form, as a Vertex endpoint forwards a client's request.
SERVE = """
import base64, json, sys
sys.path.insert(0, sys.argv[3])
import tensorflow as tf
import tf_serving
model = tf_serving.SavedModel(sys.argv[1])
records = [r.numpy() for r in tf.data.TFRecordDataset(sys.argv[2]).take(6)]
jpegs = [tf.train.Example.FromString(r).features.feature["image/encoded"].bytes_list.value[0] for r in records]
b64 = lambda data: {"b64": base64.b64encode(data).decode()}
refused = {}
for name, body in {
    "not base64": {"instances": [{"b64": "not base64!"}]},
    "another input name": {"instances": [{"image": b64(jpegs[0])}]},
    "no such signature": {"signature_name": "serve_jpeg", "instances": [b64(jpegs[0])]},
}.items():
    try:
        tf_serving.predict(model, body)
    except tf_serving.RestError as e:
        refused[name] = str(e)
print(json.dumps({
    "signatures": sorted(model.signatures),
    "jpeg": tf_serving.predict(model, {"instances": [b64(j) for j in jpegs]}),
    "named": tf_serving.predict(model, {"instances": [{"image_bytes": b64(j)} for j in jpegs]}),
    "examples": tf_serving.predict(
        model, {"signature_name": "serve_tf_examples", "instances": [b64(r) for r in records]}
    ),
    "refused": refused,
}))
model.close()
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


@pytest.mark.slow  # the module fixture trains through run_fn for 2 epochs
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


def serve(python: str, fn_args) -> dict:
    """The answers of ``SERVE`` run by ``python`` (an interpreter and its TensorFlow) on the export."""
    shard_path = tf.io.gfile.glob(fn_args.eval_files[0])[0]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(
        [python, "-c", SERVE, fn_args.serving_model_dir, shard_path, TESTS_DIR],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def served(trained):
    """The export's answers, loaded as TensorFlow Serving loads it, under this project's TensorFlow."""
    return serve(sys.executable, trained[1])


@pytest.mark.slow
def test_the_export_answers_tf_servings_rest_requests_in_a_fresh_process(served):
    """The request a client sends a Vertex endpoint, ``{"instances": [{"b64": JPEG}]}``, answered by the default
    signature with the class, its synset and the top 5; TFMA's signature on the same images agrees."""
    out = served
    assert out["signatures"] == [export.EXAMPLES_SIGNATURE, export.SERVING_SIGNATURE]
    answers = out["jpeg"]["predictions"]
    assert len(answers) == 6 and out["named"] == out["jpeg"]  # the bare value or the value by input name
    probabilities = np.array([p[export.PROBABILITIES] for p in out["examples"]["predictions"]])
    assert probabilities.shape == (6, 1000)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    synsets = schema.synsets()  # the digits' shards keep ImageNet's numbering: the manifest's 1000 synsets
    for answer, row in zip(answers, probabilities, strict=True):
        top = np.argsort(-row, kind="stable")[: export.TOP_K]
        assert answer[export.TOP_CLASSES] == top.tolist() and answer[export.CLASSES] == top[0]
        np.testing.assert_allclose(answer[export.TOP_PROBABILITIES], row[top], atol=1e-6)
        assert answer[export.TOP_SYNSETS] == [synsets[k] for k in top]
        assert answer[export.SYNSETS] == synsets[top[0]]
    assert "Unable to base64 decode" in out["refused"]["not base64"]
    assert "image_bytes" in out["refused"]["another input name"]
    assert "serve_jpeg" in out["refused"]["no such signature"]


@pytest.mark.slow  # builds, once per machine, an environment of tensorflow-cpu 2.15.1 (tests/serving_env.py)
def test_the_prebuilt_serving_images_tensorflow_loads_the_export_and_answers_alike(trained, served):
    """Vertex's prebuilt ``tf2-cpu.2-15`` image, where the pipeline pushes the model, loads it with TensorFlow
    2.15's C++ loader: the export of TensorFlow 2.16 loads there and answers the same requests with the same
    classes, synsets and probabilities (to float32 rounding). A change to the export that 2.15 cannot load fails
    here, not on the endpoint."""
    import serving_env

    old = serve(serving_env.python("2.15.1"), trained[1])
    assert old["signatures"] == served["signatures"] and old["refused"].keys() == served["refused"].keys()
    for request in ("jpeg", "named", "examples"):
        for then, now in zip(old[request]["predictions"], served[request]["predictions"], strict=True):
            assert then.keys() == now.keys()
            for key in now:
                if isinstance(now[key], str) or (
                    isinstance(now[key], list) and now[key] and isinstance(now[key][0], str)
                ):
                    assert then[key] == now[key], (request, key)
                else:
                    np.testing.assert_allclose(
                        then[key], now[key], rtol=0, atol=1e-6, err_msg=f"{request} {key}"
                    )


def test_class_names_are_the_manifests_synsets_or_imagenets():
    assert export.class_synsets(("n1", "n2"), 2) == ["n1", "n2"]
    assert export.class_synsets(None, 1000) == list(schema.synsets())
    assert export.class_synsets(None, 10) == [str(k) for k in range(10)]  # no manifest, not ImageNet's width
