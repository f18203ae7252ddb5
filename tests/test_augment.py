"""AutoAugment v0 / RandAugment (trainer_module.data.augment): every operation against PIL or a NumPy rendering on
a real photo, the level mappings, the policies' logic, and stateless reproducibility inside tf.data."""

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageEnhance, ImageOps
from sklearn.datasets import load_sample_image

from trainer_module.data import augment

HEIGHT, WIDTH = 48, 40
SIZES = [(32, 32), (48, 40), (17, 61)]
AA, RA = augment.AUTOAUGMENT_CONSTANTS, augment.RANDAUGMENT_CONSTANTS
SIGNED_OPS = ["Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY"]


def _photo(height: int = HEIGHT, width: int = WIDTH) -> np.ndarray:
    """scikit-learn's sample photo of a Chinese temple, resized to uint8 [height, width, 3]."""
    return np.asarray(Image.fromarray(load_sample_image("china.jpg")).resize((width, height), Image.BILINEAR))


PHOTO = _photo()
# Values 60..187: every operation at magnitude 10 visibly changes it (AutoContrast has room to stretch).
NARROW = (PHOTO // 2 + 60).astype(np.uint8)


def _seed(i: int) -> tf.Tensor:
    return tf.constant([i, 1000 + i], tf.int64)


def _ours(function, image: np.ndarray, *args) -> np.ndarray:
    out = function(tf.constant(image), *args)
    assert out.dtype == tf.uint8 and out.shape == image.shape
    return out.numpy()


def _op(name: str):
    """``augment.apply_op`` for operation ``name`` with the image first, for ``_ours``."""
    return lambda image, *args: augment.apply_op(name, image, *args)


def _pil(transform, image: np.ndarray) -> np.ndarray:
    return np.asarray(transform(Image.fromarray(image)))


def _assert_close(ours: np.ndarray, expected: np.ndarray, tolerance: int, min_equal: float) -> None:
    difference = np.abs(ours.astype(int) - expected.astype(int))
    assert difference.max() <= tolerance
    assert np.mean(difference == 0) >= min_equal


def _nearest_transform(image: np.ndarray, matrix) -> np.ndarray:
    """NumPy rendering of a projective map with nearest sampling (ties away from zero) and grey fill."""
    height, width = image.shape[:2]
    a0, a1, a2, b0, b1, b2, _, _ = np.asarray(matrix, np.float32)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    source_x, source_y = a0 * x + a1 * y + a2, b0 * x + b1 * y + b2
    col = (np.sign(source_x) * np.floor(np.abs(source_x) + 0.5)).astype(int)
    row = (np.sign(source_y) * np.floor(np.abs(source_y) + 0.5)).astype(int)
    inside = (row >= 0) & (row < height) & (col >= 0) & (col < width)
    out = np.full_like(image, augment.REPLACE_VALUE)
    out[inside] = image[row[inside], col[inside]]
    return out


# --------------------------------------------------------------------------------------------------
# Tables.


def test_op_table_and_policy_v0():
    names = {
        "AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd", "Color",
        "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateX", "TranslateY", "Cutout",
    }  # fmt: skip
    assert set(augment.OPS) == names
    assert len(augment.RANDAUGMENT_OPS) == 16 and set(augment.RANDAUGMENT_OPS) == names
    assert len(augment.POLICY_V0) == 25
    for sub_policy in augment.POLICY_V0:
        assert len(sub_policy) == 2
        for name, probability, level in sub_policy:
            assert name in augment.OPS
            assert 0.0 <= probability <= 1.0
            assert isinstance(level, int) and 0 <= level <= augment.MAX_LEVEL
    assert augment.POLICIES.names() == ("none", "autoaugment", "randaugment")
    with pytest.raises(ValueError, match="augment.policy='autoaugment_v1' is not one of"):
        augment.POLICIES.check("autoaugment_v1")


@pytest.mark.parametrize(
    "name, level, constants, expected",
    [
        ("Rotate", 10, AA, 30.0),
        ("Rotate", 5, RA, 15.0),
        ("Rotate", 20, RA, 60.0),  # magnitudes above 10 extrapolate
        ("Posterize", 2, AA, 0),
        ("Posterize", 6, AA, 2),
        ("Posterize", 10, RA, 4),
        ("Solarize", 3, AA, 76),
        ("Solarize", 10, RA, 256),
        ("SolarizeAdd", 3, AA, 33),
        ("SolarizeAdd", 10, RA, 110),
        ("Color", 0, AA, 0.1),
        ("Contrast", 10, RA, 1.9),
        ("Brightness", 5, RA, 1.0),
        ("Sharpness", 9, AA, 1.72),
        ("ShearX", 10, RA, 0.3),
        ("ShearY", 4, AA, 0.12),
        ("TranslateX", 9, AA, 225.0),
        ("TranslateY", 10, RA, 100.0),
        ("Cutout", 10, AA, 100),
        ("Cutout", 10, RA, 40),
        ("Cutout", 5, RA, 20),
    ],
)
def test_level_to_argument(name, level, constants, expected):
    argument = augment.OPS[name].argument(level, constants)
    assert argument == pytest.approx(expected)
    assert type(argument) is type(expected)  # ints where the reference truncates


def test_argument_free_ops_and_random_signs():
    for name in ["AutoContrast", "Equalize", "Invert"]:
        assert augment.op_arguments(name, 10, _seed(0), RA) == ()
    for name in SIGNED_OPS:
        magnitude = augment.OPS[name].argument(10, RA)
        values = np.array([float(augment.op_arguments(name, 10, _seed(i), RA)[0]) for i in range(64)])
        assert set(np.round(np.abs(values), 4)) == {round(magnitude, 4)}
        assert 20 <= np.sum(values < 0) <= 44  # about half negated
    for name in ["Posterize", "Solarize", "SolarizeAdd", "Color", "Sharpness"]:
        assert all(float(augment.op_arguments(name, 10, _seed(i), RA)[0]) > 0 for i in range(8))


# --------------------------------------------------------------------------------------------------
# Operations against PIL (ImageOps, ImageEnhance, affine transform) where the reference follows PIL.


def test_invert_and_equalize_match_pil():
    np.testing.assert_array_equal(_ours(augment.invert, PHOTO), _pil(ImageOps.invert, PHOTO))
    np.testing.assert_array_equal(_ours(augment.equalize, PHOTO), _pil(ImageOps.equalize, PHOTO))
    # A constant channel (step 0) and a two-valued one.
    odd = PHOTO.copy()
    odd[..., 1] = 77
    odd[..., 2] = np.where(PHOTO[..., 2] > 100, 200, 10)
    np.testing.assert_array_equal(_ours(augment.equalize, odd), _pil(ImageOps.equalize, odd))


def test_auto_contrast_matches_pil():
    # The reference scales in float32 where PIL uses doubles: values landing on an integer can truncate 1 lower.
    for image in [NARROW, PHOTO]:
        _assert_close(_ours(augment.auto_contrast, image), _pil(ImageOps.autocontrast, image), 1, 0.9)
    flat = np.full((8, 6, 3), 90, np.uint8)
    np.testing.assert_array_equal(_ours(augment.auto_contrast, flat), flat)


@pytest.mark.parametrize("threshold", [0, 1, 77, 128, 204, 255])
def test_solarize_matches_pil(threshold):
    expected = _pil(lambda im: ImageOps.solarize(im, threshold), PHOTO)
    np.testing.assert_array_equal(_ours(augment.solarize, PHOTO, threshold), expected)


def test_solarize_at_256_inverts_like_the_reference():
    np.testing.assert_array_equal(_ours(augment.solarize, PHOTO, 256), 255 - PHOTO)


@pytest.mark.parametrize("bits", range(1, 9))
def test_posterize_matches_pil(bits):
    expected = _pil(lambda im: ImageOps.posterize(im, bits), PHOTO)
    np.testing.assert_array_equal(_ours(augment.posterize, PHOTO, bits), expected)


def test_posterize_edge_bits_like_the_reference():
    np.testing.assert_array_equal(_ours(augment.posterize, PHOTO, 0), PHOTO & 0x80)  # as 1 bit, not black
    np.testing.assert_array_equal(_ours(augment.posterize, PHOTO, 9), PHOTO)


@pytest.mark.parametrize("factor", [0.1, 0.46, 1.0, 1.9])
def test_blend_ops_match_pil(factor):
    np.testing.assert_array_equal(
        _ours(augment.brightness, PHOTO, factor),
        _pil(lambda im: ImageEnhance.Brightness(im).enhance(factor), PHOTO),
    )
    # Grey levels (TF's rgb_to_grayscale vs PIL's L) and the smoothing's rounding differ by at most 1.
    _assert_close(
        _ours(augment.color, PHOTO, factor),
        _pil(lambda im: ImageEnhance.Color(im).enhance(factor), PHOTO),
        1,
        0.75,
    )
    _assert_close(
        _ours(augment.sharpness, PHOTO, factor),
        _pil(lambda im: ImageEnhance.Sharpness(im).enhance(factor), PHOTO),
        1,
        0.6,
    )


@pytest.mark.parametrize("height, width", [(48, 40), (64, 64), (320, 240)])
@pytest.mark.parametrize("factor", [0.3, 1.9])
def test_contrast_blends_from_the_reference_grey(height, width, factor):
    # PIL's ImageEnhance.Contrast blend, with the reference's grey: pixel count / 256, clipped to 255.
    image = _photo(height, width)
    grey = int(min(height * width / 256, 255))
    reference_grey = Image.new("RGB", (width, height), (grey,) * 3)
    expected = np.asarray(Image.blend(reference_grey, Image.fromarray(image), factor))
    np.testing.assert_array_equal(_ours(augment.contrast, image, factor), expected)


@pytest.mark.parametrize("pixels", [-5.0, 5.0, 60.0])
def test_translate_matches_pil_affine(pixels):
    def pil_affine(matrix):
        return lambda im: im.transform(
            im.size, Image.AFFINE, matrix, resample=Image.NEAREST, fillcolor=(augment.REPLACE_VALUE,) * 3
        )

    expected_x = _pil(pil_affine((1, 0, pixels, 0, 1, 0)), PHOTO)
    expected_y = _pil(pil_affine((1, 0, 0, 0, 1, pixels)), PHOTO)
    np.testing.assert_array_equal(_ours(augment.translate_x, PHOTO, pixels), expected_x)
    np.testing.assert_array_equal(_ours(augment.translate_y, PHOTO, pixels), expected_y)


# --------------------------------------------------------------------------------------------------
# Operations against NumPy.


@pytest.mark.parametrize("addition", [0, 33, 110])
def test_solarize_add_matches_numpy(addition):
    expected = np.where(PHOTO < 128, np.clip(PHOTO.astype(int) + addition, 0, 255), PHOTO).astype(np.uint8)
    np.testing.assert_array_equal(_ours(augment.solarize_add, PHOTO, addition), expected)


@pytest.mark.parametrize("degrees, turns", [(90.0, 1), (-90.0, -1), (180.0, 2)])
def test_rotate_quarter_turns_match_numpy(degrees, turns):
    square = _photo(40, 40)
    np.testing.assert_array_equal(_ours(augment.rotate, square, degrees), np.rot90(square, k=turns))


@pytest.mark.parametrize("degrees", [30.0, -17.3])
def test_rotate_matches_numpy(degrees):
    theta = np.deg2rad(degrees)
    cos, sin = np.cos(theta), np.sin(theta)
    cy, cx = (HEIGHT - 1) / 2, (WIDTH - 1) / 2
    matrix = [cos, -sin, cx - cos * cx + sin * cy, sin, cos, cy - sin * cx - cos * cy, 0, 0]
    ours = _ours(augment.rotate, PHOTO, degrees)
    # float32 rounding of the centre offsets may move a pixel that sits on a .5 boundary.
    _assert_close(ours, _nearest_transform(PHOTO, matrix), 255, 0.995)
    assert np.all(ours[0, 0] == augment.REPLACE_VALUE)  # a corner rotates out of the image


@pytest.mark.parametrize("shear", [0.27, -0.12, 0.3])
def test_shear_matches_numpy(shear):
    expected_x = _nearest_transform(PHOTO, [1, shear, 0, 0, 1, 0, 0, 0])
    expected_y = _nearest_transform(PHOTO, [1, 0, 0, shear, 1, 0, 0, 0])
    np.testing.assert_array_equal(_ours(augment.shear_x, PHOTO, shear), expected_x)
    np.testing.assert_array_equal(_ours(augment.shear_y, PHOTO, shear), expected_y)


@pytest.mark.parametrize("pad_size", [3, 10, 40])
def test_cutout_fills_one_clipped_square(pad_size):
    image = np.where(PHOTO == augment.REPLACE_VALUE, 127, PHOTO).astype(np.uint8)
    boxes = set()
    for i in range(12):
        out = _ours(augment.cutout, image, pad_size, _seed(i))
        changed = out != image
        assert np.all(changed.all(axis=2) == changed.any(axis=2))  # all three channels or none
        assert np.all(out[changed] == augment.REPLACE_VALUE)
        rows, cols = np.nonzero(changed.any(axis=2))
        box = (rows.min(), rows.max() + 1, cols.min(), cols.max() + 1)
        assert changed[box[0] : box[1], box[2] : box[3]].all()  # one solid rectangle
        for low, high, size in [(box[0], box[1], HEIGHT), (box[2], box[3], WIDTH)]:
            # [max(0, c - pad), min(size, c + pad)) for some centre c in [0, size)
            assert any(low == max(0, c - pad_size) and high == min(size, c + pad_size) for c in range(size))
        boxes.add(box)
    assert len(boxes) >= 4  # the position follows the seed


# --------------------------------------------------------------------------------------------------
# Shapes, policies, determinism.


@pytest.mark.parametrize("height, width", SIZES)
def test_every_op_and_policy_keeps_shape_and_dtype(height, width):
    image = _photo(height, width)
    for name in augment.OPS:
        _ours(_op(name), image, 7, _seed(3), RA)
    for i in range(4):
        _ours(augment.autoaugment, image, _seed(i))
        _ours(augment.randaugment, image, _seed(i), 2, 10.0)
        for policy in ["autoaugment", "randaugment"]:
            out = augment.distort(tf.constant(image, tf.float32), _seed(i), policy, 2, 10.0)
            assert out.dtype == tf.float32 and out.shape == (height, width, 3)
            values = out.numpy()
            assert values.min() >= 0 and values.max() <= 255 and np.all(values == np.round(values))


def test_randaugment_always_applies_the_picked_op():
    for name in augment.RANDAUGMENT_OPS:
        assert np.any(_ours(_op(name), NARROW, 10, _seed(1), RA) != NARROW)
    for i in range(24):
        assert np.any(_ours(augment.randaugment, NARROW, _seed(i), 1, 10.0) != NARROW)
    np.testing.assert_array_equal(_ours(augment.randaugment, NARROW, _seed(0), 0, 10.0), NARROW)
    with pytest.raises(ValueError, match="num_layers >= 0"):
        augment.randaugment(tf.constant(NARROW), _seed(0), -1, 10.0)


def _draws_over_seeds(draws_fn, count: int):
    """``draws_fn(seed)`` for the seeds [i, 7], i < count, computed in one tf.data graph and batched."""
    seeds = tf.data.Dataset.range(count).map(lambda i: tf.stack([i, tf.constant(7, tf.int64)]))
    return next(iter(seeds.map(draws_fn).batch(count)))


def test_autoaugment_draws_follow_policy_v0():
    def draws(seed):
        sub_policy, steps = augment.autoaugment_draws(seed)
        return sub_policy, tf.stack([applied for applied, _ in steps])

    count = 5000
    sub_policy, applied = (t.numpy() for t in _draws_over_seeds(draws, count))
    frequencies = np.bincount(sub_policy, minlength=25) / count
    # Uniform over the 25: 200 expected each, standard deviation 14 (7%).
    assert frequencies.min() > 0.75 / 25 and frequencies.max() < 1.25 / 25
    for k, steps in enumerate(augment.POLICY_V0):
        for position, (_, probability, _) in enumerate(steps):
            rate = applied[sub_policy == k, position].mean()
            if probability in (0.0, 1.0):
                assert rate == probability
            else:
                assert abs(rate - probability) < 0.12  # about 200 draws: at most 0.035 standard deviation


def test_randaugment_draws_are_uniform_over_the_ops():
    count = 4000
    picked = _draws_over_seeds(
        lambda seed: tf.stack([i for i, _ in augment.randaugment_draws(seed, 2)]), count
    )
    frequencies = np.bincount(picked.numpy().ravel(), minlength=16) / (2 * count)
    assert frequencies.min() > 0.8 / 16 and frequencies.max() < 1.2 / 16
    assert augment.randaugment_draws(_seed(0), 0) == []


def test_policies_apply_what_they_draw():
    # Replays the draws step by step with apply_op: the switch tables pick the drawn operation and level.
    for i in range(16):
        seed = _seed(i)
        sub_policy, draws = augment.autoaugment_draws(seed)
        expected = tf.constant(NARROW)
        for (name, _, level), (applied, op_seed) in zip(
            augment.POLICY_V0[int(sub_policy)], draws, strict=True
        ):
            if applied:
                expected = augment.apply_op(name, expected, level, op_seed, AA)
        np.testing.assert_array_equal(_ours(augment.autoaugment, NARROW, seed), expected.numpy())
        expected = tf.constant(NARROW)
        for op_index, op_seed in augment.randaugment_draws(seed, 3):
            expected = augment.apply_op(augment.RANDAUGMENT_OPS[int(op_index)], expected, 7.0, op_seed, RA)
        np.testing.assert_array_equal(_ours(augment.randaugment, NARROW, seed, 3, 7.0), expected.numpy())


def test_autoaugment_applies_steps_with_their_probabilities():
    changed = [np.any(_ours(augment.autoaugment, NARROW, _seed(i)) != NARROW) for i in range(48)]
    assert (
        0 < sum(changed) < 48
    )  # v0's probabilities below 1 (and ShearX at p=0) leave some images as they are


@pytest.mark.parametrize("policy", ["autoaugment", "randaugment"])
def test_same_seed_same_image_different_seeds_differ(policy):
    image = tf.constant(PHOTO, tf.float32)
    outputs = [augment.distort(image, _seed(i), policy, 2, 10.0).numpy() for i in range(12)]
    again = [augment.distort(image, _seed(i), policy, 2, 10.0).numpy() for i in range(12)]
    for first, second in zip(outputs, again, strict=True):
        np.testing.assert_array_equal(first, second)
    int32_seed = augment.distort(image, tf.constant([0, 1000], tf.int32), policy, 2, 10.0).numpy()
    np.testing.assert_array_equal(int32_seed, outputs[0])  # int32 and int64 seeds agree
    assert len({o.tobytes() for o in outputs}) >= 8


def test_distort_truncates_like_the_reference_and_none_is_identity():
    image = tf.constant(PHOTO, tf.float32) + 0.9
    truncated = augment.randaugment(tf.constant(PHOTO), _seed(5), 2, 10.0)
    np.testing.assert_array_equal(
        augment.distort(image, _seed(5), "randaugment", 2, 10.0).numpy(), truncated.numpy().astype(np.float32)
    )
    assert augment.distort(image, _seed(5), "none") is image
    with pytest.raises(ValueError, match="augment.policy='trivialaugment' is not one of"):
        augment.distort(image, _seed(5), "trivialaugment")


@pytest.mark.parametrize("policy", ["autoaugment", "randaugment"])
def test_policies_reproduce_inside_parallel_dataset_map(policy):
    images = np.stack([_photo(32, 32)] * 16).astype(np.float32)
    seeds = np.stack([[i, 1000 + i] for i in range(16)]).astype(np.int64)
    dataset = tf.data.Dataset.from_tensor_slices((images, seeds)).map(
        lambda image, seed: augment.distort(image, seed, policy, 2, 10.0), num_parallel_calls=tf.data.AUTOTUNE
    )
    first = np.stack(list(dataset.as_numpy_iterator()))
    second = np.stack(list(dataset.as_numpy_iterator()))
    np.testing.assert_array_equal(first, second)
    eager = np.stack([augment.distort(tf.constant(images[0]), _seed(i), policy, 2, 10.0) for i in range(16)])
    np.testing.assert_array_equal(first, eager)  # the graph inside tf.data draws what eager execution draws
    assert np.sum(np.any(first != images, axis=(1, 2, 3))) >= 8
