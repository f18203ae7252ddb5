"""Swish (x * sigmoid(x)) whose gradient is one compiled loop instead of six passes over the tensor.

TensorFlow's own swish (``tf.nn.silu``) recomputes the sigmoid in its gradient and then takes five more
element-wise ops (1 - s, x * (1 - s), 1 + ..., s * ..., upstream * ...), each a full pass over an activation
as large as the block's expanded feature map: on a CPU, memory traffic rather than arithmetic. Here the
forward pass stays ``tf.nn.silu`` (which oneDNN's graph rewrite fuses into one kernel) and the gradient, the
same formula, is compiled by XLA into a single fused loop: the same values within float rounding, in less
time (why: docs/training.md, "models/activations.py"; ``benchmarks/profile_step.py`` measures it).

TensorFlow's TPU build (``tensorflow-tpu``, the trainer-tpu image) has no XLA backend for the CPU: there the
gradient is the same formula left to the surrounding graph, which on a TPU XLA compiles and fuses anyway.

The function is registered with Keras, so a model saved with it loads again; a model saved with the string
'swish' still loads (as Keras' own swish).
"""

from __future__ import annotations

import functools

import keras
import tensorflow as tf


def _swish_gradient(features: tf.Tensor, upstream: tf.Tensor) -> tf.Tensor:
    """d/dx [x * sigmoid(x)] * upstream = upstream * s * (1 + x * (1 - s)), with s = sigmoid(x)."""
    sigmoid = tf.sigmoid(features)
    return upstream * sigmoid * (1.0 + features * (1.0 - sigmoid))


_compiled_swish_gradient = tf.function(_swish_gradient, jit_compile=True)


@functools.cache
def _cpu_compiles() -> bool:
    """Whether XLA compiles for this machine's CPU (not in TensorFlow's TPU build); asked once, eagerly."""
    with tf.init_scope(), tf.device("/cpu:0"):
        try:
            tf.function(tf.sigmoid, jit_compile=True)(tf.zeros([1]))
        except tf.errors.OpError:
            return False
    return True


@tf.custom_gradient
def _swish(features: tf.Tensor):
    def gradient(upstream: tf.Tensor) -> tf.Tensor:
        fused = _compiled_swish_gradient if _cpu_compiles() else _swish_gradient
        return fused(features, upstream)

    return tf.nn.silu(features), gradient


@keras.saving.register_keras_serializable(package="trainer_module")
def swish(features):
    """x * sigmoid(x), the activation of every EfficientNet block, with a fused gradient."""
    return _swish(tf.convert_to_tensor(features))
