"""Per-image preprocessing of the input pipeline: crop windows, decoding, bicubic resize, flip, augmentation.

A window is int32 [offset_y, offset_x, height, width], the argument of ``tf.image.decode_and_crop_jpeg``.
Training takes an Inception-style random crop (docs/recipe.md, "The data and the input pipeline"), evaluation
the centre crop of today's reference or the paper era's (``data.eval_crop_padding``).
"""

from __future__ import annotations

import tensorflow as tf

from trainer_module.config import AugmentConfig, eval_crop_padding
from trainer_module.data import augment

# Training crop (Inception-style, as in tensorflow/tpu efficientnet): sampled box constraints.
CROP_AREA_RANGE = (0.08, 1.0)
CROP_ASPECT_RATIO_RANGE = (3.0 / 4.0, 4.0 / 3.0)
CROP_MIN_OBJECT_COVERED = 0.1
CROP_MAX_ATTEMPTS = 10

# The whole image as the one "object" box: sampled crops must cover 10% of it.
# A Python value, not a tf.constant: creating a tensor at import would initialise TensorFlow's runtime before
# MultiWorkerMirroredStrategy can configure collective ops.
_WHOLE_IMAGE_BOX = [[[0.0, 0.0, 1.0, 1.0]]]


def center_crop_window(image_shape: tf.Tensor, image_size: int, crop_padding: int | None = None) -> tf.Tensor:
    """The evaluation crop: a centred square of side S / (S + pad) * min(height, width), rounded down.

    Args:
      image_shape: int32 [height, width, ...] of the encoded image (``tf.image.extract_jpeg_shape``).
      image_size: the model resolution S.
      crop_padding: pad above; None takes ``eval_crop_padding(S)``.

    Returns:
      int32 [offset_y, offset_x, side, side]; odd margins put the extra pixel before the crop.
    """
    height, width = image_shape[0], image_shape[1]
    # Integer arithmetic: floor(S * min / (S + pad)) exactly, where float32 can land one pixel short.
    pad = eval_crop_padding(image_size) if crop_padding is None else crop_padding
    side = (image_size * tf.minimum(height, width)) // (image_size + pad)
    side = tf.maximum(side, 1)
    return tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side, side])


def train_crop_window(
    image_shape: tf.Tensor, image_size: int, seed: tf.Tensor, min_area: float = CROP_AREA_RANGE[0]
) -> tf.Tensor:
    """A random training crop: area 8%-100%, aspect 3/4-4/3, or the evaluation crop when sampling fails.

    ``sample_distorted_bounding_box`` returns the whole image after ``max_attempts`` failed tries. The
    reference (tensorflow/tpu efficientnet ``_decode_and_random_crop``) treats a crop whose shape equals the
    image's as that failure and takes the centre crop instead; this does the same, comparing height and width
    only, so a grayscale JPEG (1 channel in its header, decoded to 3) is judged like any other.

    Args:
      image_shape: int32 [height, width, channels] of the encoded image.
      image_size: the model resolution S (sizes the fallback crop).
      seed: int32/int64 [2], the stateless seed of the sampler.

    Returns:
      int32 [offset_y, offset_x, height, width].
    """
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        image_shape,
        bounding_boxes=_WHOLE_IMAGE_BOX,
        seed=seed,
        min_object_covered=CROP_MIN_OBJECT_COVERED,
        aspect_ratio_range=CROP_ASPECT_RATIO_RANGE,
        area_range=(min_area, CROP_AREA_RANGE[1]),
        max_attempts=CROP_MAX_ATTEMPTS,
        use_image_if_no_bounding_boxes=True,
    )
    sampled = tf.stack([begin[0], begin[1], size[0], size[1]])
    sampling_failed = tf.reduce_all(tf.equal(size[:2], image_shape[:2]))
    return tf.where(sampling_failed, center_crop_window(image_shape, image_size), sampled)


def decode_crop(image_bytes: tf.Tensor, window: tf.Tensor, fused: bool = True) -> tf.Tensor:
    """Decodes the ``window`` of a JPEG to uint8 [height, width, 3] (grayscale JPEGs become 3 channels).

    Args:
      fused: decode only the window (``decode_and_crop_jpeg``, skipping the rows outside it); False decodes
        the whole image and then slices, the baseline the benchmark compares against.
    """
    if fused:
        return tf.image.decode_and_crop_jpeg(image_bytes, window, channels=3)
    image = tf.io.decode_jpeg(image_bytes, channels=3)
    return tf.image.crop_to_bounding_box(image, window[0], window[1], window[2], window[3])


def resize(image: tf.Tensor, image_size: int, clip: bool = True) -> tf.Tensor:
    """Bicubic resize to float32 [S, S, 3], clipped to [0, 255] (bicubic overshoots at sharp edges) unless
    ``clip`` is off (the reference's resize, ``data.clip_resized=false``)."""
    resized = tf.image.resize(image, [image_size, image_size], method=tf.image.ResizeMethod.BICUBIC)
    if clip:
        resized = tf.clip_by_value(resized, 0.0, 255.0)
    return tf.ensure_shape(resized, [image_size, image_size, 3])


def preprocess_for_train(
    image_bytes: tf.Tensor,
    image_size: int,
    seeds: tf.Tensor,
    fused: bool = True,
    min_crop_area: float = CROP_AREA_RANGE[0],
    random_flip: bool = True,
    augmentation: AugmentConfig | None = None,
    clip: bool = True,
) -> tf.Tensor:
    """Random crop, bicubic resize, random left-right flip, then the augmentation policy, of one JPEG;
    float32 [S, S, 3] in [0, 255]. The order is the reference's: the augmentation sees the flipped crop.

    Args:
      seeds: int64 [3, 2]: row 0 seeds the crop sampler, row 1 the flip, row 2 the augmentation policy
        (stateless ops, so a seeded pipeline is reproducible whatever the parallelism of the map); [2, 2]
        when there is no policy.
      fused: see ``decode_crop``.
      min_crop_area: smallest crop as a fraction of the image (0.08 in the recipe; small images of whole
        objects, like the demo's digits, need gentler crops).
      random_flip: flip left-right with probability 1/2 (not for data whose classes are not mirror-invariant).
      augmentation: the ``augment`` section (policy 'autoaugment', 'randaugment' or 'none'); None is 'none'.
      clip: see ``resize``.
    """
    window = train_crop_window(tf.image.extract_jpeg_shape(image_bytes), image_size, seeds[0], min_crop_area)
    image = resize(decode_crop(image_bytes, window, fused), image_size, clip)
    if random_flip:
        image = tf.image.stateless_random_flip_left_right(image, seed=seeds[1])
    if augmentation is None or augmentation.policy == "none":
        return image
    return augment.distort(
        image, seeds[2], augmentation.policy, augmentation.num_layers, augmentation.magnitude
    )


def preprocess_for_eval(
    image_bytes: tf.Tensor, image_size: int, crop_padding: int | None = None, clip: bool = True
) -> tf.Tensor:
    """Centre crop (see ``center_crop_window``) and bicubic resize of one JPEG; float32 [S, S, 3] in [0, 255]
    (``clip``: see ``resize``)."""
    window = center_crop_window(tf.image.extract_jpeg_shape(image_bytes), image_size, crop_padding)
    return resize(decode_crop(image_bytes, window), image_size, clip)
