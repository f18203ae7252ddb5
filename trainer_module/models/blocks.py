"""EfficientNet's building blocks: the input normaliser, the precision-aware layer factory, the MBConv block.

Every layer is created with an explicit name and an explicit dtype policy, so that two models built in one
process carry identical names (name-based rules such as the LARS exclusion of '*bn*' variables rely on them)
and so that the precision of each layer does not depend on the process-wide Keras dtype policy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import keras
from keras import ops

from trainer_module.choices import PRECISIONS
from trainer_module.models.activations import swish

# Dtype policy of every layer that is not a convolution: normalisation, activations, SE gating, pooling,
# dropout, the residual add and the dense head all compute (and keep their variables) in float32.
FLOAT32 = "float32"

# model.precision -> Keras dtype policy of the Conv2D and DepthwiseConv2D layers. 'mixed_bfloat16' computes
# in bfloat16 while the variables stay float32, as in the paper (bfloat16 convolutions, float32 elsewhere).
PRECISIONS.register("float32")(lambda: "float32")
PRECISIONS.register("bfloat16")(lambda: "mixed_bfloat16")


def conv_policy(precision: str) -> str:
    """The Keras dtype policy of the convolutions at ``precision`` (checked against ``model.precision``)."""
    return PRECISIONS.build(precision)


IMAGENET_MEAN_RGB = (0.485, 0.456, 0.406)
IMAGENET_STDDEV_RGB = (0.229, 0.224, 0.225)
MAX_PIXEL_VALUE = 255.0


# He-normal on fan-out for convolutions and a uniform(+-1/sqrt(fan_out)) dense head: the initialisation of
# the tensorflow/tpu EfficientNet reference. A fresh initializer per layer: a Keras initializer instance
# draws the same values on every call, so sharing one would give same-shaped kernels identical weights.
def conv_kernel_initializer() -> keras.initializers.Initializer:
    return keras.initializers.VarianceScaling(scale=2.0, mode="fan_out", distribution="untruncated_normal")


def dense_kernel_initializer() -> keras.initializers.Initializer:
    return keras.initializers.VarianceScaling(scale=1.0 / 3.0, mode="fan_out", distribution="uniform")


# Activations of ours by name; any other name is Keras' own.
ACTIVATIONS = {"swish": swish}

NormFactory = Callable[[str], keras.layers.Layer]


@keras.saving.register_keras_serializable(package="trainer_module")
class InputNormalization(keras.layers.Layer):
    """Channel-wise `(pixels / max_pixel_value - mean) / sqrt(variance)` of images given as 0..255 values.

    The statistics are held as 7 non-trainable weights (mean and variance per RGB channel, one
    `max_pixel_value`), the same number keras.applications' Rescaling + Normalization input stage holds, so
    parameter counts agree with keras. Unlike keras' application, the division is by the standard deviation
    (the square root of the variance), i.e. the result is exactly `(x - 255 * mean) / (255 * stddev)`.

    Args:
        mean: per-channel mean of images scaled to 0..1.
        stddev: per-channel standard deviation of images scaled to 0..1.
        max_pixel_value: the pixel value that maps to 1.0 before standardisation.
        **kwargs: passed to `keras.layers.Layer` (name, dtype).
    """

    def __init__(
        self,
        mean: Sequence[float] = IMAGENET_MEAN_RGB,
        stddev: Sequence[float] = IMAGENET_STDDEV_RGB,
        max_pixel_value: float = MAX_PIXEL_VALUE,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if len(mean) != len(stddev):
            raise ValueError(f"mean {tuple(mean)} and stddev {tuple(stddev)} must have the same length")
        if min(stddev) <= 0 or max_pixel_value <= 0:
            raise ValueError(f"stddev {tuple(stddev)} and max_pixel_value {max_pixel_value} must be positive")
        # Python copies for get_config(); the weights created in build() are what call() reads.
        self._mean = tuple(float(m) for m in mean)
        self._stddev = tuple(float(s) for s in stddev)
        self._max_pixel_value = float(max_pixel_value)

    def build(self, input_shape):
        channels = input_shape[-1]
        if channels != len(self._mean):
            raise ValueError(
                f"InputNormalization holds statistics for {len(self._mean)} channels, "
                f"got inputs with {channels} channels (shape {input_shape})"
            )
        self.mean = self.add_weight(
            name="mean",
            shape=(channels,),
            initializer=keras.initializers.Constant(self._mean),
            trainable=False,
        )
        self.variance = self.add_weight(
            name="variance",
            shape=(channels,),
            initializer=keras.initializers.Constant([s * s for s in self._stddev]),
            trainable=False,
        )
        self.max_pixel_value = self.add_weight(
            name="max_pixel_value",
            shape=(),
            initializer=keras.initializers.Constant(self._max_pixel_value),
            trainable=False,
        )

    def call(self, inputs):
        # The weights are read on every call (not snapshotted at build time), so restored values take effect.
        return (inputs / self.max_pixel_value - self.mean) / ops.sqrt(self.variance)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            mean=list(self._mean),
            stddev=list(self._stddev),
            max_pixel_value=self._max_pixel_value,
        )
        return config


def default_norm_factory(momentum: float, epsilon: float) -> NormFactory:
    """Returns `name -> keras.layers.BatchNormalization(momentum, epsilon, name=name)` (float32)."""

    def batch_norm(name: str) -> keras.layers.Layer:
        return keras.layers.BatchNormalization(momentum=momentum, epsilon=epsilon, name=name, dtype=FLOAT32)

    return batch_norm


@dataclasses.dataclass(frozen=True)
class LayerFactory:
    """Creates the layers of the network with the chosen convolution precision and normalisation layer.

    Attributes:
        conv_policy: Keras dtype policy name of every Conv2D / DepthwiseConv2D ('float32' or
            'mixed_bfloat16'); all other layers are float32.
        norm_layer: `callable(name) -> keras.layers.Layer` building one normalisation layer.
    """

    conv_policy: str
    norm_layer: NormFactory

    def conv(self, filters: int, kernel_size: int, name: str, strides: int = 1, use_bias: bool = False):
        """A 'same'-padded Conv2D without activation (activations are separate float32 layers)."""
        return keras.layers.Conv2D(
            filters,
            kernel_size,
            strides=strides,
            padding="same",
            use_bias=use_bias,
            kernel_initializer=conv_kernel_initializer(),
            name=name,
            dtype=self.conv_policy,
        )

    def depthwise_conv(self, kernel_size: int, strides: int, name: str):
        """A 'same'-padded DepthwiseConv2D without bias or activation."""
        return keras.layers.DepthwiseConv2D(
            kernel_size,
            strides=strides,
            padding="same",
            use_bias=False,
            depthwise_initializer=conv_kernel_initializer(),
            name=name,
            dtype=self.conv_policy,
        )

    def norm(self, name: str) -> keras.layers.Layer:
        """Calls the injected norm factory, checks its name and makes it compute in float32."""
        layer = self.norm_layer(name)
        if not isinstance(layer, keras.layers.Layer):
            raise ValueError(f"norm_layer({name!r}) must return a keras.layers.Layer, got {type(layer)!r}")
        if layer.name != name:
            # Name-based rules (LARS excludes '*bn*') and weight loading depend on the exact names.
            raise ValueError(
                f"norm_layer({name!r}) returned a layer named {layer.name!r}; it must honour the name"
            )
        if layer.dtype_policy.name != FLOAT32:
            if layer.built:
                raise ValueError(
                    f"norm_layer({name!r}) returned an already built {layer.dtype_policy.name} layer"
                )
            layer.dtype_policy = FLOAT32
        return layer

    def activation(self, function: str, name: str) -> keras.layers.Layer:
        """A float32 Activation layer (swish, sigmoid), kept apart from the convolutions' precision.

        'swish' is ours (``activations.swish``: the same function with a fused gradient)."""
        return keras.layers.Activation(ACTIVATIONS.get(function, function), name=name, dtype=FLOAT32)


@dataclasses.dataclass(frozen=True)
class BlockSpec:
    """One MBConv block after width/depth scaling.

    Attributes:
        name: layer-name prefix in keras' scheme, e.g. 'block2b_'.
        kernel_size: depthwise kernel size.
        strides: depthwise stride (1 or 2).
        expand_ratio: expansion of the input filters by the first 1x1 convolution (1: no expansion conv).
        filters_in: input channels.
        filters_out: output channels.
        se_ratio: squeeze-and-excitation bottleneck as a fraction of `filters_in` (0: no SE).
        drop_rate: drop-connect (stochastic depth) probability of the residual branch.
    """

    name: str
    kernel_size: int
    strides: int
    expand_ratio: int
    filters_in: int
    filters_out: int
    se_ratio: float
    drop_rate: float

    @property
    def has_residual(self) -> bool:
        """Whether the block adds its input back (same shape in and out), with drop-connect on the branch."""
        return self.strides == 1 and self.filters_in == self.filters_out


def mbconv_block(inputs, spec: BlockSpec, layers: LayerFactory):
    """The inverted-residual block: expand -> depthwise -> squeeze-excite -> project -> drop-connect + add.

    Args:
        inputs: symbolic tensor [batch, height, width, spec.filters_in].
        spec: the block's shape, stride and drop-connect rate.
        layers: creates the (precision-aware, named) layers.

    Returns:
        The block's output tensor [batch, height / strides, width / strides, spec.filters_out].
    """
    name = spec.name
    filters = spec.filters_in * spec.expand_ratio

    # Expansion phase: skipped when the ratio is 1 (the first stage of every variant).
    x = inputs
    if spec.expand_ratio != 1:
        x = layers.conv(filters, 1, name=f"{name}expand_conv")(x)
        x = layers.norm(f"{name}expand_bn")(x)
        x = layers.activation("swish", f"{name}expand_activation")(x)

    # Depthwise phase.
    x = layers.depthwise_conv(spec.kernel_size, spec.strides, name=f"{name}dwconv")(x)
    x = layers.norm(f"{name}bn")(x)
    x = layers.activation("swish", f"{name}activation")(x)

    # Squeeze and excitation: the bottleneck is sized from the block's input filters, not the expanded ones.
    if 0 < spec.se_ratio <= 1:
        filters_se = max(1, int(spec.filters_in * spec.se_ratio))
        se = keras.layers.GlobalAveragePooling2D(keepdims=True, name=f"{name}se_squeeze", dtype=FLOAT32)(x)
        se = layers.conv(filters_se, 1, name=f"{name}se_reduce", use_bias=True)(se)
        se = layers.activation("swish", f"{name}se_activation")(se)
        se = layers.conv(filters, 1, name=f"{name}se_expand", use_bias=True)(se)
        se = layers.activation("sigmoid", f"{name}se_gate")(se)
        x = keras.layers.Multiply(name=f"{name}se_excite", dtype=FLOAT32)([x, se])

    # Output phase: linear projection, then stochastic depth (whole samples dropped) on the residual branch.
    x = layers.conv(spec.filters_out, 1, name=f"{name}project_conv")(x)
    x = layers.norm(f"{name}project_bn")(x)
    if spec.has_residual:
        if spec.drop_rate > 0:
            x = keras.layers.Dropout(
                spec.drop_rate, noise_shape=(None, 1, 1, 1), name=f"{name}drop", dtype=FLOAT32
            )(x)
        x = keras.layers.Add(name=f"{name}add", dtype=FLOAT32)([x, inputs])
    return x
