"""EfficientNet B0-B7 and two small variants as data: B0's stage table, a scaling table, one block function.

Layer names follow keras.applications ('stem_conv', 'block2b_se_reduce', 'top_bn', 'predictions', ...); the
model takes 0..255 pixels and returns float32 logits (no softmax: the loss and the export add it).
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import keras

from trainer_module.models.blocks import (
    FLOAT32,
    BlockSpec,
    InputNormalization,
    LayerFactory,
    NormFactory,
    conv_policy,
    default_norm_factory,
    dense_kernel_initializer,
    mbconv_block,
)
from trainer_module.models.variants import variant_spec

FILTER_DIVISOR = 8
STEM_FILTERS = 32
HEAD_FILTERS = 1280


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """One stage of B0 (before scaling): `repeats` MBConv blocks with the same kernel and expansion.

    The first block of a stage applies the stride and maps `filters_in` to `filters_out`; the repeats map
    `filters_out` to itself with stride 1.
    """

    repeats: int
    kernel_size: int
    strides: int
    expand_ratio: int
    filters_in: int
    filters_out: int
    se_ratio: float = 0.25


B0_STAGES = (
    StageSpec(repeats=1, kernel_size=3, strides=1, expand_ratio=1, filters_in=32, filters_out=16),
    StageSpec(repeats=2, kernel_size=3, strides=2, expand_ratio=6, filters_in=16, filters_out=24),
    StageSpec(repeats=2, kernel_size=5, strides=2, expand_ratio=6, filters_in=24, filters_out=40),
    StageSpec(repeats=3, kernel_size=3, strides=2, expand_ratio=6, filters_in=40, filters_out=80),
    StageSpec(repeats=3, kernel_size=5, strides=1, expand_ratio=6, filters_in=80, filters_out=112),
    StageSpec(repeats=4, kernel_size=5, strides=2, expand_ratio=6, filters_in=112, filters_out=192),
    StageSpec(repeats=1, kernel_size=3, strides=1, expand_ratio=6, filters_in=192, filters_out=320),
)


def round_filters(filters: int, width: float, divisor: int = FILTER_DIVISOR) -> int:
    """`filters * width` rounded to the nearest multiple of `divisor`, never more than 10% below it."""
    scaled = filters * width
    rounded = max(divisor, int(scaled + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * scaled:
        rounded += divisor
    return int(rounded)


def round_repeats(repeats: int, depth: float) -> int:
    """`repeats * depth` rounded up."""
    return int(math.ceil(depth * repeats))


def block_specs(variant: str, drop_connect_rate: float = 0.2) -> tuple[BlockSpec, ...]:
    """Every MBConv block of `variant`, in order, with keras' names and a drop-connect rate ramped linearly
    from 0 at the first block to `drop_connect_rate * (n - 1) / n` at the last of n blocks."""
    spec = variant_spec(variant)
    stages = [
        dataclasses.replace(
            stage,
            repeats=round_repeats(stage.repeats, spec.depth),
            filters_in=round_filters(stage.filters_in, spec.width),
            filters_out=round_filters(stage.filters_out, spec.width),
        )
        for stage in B0_STAGES[: spec.stages]
    ]
    total = sum(stage.repeats for stage in stages)
    blocks = []
    for stage_index, stage in enumerate(stages):
        for repeat in range(stage.repeats):
            first = repeat == 0
            blocks.append(
                BlockSpec(
                    name=f"block{stage_index + 1}{chr(ord('a') + repeat)}_",
                    kernel_size=stage.kernel_size,
                    strides=stage.strides if first else 1,
                    expand_ratio=stage.expand_ratio,
                    filters_in=stage.filters_in if first else stage.filters_out,
                    filters_out=stage.filters_out,
                    se_ratio=stage.se_ratio,
                    drop_rate=drop_connect_rate * len(blocks) / total,
                )
            )
    return tuple(blocks)


def efficientnet(
    variant: str,
    num_classes: int = 1000,
    *,
    input_size: int | None = None,
    dropout_rate: float | None = None,
    drop_connect_rate: float = 0.2,
    bn_momentum: float = 0.99,
    bn_epsilon: float = 1e-3,
    norm_layer: NormFactory | None = None,
    precision: str = "float32",
    include_input_normalization: bool = True,
) -> keras.Model:
    """Builds EfficientNet `variant` as a functional keras.Model returning float32 logits.

    Input: float images of 0..255 pixel values, shape [batch, input_size, input_size, 3].
    Output: logits [batch, num_classes] in float32 (no softmax).

    Args:
        variant: 'b0'..'b7', 'tiny' (width 0.25, depth 0.5, 32 px: the CPU demo and the tests of learning) or
            'micro' (tiny's width, B0's first two stages: the tests of plumbing).
        num_classes: width of the dense head.
        input_size: side of the square input in pixels; default the variant's native resolution.
        dropout_rate: dropout before the dense head; default the variant's (0.2 for B0 up to 0.5 for B7).
        drop_connect_rate: stochastic-depth rate, ramped linearly with the block index from 0 (first block).
        bn_momentum: momentum of the moving statistics of the default BatchNormalization (unused when
            `norm_layer` is given: the factory then chooses).
        bn_epsilon: epsilon of the default BatchNormalization (likewise unused with `norm_layer`).
        norm_layer: `callable(name: str) -> keras.layers.Layer` building each normalisation layer (for
            example a grouped synchronised batch norm); it must give the layer the requested name. Default:
            `keras.layers.BatchNormalization(momentum=bn_momentum, epsilon=bn_epsilon, name=name)`. The
            layers it returns are made to compute in float32.
        precision: 'float32', or 'bfloat16' to compute every Conv2D and DepthwiseConv2D in bfloat16 (Keras
            policy 'mixed_bfloat16': variables stay float32); every other layer computes in float32.
        include_input_normalization: standardise the pixels inside the model with the ImageNet mean and
            standard deviation (an `InputNormalization` layer named 'input_normalization' holding 7
            non-trainable values, as keras.applications does). If False, inputs must come standardised.

    Returns:
        The uncompiled model, named 'efficientnet_<variant>'.

    Raises:
        ValueError: unknown variant or precision, or an option out of range.
    """
    spec = variant_spec(variant)
    policy = conv_policy(precision)
    input_size = spec.resolution if input_size is None else input_size
    dropout_rate = spec.dropout if dropout_rate is None else dropout_rate
    for option, value in (("num_classes", num_classes), ("input_size", input_size)):
        if not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{option} must be a positive integer, got {value!r}")
    for option, rate in (("dropout_rate", dropout_rate), ("drop_connect_rate", drop_connect_rate)):
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"{option} must be in [0, 1), got {rate!r}")
    layers = LayerFactory(
        conv_policy=policy,
        norm_layer=norm_layer or default_norm_factory(bn_momentum, bn_epsilon),
    )

    images = keras.Input(shape=(int(input_size), int(input_size), 3), dtype=FLOAT32, name="images")
    x = images
    if include_input_normalization:
        x = InputNormalization(name="input_normalization", dtype=FLOAT32)(x)

    x = layers.conv(round_filters(STEM_FILTERS, spec.width), 3, strides=2, name="stem_conv")(x)
    x = layers.norm("stem_bn")(x)
    x = layers.activation("swish", "stem_activation")(x)

    for block in block_specs(variant, drop_connect_rate):
        x = mbconv_block(x, block, layers)

    x = layers.conv(round_filters(HEAD_FILTERS, spec.width), 1, name="top_conv")(x)
    x = layers.norm("top_bn")(x)
    x = layers.activation("swish", "top_activation")(x)
    x = keras.layers.GlobalAveragePooling2D(name="avg_pool", dtype=FLOAT32)(x)
    if dropout_rate > 0:
        x = keras.layers.Dropout(dropout_rate, name="top_dropout", dtype=FLOAT32)(x)
    # Logits stay float32: softmax cross-entropy in bfloat16 has made EfficientNet runs collapse.
    logits = keras.layers.Dense(
        int(num_classes), kernel_initializer=dense_kernel_initializer(), name="predictions", dtype=FLOAT32
    )(x)
    return keras.Model(images, logits, name=f"efficientnet_{variant}")


def multiply_adds(variant: str, input_size: int | None = None, num_classes: int = 1000) -> int:
    """Multiply-adds of one forward pass of one image (what EfficientNet's papers count as FLOPs: 0.39 B for
    B0 at 224 px, 9.9 B for B5 at 456), from the block table: convolutions, squeeze-and-excitation and the
    dense head; batch norm, activations and pooling, a few percent more, are not counted.
    """
    spec = variant_spec(variant)
    size = math.ceil((spec.resolution if input_size is None else input_size) / 2)  # the stride-2 stem
    channels = round_filters(STEM_FILTERS, spec.width)
    total = size * size * 3 * channels * 3 * 3
    for block in block_specs(variant):
        expanded = block.filters_in * block.expand_ratio
        if block.expand_ratio != 1:
            total += size * size * block.filters_in * expanded
        size = math.ceil(size / block.strides)
        total += size * size * expanded * block.kernel_size**2
        if 0 < block.se_ratio <= 1:
            total += 2 * expanded * max(1, int(block.filters_in * block.se_ratio))
        total += size * size * expanded * block.filters_out
        channels = block.filters_out
    head = round_filters(HEAD_FILTERS, spec.width)
    return total + size * size * channels * head + head * num_classes
