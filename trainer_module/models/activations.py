"""Swish (x * sigmoid(x)) whose gradient is one compiled loop instead of six passes over the tensor.

TensorFlow's own swish (``tf.nn.silu``) recomputes the sigmoid in its gradient and then takes five more
element-wise ops (1 - s, x * (1 - s), 1 + ..., s * ..., upstream * ...), each a full pass over an activation
as large as the block's expanded feature map. On a CPU those passes, not arithmetic, were about a fifth of a
B0 training step's op time. Here the forward pass stays ``tf.nn.silu`` (which oneDNN's graph rewrite fuses into
one kernel) and the gradient, the same formula, is compiled by XLA into a single fused loop: the same values
within float rounding, about 2x less wall time for an activation's forward and backward on this machine
(``benchmarks/profile_step.py`` shows where a step's time goes).

The function is registered with Keras, so a model saved with it loads again; a model saved with the string
'swish' still loads (as Keras' own swish).
"""

from __future__ import annotations

import keras
import tensorflow as tf


@tf.function(jit_compile=True)
def _swish_gradient(features: tf.Tensor, upstream: tf.Tensor) -> tf.Tensor:
    """d/dx [x * sigmoid(x)] * upstream = upstream * s * (1 + x * (1 - s)), with s = sigmoid(x)."""
    sigmoid = tf.sigmoid(features)
    return upstream * sigmoid * (1.0 + features * (1.0 - sigmoid))


@tf.custom_gradient
def _swish(features: tf.Tensor):
    def gradient(upstream: tf.Tensor) -> tf.Tensor:
        return _swish_gradient(features, upstream)

    return tf.nn.silu(features), gradient


@keras.saving.register_keras_serializable(package="trainer_module")
def swish(features):
    """x * sigmoid(x), the activation of every EfficientNet block, with a fused gradient."""
    return _swish(tf.convert_to_tensor(features))
