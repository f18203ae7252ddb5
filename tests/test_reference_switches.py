"""The exact-reproduction switches, each against the reference's own formula: batch-norm groups of the LARS
runs on small slices, the L2 term over biases, and the unclipped bicubic resize; on in the paper presets."""

import io

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from trainer_module import presets, train
from trainer_module.config import GROUP_SIZE_RULES, with_overrides
from trainer_module.data import input_pipeline
from trainer_module.models.efficientnet import efficientnet


def _reference_lars_group(replicas: int, per_replica_batch: int) -> int:
    """The reference LARS runs: one group over every core of a slice of up to 8, else ~128 examples a group."""
    if replicas <= 8:
        return replicas
    return min(max(1, 128 // per_replica_batch), replicas)


@pytest.mark.parametrize("replicas", [1, 2, 4, 8, 16, 32, 128, 1024])
@pytest.mark.parametrize("per_replica_batch", [8, 16, 32, 64, 128, 512])
def test_reference_lars_rule_is_the_reference_formula(replicas, per_replica_batch):
    rule = GROUP_SIZE_RULES.build("reference_lars", replicas, per_replica_batch)
    assert rule == _reference_lars_group(replicas, per_replica_batch)


def test_a_lars_paper_preset_on_one_host_normalises_over_all_its_replicas():
    lars = next(name for name in presets.PRESETS if "lars" in name)
    config = with_overrides(presets.get_preset(lars), ["data.num_cores=8", "data.global_batch_size=4096"])
    assert config.model.bn_group_rule == "reference_lars" and config.plan.bn_group_replicas == 8
    assert with_overrides(config, ["model.bn_group_rule=examples128"]).plan.bn_group_replicas == 1


def _norm_variables(model: keras.Model) -> set[int]:
    """Variables of the model's normalisation layers, found by layer type rather than by name."""
    found = set()
    for layer in model._flatten_layers(include_self=False):
        if "Normalization" in type(layer).__name__ and not isinstance(layer, keras.layers.Rescaling):
            if type(layer).__name__ != "InputNormalization":
                found |= {id(v) for v in layer.trainable_variables}
    return found


@pytest.mark.slow  # builds and traces networks: about 15 s
def test_l2_over_biases_is_the_reference_sum_over_every_variable_but_batch_norms():
    model = efficientnet("tiny", num_classes=10)
    norms = _norm_variables(model)
    assert norms, "the network has batch-norm variables"
    reference = [v for v in model.trainable_variables if id(v) not in norms]
    with_biases = train.l2_variables(model, includes_biases=True)
    without = train.l2_variables(model, includes_biases=False)
    assert {id(v) for v in with_biases} == {id(v) for v in reference}
    biases = [v for v in reference if v.path.endswith("bias")]
    assert biases and {id(v) for v in without} == {id(v) for v in reference} - {id(v) for v in biases}
    for v in biases:
        v.assign(tf.ones_like(v))
    term = tf.add_n([tf.nn.l2_loss(v) for v in with_biases]) - tf.add_n([tf.nn.l2_loss(v) for v in without])
    assert float(term) == pytest.approx(sum(int(np.prod(v.shape)) for v in biases) / 2)


def _stripes_jpeg(size=12) -> bytes:
    pixels = np.zeros((size, size, 3), np.uint8)
    pixels[:, ::4] = pixels[:, 1::4] = 255  # sharp edges: an upsampling bicubic overshoots on both sides
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=100)
    return out.getvalue()


def test_unclipped_resize_is_the_references_bicubic_resize():
    jpeg = _stripes_jpeg()
    image = tf.io.decode_jpeg(jpeg, channels=3)
    reference = tf.image.resize(image, [32, 32], method=tf.image.ResizeMethod.BICUBIC)
    assert float(tf.reduce_max(reference)) > 255.0 and float(tf.reduce_min(reference)) < 0.0
    np.testing.assert_array_equal(input_pipeline.resize(image, 32, clip=False), reference)
    np.testing.assert_array_equal(input_pipeline.resize(image, 32), tf.clip_by_value(reference, 0.0, 255.0))
    # The evaluation path: centre crop of the whole frame (padding 0 keeps it all), then the same resize.
    served = input_pipeline.preprocess_for_eval(tf.constant(jpeg), 32, crop_padding=0, clip=False)
    np.testing.assert_allclose(served, reference, atol=1e-3)


def test_the_paper_presets_switch_every_exact_reproduction_on_and_the_others_do_not():
    for name in presets.PRESETS:
        config = presets.get_preset(name)
        paper = name not in ("demo", "smoke")
        assert config.optimizer.l2_includes_biases is paper, name
        assert config.data.clip_resized is not paper, name
        if paper and config.optimizer.name == "lars":
            assert config.model.bn_group_rule == "reference_lars", name
