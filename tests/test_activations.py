"""Swish with a fused gradient: TensorFlow's swish in value and gradient, and a model that uses it saves and loads."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer_module.models import activations
from trainer_module.models.activations import swish
from trainer_module.models.efficientnet import efficientnet


def _value_and_gradient(function, features, upstream):
    with tf.GradientTape() as tape:
        tape.watch(features)
        values = function(features)
    return values, tape.gradient(values, features, output_gradients=upstream)


@pytest.mark.parametrize("shape", [(4, 7, 7, 16), (2, 3, 5), (1000,)])
def test_swish_matches_tensorflows_in_value_and_gradient(shape):
    rng = np.random.default_rng(0)
    # Wide inputs: the sigmoid's saturated ends (|x| > 20) are where a careless formula loses precision.
    features = tf.constant(rng.normal(0.0, 8.0, shape), tf.float32)
    upstream = tf.constant(rng.normal(0.0, 1.0, shape), tf.float32)
    ours = _value_and_gradient(swish, features, upstream)
    theirs = _value_and_gradient(tf.nn.silu, features, upstream)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-5, atol=1e-6)
    assert float(tf.reduce_max(tf.abs(theirs[1]))) > 1.0  # the comparison saw real gradients


def test_swish_gradient_inside_a_compiled_step_matches():
    """Inside tf.function (how the Trainer's step runs), second call included (the compiled gradient reused)."""
    features = tf.Variable(tf.linspace(-30.0, 30.0, 601))

    @tf.function
    def gradient(function):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(function(features) ** 2)
        return tape.gradient(loss, features)

    for _ in range(2):
        np.testing.assert_allclose(gradient(swish), gradient(tf.nn.silu), rtol=1e-5, atol=1e-6)


def test_where_xla_cannot_compile_for_the_cpu_the_gradient_is_the_same_formula_uncompiled(monkeypatch):
    """TensorFlow's TPU build (the trainer-tpu image) has no XLA backend for the CPU: there the gradient is not
    compiled on its own (tests/test_images_built.py runs it in that image)."""
    assert activations._cpu_compiles()  # this machine's TensorFlow compiles for its CPU
    monkeypatch.setattr(activations, "_cpu_compiles", lambda: False)
    monkeypatch.setattr(activations, "_compiled_swish_gradient", None)  # a call of it would fail
    features = tf.constant(np.random.default_rng(2).normal(0.0, 8.0, (3, 50)), tf.float32)
    upstream = tf.ones_like(features)
    ours = _value_and_gradient(swish, features, upstream)
    theirs = _value_and_gradient(tf.nn.silu, features, upstream)
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-5, atol=1e-6)


def test_a_model_with_it_saves_and_loads_with_the_same_outputs(tmp_path):
    model = efficientnet("tiny", num_classes=10, input_size=32)
    activations = [layer for layer in model.layers if isinstance(layer, keras.layers.Activation)]
    assert any(layer.activation is swish for layer in activations)
    images = np.random.default_rng(1).uniform(0, 255, (2, 32, 32, 3)).astype(np.float32)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert any(
        layer.activation is swish for layer in loaded.layers if isinstance(layer, keras.layers.Activation)
    )
    np.testing.assert_allclose(loaded(images, training=False), model(images, training=False), rtol=1e-5)
