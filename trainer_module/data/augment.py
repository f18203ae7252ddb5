"""AutoAugment (policy v0) and RandAugment for training images, as stateless TensorFlow ops for tf.data.

The two policies of the tensorflow/tpu EfficientNet recipe (``models/official/efficientnet/autoaugment.py``,
applied after the random crop, resize and flip), with its sixteen operations, level-to-argument mappings and
policy logic. Where the reference's code differs from the PIL operation it names (Solarize at level 10,
Posterize at levels 0-2, Contrast's grey), the reference is reproduced, since the published results were
trained with it; each quirk is marked where it happens. Translations and cutout sizes are in pixels whatever
the image size, as in the reference.

Every draw is a stateless op keyed by the ``seed`` argument, so the same image and seed give the same output
inside a parallel ``Dataset.map`` too, and a resumed seeded run sees the same augmented stream (the
reference's stateful draws cannot). Why not a library's: docs/training.md, "data/augment.py". Entry point:
``distort(image, seed, policy, num_layers, magnitude)`` on the resize's float32 [S, S, 3]; ``POLICIES`` is
the registry of ``augment.policy`` names.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import tensorflow as tf

from trainer_module.choices import AUGMENT_POLICIES

MAX_LEVEL = 10.0
REPLACE_VALUE = 128  # grey fill of pixels left empty by affine operations and Cutout

# PIL's SMOOTH filter, the degenerate image of Sharpness.
_SMOOTH_KERNEL = ((1.0, 1.0, 1.0), (1.0, 5.0, 1.0), (1.0, 1.0, 1.0))
_SMOOTH_SCALE = 13.0


# --------------------------------------------------------------------------------------------------
# Operations: uint8 [H, W, 3] in, uint8 [H, W, 3] out.


def _blend(degenerate: tf.Tensor, image: tf.Tensor, factor) -> tf.Tensor:
    """PIL's ``Image.blend(degenerate, image, factor)``: 0 gives ``degenerate``, 1 ``image``, above 1
    extrapolates; computed in float32, clipped to [0, 255] and truncated to uint8."""
    start = tf.cast(degenerate, tf.float32)
    blended = start + factor * (tf.cast(image, tf.float32) - start)
    return tf.cast(tf.clip_by_value(blended, 0.0, 255.0), tf.uint8)


def _project(image: tf.Tensor, matrix: list) -> tf.Tensor:
    """Projective transform with nearest-neighbour sampling; pixels mapped from outside get REPLACE_VALUE.

    ``matrix`` is [a0, a1, a2, b0, b1, b2, c0, c1]: output pixel (x, y) takes the input pixel at
    ((a0 x + a1 y + a2) / k, (b0 x + b1 y + b2) / k), k = c0 x + c1 y + 1, rounded to the nearest pixel.
    """
    transform = tf.reshape(tf.stack([tf.cast(v, tf.float32) for v in matrix]), [1, 8])
    out = tf.raw_ops.ImageProjectiveTransformV3(
        images=image[tf.newaxis],
        transforms=transform,
        output_shape=tf.shape(image)[:2],
        fill_value=float(REPLACE_VALUE),
        interpolation="NEAREST",
        fill_mode="CONSTANT",
    )
    return out[0]


def auto_contrast(image: tf.Tensor) -> tf.Tensor:
    """PIL ``ImageOps.autocontrast``: each channel stretched linearly so its minimum becomes 0 and its
    maximum 255 (truncated); a constant channel is left as it is."""
    pixels = tf.cast(image, tf.float32)
    low = tf.reduce_min(pixels, axis=[0, 1])
    high = tf.reduce_max(pixels, axis=[0, 1])
    scale = tf.math.divide_no_nan(255.0, high - low)
    stretched = tf.cast(tf.clip_by_value(pixels * scale - low * scale, 0.0, 255.0), tf.uint8)
    return tf.where(high > low, stretched, image)


def equalize(image: tf.Tensor) -> tf.Tensor:
    """PIL ``ImageOps.equalize``, channel by channel.

    With n pixels and c of them at the channel's highest value, step = (n - c) // 255; value v maps to
    (pixels below v + step // 2) // step, clipped to 255. A step of 0 (nearly constant channel) leaves the
    channel unchanged.
    """
    channels = tf.transpose(tf.reshape(tf.cast(image, tf.int32), [-1, 3]))  # [3, n]
    histogram = tf.math.bincount(channels, minlength=256, maxlength=256, axis=-1)  # [3, 256]
    top_count = tf.gather(histogram, tf.reduce_max(channels, axis=1), batch_dims=1)
    step = (tf.shape(channels)[1] - top_count) // 255  # [3]
    below = tf.cumsum(histogram, axis=1, exclusive=True)
    safe_step = tf.maximum(step, 1)[:, tf.newaxis]
    lut = tf.minimum((below + safe_step // 2) // safe_step, 255)
    equalized = tf.gather(lut, channels, batch_dims=1)
    channels = tf.where((step > 0)[:, tf.newaxis], equalized, channels)
    return tf.reshape(tf.cast(tf.transpose(channels), tf.uint8), tf.shape(image))


def invert(image: tf.Tensor) -> tf.Tensor:
    """PIL ``ImageOps.invert``: 255 - v."""
    return 255 - image


def rotate(image: tf.Tensor, degrees) -> tf.Tensor:
    """Rotation by ``degrees`` about the image centre, counter-clockwise as displayed for positive angles."""
    radians = tf.cast(degrees, tf.float32) * (math.pi / 180.0)
    cos, sin = tf.cos(radians), tf.sin(radians)
    size = tf.cast(tf.shape(image)[:2], tf.float32)
    centre_y, centre_x = (size[0] - 1.0) / 2.0, (size[1] - 1.0) / 2.0
    # Output pixel p samples the input at R (p - centre) + centre, R = [[cos, -sin], [sin, cos]].
    offset_x = centre_x - cos * centre_x + sin * centre_y
    offset_y = centre_y - sin * centre_x - cos * centre_y
    return _project(image, [cos, -sin, offset_x, sin, cos, offset_y, 0.0, 0.0])


def posterize(image: tf.Tensor, bits) -> tf.Tensor:
    """PIL ``ImageOps.posterize``: keeps the ``bits`` high bits of every value.

    Reference quirk: bits = 0 keeps one bit (the reference's shift by 8 is clamped to 7 by TensorFlow), where
    PIL would return black; bits above 8 keep the image.
    """
    shift = tf.cast(tf.clip_by_value(8 - tf.cast(bits, tf.int32), 0, 7), tf.uint8)
    return tf.bitwise.left_shift(tf.bitwise.right_shift(image, shift), shift)


def solarize(image: tf.Tensor, threshold) -> tf.Tensor:
    """PIL ``ImageOps.solarize``: values at or above ``threshold`` are inverted.

    Reference quirk: the threshold is taken modulo 256, as the reference's comparison with a uint8 does, so
    256 (level 10) inverts every pixel where PIL would change none.
    """
    threshold = tf.math.floormod(tf.cast(threshold, tf.int32), 256)
    return tf.where(tf.cast(image, tf.int32) < threshold, image, 255 - image)


def solarize_add(image: tf.Tensor, addition, threshold=128) -> tf.Tensor:
    """Adds ``addition`` (clipped to [0, 255]) to the values below ``threshold``; the others are kept."""
    values = tf.cast(image, tf.int32)
    added = tf.cast(tf.clip_by_value(values + tf.cast(addition, tf.int32), 0, 255), tf.uint8)
    return tf.where(values < tf.cast(threshold, tf.int32), added, image)


def color(image: tf.Tensor, factor) -> tf.Tensor:
    """PIL ``ImageEnhance.Color``: blend from the grey version of the image (``tf.image.rgb_to_grayscale``,
    as the reference; PIL's own grey levels can differ by 1)."""
    grey = tf.image.grayscale_to_rgb(tf.image.rgb_to_grayscale(image))
    return _blend(grey, image, factor)


def _reference_contrast_grey(image: tf.Tensor) -> tf.Tensor:
    """The reference's Contrast target: pixel count / 256, clipped to 255, truncated (its histogram-based
    "mean" sums the counts without weighting them by grey level): 196 at 224 x 224, 255 from 255 x 256 pixels
    on. PIL uses the mean grey level instead."""
    count = tf.cast(tf.shape(image)[0] * tf.shape(image)[1], tf.float32)
    return tf.cast(tf.minimum(count / 256.0, 255.0), tf.uint8)


def contrast(image: tf.Tensor, factor) -> tf.Tensor:
    """PIL ``ImageEnhance.Contrast``'s blend from a uniform grey, with the reference's grey (see
    ``_reference_contrast_grey``)."""
    return _blend(tf.fill(tf.shape(image), _reference_contrast_grey(image)), image, factor)


def brightness(image: tf.Tensor, factor) -> tf.Tensor:
    """PIL ``ImageEnhance.Brightness``: blend from black."""
    return _blend(tf.zeros_like(image), image, factor)


def sharpness(image: tf.Tensor, factor) -> tf.Tensor:
    """PIL ``ImageEnhance.Sharpness``: blend from the image smoothed by PIL's SMOOTH 3 x 3 filter (truncated
    to uint8, as the reference; PIL rounds), whose one-pixel border keeps the original pixels."""
    kernel = tf.constant(_SMOOTH_KERNEL, tf.float32) / _SMOOTH_SCALE
    kernel = tf.tile(kernel[:, :, tf.newaxis, tf.newaxis], [1, 1, 3, 1])
    smooth = tf.nn.depthwise_conv2d(tf.cast(image, tf.float32)[tf.newaxis], kernel, [1, 1, 1, 1], "SAME")[0]
    smooth = tf.cast(tf.clip_by_value(smooth, 0.0, 255.0), tf.uint8)
    height, width = tf.shape(image)[0], tf.shape(image)[1]
    rows, cols = tf.range(height)[:, tf.newaxis], tf.range(width)[tf.newaxis, :]
    interior = (rows > 0) & (rows < height - 1) & (cols > 0) & (cols < width - 1)
    degenerate = tf.where(interior[:, :, tf.newaxis], smooth, image)
    return _blend(degenerate, image, factor)


def shear_x(image: tf.Tensor, shear) -> tf.Tensor:
    """Horizontal shear about the top-left corner: output (x, y) takes input (x + shear * y, y)."""
    return _project(image, [1.0, shear, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])


def shear_y(image: tf.Tensor, shear) -> tf.Tensor:
    """Vertical shear about the top-left corner: output (x, y) takes input (x, y + shear * x)."""
    return _project(image, [1.0, 0.0, 0.0, shear, 1.0, 0.0, 0.0, 0.0])


def translate_x(image: tf.Tensor, pixels) -> tf.Tensor:
    """Output (x, y) takes input (x + pixels, y): the content moves left by ``pixels``."""
    return _project(image, [1.0, 0.0, pixels, 0.0, 1.0, 0.0, 0.0, 0.0])


def translate_y(image: tf.Tensor, pixels) -> tf.Tensor:
    """Output (x, y) takes input (x, y + pixels): the content moves up by ``pixels``."""
    return _project(image, [1.0, 0.0, 0.0, 0.0, 1.0, pixels, 0.0, 0.0])


def cutout(image: tf.Tensor, pad_size, seed: tf.Tensor) -> tf.Tensor:
    """Cutout (https://arxiv.org/abs/1708.04552): the square of half-side ``pad_size`` around a centre drawn
    uniformly over the image (rows [cy - pad, cy + pad), cropped to the image) becomes REPLACE_VALUE."""
    height, width = tf.shape(image)[0], tf.shape(image)[1]
    row_seed, col_seed = _split(seed)
    centre_row = tf.random.stateless_uniform([], row_seed, minval=0, maxval=height, dtype=tf.int32)
    centre_col = tf.random.stateless_uniform([], col_seed, minval=0, maxval=width, dtype=tf.int32)
    pad = tf.cast(pad_size, tf.int32)
    rows, cols = tf.range(height)[:, tf.newaxis], tf.range(width)[tf.newaxis, :]
    inside = (rows >= centre_row - pad) & (rows < centre_row + pad)
    inside &= (cols >= centre_col - pad) & (cols < centre_col + pad)
    return tf.where(inside[:, :, tf.newaxis], tf.constant(REPLACE_VALUE, tf.uint8), image)


# --------------------------------------------------------------------------------------------------
# Levels: a level in [0, MAX_LEVEL] becomes an operation's argument (before its random sign).


@dataclasses.dataclass(frozen=True)
class Constants:
    """Per-policy scales of the size-dependent arguments.

    Attributes:
      translate: translation in pixels at level 10.
      cutout: cutout half-side in pixels at level 10.
    """

    translate: float
    cutout: float


AUTOAUGMENT_CONSTANTS = Constants(translate=250.0, cutout=100.0)
RANDAUGMENT_CONSTANTS = Constants(translate=100.0, cutout=40.0)


def _fraction(level: float) -> float:
    return level / MAX_LEVEL


@dataclasses.dataclass(frozen=True)
class Op:
    """One augmentation operation.

    Attributes:
      function: the operation, ``function(image, *args)`` on uint8 [H, W, 3].
      argument: level, constants -> the operation's argument; None for operations without one.
      signed: the argument is negated with probability 1/2.
      seeded: the operation takes a stateless seed after its argument (Cutout's position).
    """

    function: Callable[..., tf.Tensor]
    argument: Callable[[float, Constants], float] | None = None
    signed: bool = False
    seeded: bool = False


def _enhance_factor(level: float, _: Constants) -> float:
    return _fraction(level) * 1.8 + 0.1  # [0.1, 1.9]


def _shear(level: float, _: Constants) -> float:
    return _fraction(level) * 0.3


def _translate(level: float, constants: Constants) -> float:
    return _fraction(level) * constants.translate


OPS: dict[str, Op] = {
    "AutoContrast": Op(auto_contrast),
    "Equalize": Op(equalize),
    "Invert": Op(invert),
    "Rotate": Op(rotate, lambda level, _: _fraction(level) * 30.0, signed=True),
    "Posterize": Op(posterize, lambda level, _: int(_fraction(level) * 4)),
    "Solarize": Op(solarize, lambda level, _: int(_fraction(level) * 256)),
    "SolarizeAdd": Op(solarize_add, lambda level, _: int(_fraction(level) * 110)),
    "Color": Op(color, _enhance_factor),
    "Contrast": Op(contrast, _enhance_factor),
    "Brightness": Op(brightness, _enhance_factor),
    "Sharpness": Op(sharpness, _enhance_factor),
    "ShearX": Op(shear_x, _shear, signed=True),
    "ShearY": Op(shear_y, _shear, signed=True),
    "TranslateX": Op(translate_x, _translate, signed=True),
    "TranslateY": Op(translate_y, _translate, signed=True),
    "Cutout": Op(cutout, lambda level, constants: int(_fraction(level) * constants.cutout), seeded=True),
}


def op_arguments(name: str, level: float, seed: tf.Tensor, constants: Constants) -> tuple:
    """The arguments after the image with which ``apply_op`` calls operation ``name`` at ``level``."""
    op = OPS[name]
    sign_seed, op_seed = _split(seed)
    args: list = []
    if op.argument is not None:
        argument = op.argument(level, constants)
        if op.signed:
            argument = tf.where(_uniform(sign_seed) < 0.5, -1.0, 1.0) * argument
        args.append(argument)
    if op.seeded:
        args.append(op_seed)
    return tuple(args)


def apply_op(name: str, image: tf.Tensor, level: float, seed: tf.Tensor, constants: Constants) -> tf.Tensor:
    """Operation ``name`` at ``level`` on uint8 ``image`` (random sign and position drawn from ``seed``)."""
    return OPS[name].function(image, *op_arguments(name, level, seed, constants))


# --------------------------------------------------------------------------------------------------
# Policies.

# AutoAugment policy v0 (the paper's ImageNet policy as the reference lists it): 25 sub-policies of two
# (operation, probability, level) steps applied in order.
POLICY_V0: tuple[tuple[tuple[str, float, int], ...], ...] = (
    (("Equalize", 0.8, 1), ("ShearY", 0.8, 4)),
    (("Color", 0.4, 9), ("Equalize", 0.6, 3)),
    (("Color", 0.4, 1), ("Rotate", 0.6, 8)),
    (("Solarize", 0.8, 3), ("Equalize", 0.4, 7)),
    (("Solarize", 0.4, 2), ("Solarize", 0.6, 2)),
    (("Color", 0.2, 0), ("Equalize", 0.8, 8)),
    (("Equalize", 0.4, 8), ("SolarizeAdd", 0.8, 3)),
    (("ShearX", 0.2, 9), ("Rotate", 0.6, 8)),
    (("Color", 0.6, 1), ("Equalize", 1.0, 2)),
    (("Invert", 0.4, 9), ("Rotate", 0.6, 0)),
    (("Equalize", 1.0, 9), ("ShearY", 0.6, 3)),
    (("Color", 0.4, 7), ("Equalize", 0.6, 0)),
    (("Posterize", 0.4, 6), ("AutoContrast", 0.4, 7)),
    (("Solarize", 0.6, 8), ("Color", 0.6, 9)),
    (("Solarize", 0.2, 4), ("Rotate", 0.8, 9)),
    (("Rotate", 1.0, 7), ("TranslateY", 0.8, 9)),
    (("ShearX", 0.0, 0), ("Solarize", 0.8, 4)),
    (("ShearY", 0.8, 0), ("Color", 0.6, 4)),
    (("Color", 1.0, 0), ("Rotate", 0.6, 2)),
    (("Equalize", 0.8, 4), ("Equalize", 0.0, 8)),
    (("Equalize", 1.0, 4), ("AutoContrast", 0.6, 2)),
    (("ShearY", 0.4, 7), ("SolarizeAdd", 0.6, 7)),
    (("Posterize", 0.8, 2), ("Solarize", 0.6, 10)),
    (("Solarize", 0.6, 8), ("Equalize", 0.6, 1)),
    (("Color", 0.8, 6), ("Rotate", 0.4, 5)),
)

# RandAugment's candidates, in the reference's order (the order decides which index picks which op).
RANDAUGMENT_OPS: tuple[str, ...] = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "Posterize",
    "Solarize",
    "Color",
    "Contrast",
    "Brightness",
    "Sharpness",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Cutout",
    "SolarizeAdd",
)


def _split(seed: tf.Tensor, num: int = 2) -> list[tf.Tensor]:
    """``num`` independent seeds from ``seed``; int32 and int64 seeds of equal values give the same ones."""
    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), num=num)
    return tf.unstack(seeds, num=num)


def _uniform(seed: tf.Tensor) -> tf.Tensor:
    return tf.random.stateless_uniform([], seed)


def _choose(seed: tf.Tensor, count: int) -> tf.Tensor:
    return tf.random.stateless_uniform([], seed, minval=0, maxval=count, dtype=tf.int32)


def autoaugment_draws(seed: tf.Tensor) -> tuple[tf.Tensor, list[tuple[tf.Tensor, tf.Tensor]]]:
    """The random choices of ``autoaugment``: the sub-policy index (uniform over the 25), and for each of its
    steps whether it is applied (with the step's probability) and the seed of its operation."""
    choice_seed, *step_seeds = _split(seed, 1 + len(POLICY_V0[0]))
    sub_policy = _choose(choice_seed, len(POLICY_V0))
    draws = []
    for position, step_seed in enumerate(step_seeds):
        draw_seed, op_seed = _split(step_seed)
        probability = tf.gather([steps[position][1] for steps in POLICY_V0], sub_policy)
        draws.append((_uniform(draw_seed) < probability, op_seed))
    return sub_policy, draws


def autoaugment(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """AutoAugment policy v0 (https://arxiv.org/abs/1805.09501) on uint8 [H, W, 3]: one sub-policy picked
    uniformly, then its steps applied in order, each with its own probability (independent draws), as the
    reference.

    Each step is one switch over the distinct (operation, level) pairs found at that position of the 25
    sub-policies, plus a last branch that leaves the image when the step is not applied: the same result as a
    switch over whole sub-policies, with fewer and flatter branches (faster to trace).
    """
    sub_policy, draws = autoaugment_draws(seed)
    for position, (applied, op_seed) in enumerate(draws):
        pairs = [(steps[position][0], steps[position][2]) for steps in POLICY_V0]
        variants = sorted(set(pairs))
        variant = tf.gather([variants.index(pair) for pair in pairs], sub_policy)
        branches = [
            functools.partial(apply_op, name, image, level, op_seed, AUTOAUGMENT_CONSTANTS)
            for name, level in variants
        ]
        branches.append(functools.partial(tf.identity, image))
        image = tf.ensure_shape(
            tf.switch_case(tf.where(applied, variant, len(variants)), branches), image.shape
        )
    return image


def randaugment_draws(seed: tf.Tensor, num_layers: int) -> list[tuple[tf.Tensor, tf.Tensor]]:
    """The random choices of ``randaugment``: per layer, the index in ``RANDAUGMENT_OPS`` of the operation
    (uniform) and the seed of that operation."""
    draws = []
    for layer_seed in _split(seed, num_layers) if num_layers else []:
        choice_seed, op_seed = _split(layer_seed)
        draws.append((_choose(choice_seed, len(RANDAUGMENT_OPS)), op_seed))
    return draws


def randaugment(image: tf.Tensor, seed: tf.Tensor, num_layers: int = 2, magnitude: float = 10.0) -> tf.Tensor:
    """RandAugment (https://arxiv.org/abs/1909.13719) on uint8 [H, W, 3]: ``num_layers`` times, one of
    ``RANDAUGMENT_OPS`` picked uniformly and always applied at level ``magnitude`` (the reference draws a
    probability per operation but never uses it)."""
    if num_layers < 0 or not magnitude >= 0:
        raise ValueError(
            f"randaugment needs num_layers >= 0 and magnitude >= 0, got {num_layers}, {magnitude}"
        )
    for op_index, op_seed in randaugment_draws(seed, num_layers):
        branches = [
            functools.partial(apply_op, name, image, magnitude, op_seed, RANDAUGMENT_CONSTANTS)
            for name in RANDAUGMENT_OPS
        ]
        image = tf.ensure_shape(tf.switch_case(op_index, branches), image.shape)
    return image


# The ``augment.policy`` names: each bound to f(uint8 image, seed, num_layers, magnitude) -> uint8 image.
POLICIES = AUGMENT_POLICIES


@POLICIES.register("none")
def _no_policy(image: tf.Tensor, seed: tf.Tensor, num_layers: int, magnitude: float) -> tf.Tensor:
    return image


@POLICIES.register("autoaugment")
def _autoaugment_policy(image: tf.Tensor, seed: tf.Tensor, num_layers: int, magnitude: float) -> tf.Tensor:
    return autoaugment(image, seed)  # v0 fixes its own operations and levels


POLICIES.register("randaugment")(randaugment)


def distort(
    image: tf.Tensor, seed: tf.Tensor, policy: str, num_layers: int = 2, magnitude: float = 10.0
) -> tf.Tensor:
    """Applies augmentation ``policy`` to one training image.

    As the reference, the image is clipped and cast (truncated) to uint8, augmented, and cast back.

    Args:
      image: float32 [H, W, 3] with values in [0, 255] (the resized crop).
      seed: int32/int64 [2], the stateless seed of every random draw of the policy.
      policy: a ``POLICIES`` name: 'none' (image returned unchanged), 'autoaugment' (v0) or 'randaugment'.
      num_layers, magnitude: RandAugment's N and M (ignored by the other policies).

    Returns:
      float32 [H, W, 3] with integer values in [0, 255] (``image`` itself for 'none').

    Raises:
      ValueError: ``policy`` is not a ``POLICIES`` name, or RandAugment's N or M is negative.
    """
    POLICIES.check(policy)
    if policy == "none":
        return image
    pixels = tf.cast(tf.clip_by_value(image, 0.0, 255.0), tf.uint8)
    augmented = POLICIES.build(policy, pixels, seed, num_layers, magnitude)
    return tf.ensure_shape(tf.cast(augmented, tf.float32), image.shape)
