"""EfficientNet library: parity with keras.applications, the variant table, names, precision and training."""

import gc

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.backend.common import global_state

from trainer_module.models.blocks import InputNormalization
from trainer_module.models.efficientnet import block_specs, efficientnet, round_filters, round_repeats
from trainer_module.models.variants import VARIANTS, variant_spec

B_VARIANTS = [f"b{i}" for i in range(8)]
# The keras-parity fixture builds two models per variant (3-13 s each): the fast tier checks B0 only.
B_VARIANT_PARAMS = [pytest.param(v, marks=pytest.mark.slow) if v != "b0" else v for v in B_VARIANTS]
CONV_TYPES = (keras.layers.Conv2D, keras.layers.DepthwiseConv2D)

# docs/recipe.md, "The network": (variant, width, depth, resolution, dropout).
REFERENCE_TABLE = [
    ("b0", 1.0, 1.0, 224, 0.2),
    ("b1", 1.0, 1.1, 240, 0.2),
    ("b2", 1.1, 1.2, 260, 0.3),
    ("b3", 1.2, 1.4, 300, 0.3),
    ("b4", 1.4, 1.8, 380, 0.4),
    ("b5", 1.6, 2.2, 456, 0.4),
    ("b6", 1.8, 2.6, 528, 0.5),
    ("b7", 2.0, 3.1, 600, 0.5),
]
# A real forward pass at native resolution for these; larger ones check the symbolic output shape only.
FORWARD_PASS_VARIANTS = {"b0", "b1", "b2", "b3"}


def _all_layers(model):
    """Every layer of `model`, descending into nested models."""
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from _all_layers(layer)
        else:
            yield layer


def _size(weights):
    return sum(int(np.prod(w.shape)) for w in weights)


def _pixels(batch, size, seed=0):
    return np.random.default_rng(seed).uniform(0.0, 255.0, (batch, size, size, 3)).astype("float32")


@pytest.fixture(scope="module")
def tiny():
    """One 10-class tiny model shared by the tests that only inspect it or run it in inference mode."""
    return efficientnet("tiny", num_classes=10)


@pytest.fixture(scope="module")
def tiny_bfloat16():
    return efficientnet("tiny", num_classes=10, precision="bfloat16")


def _keras_reference(variant):
    """keras.applications' model with its weights' shapes but no allocated values (a quarter of the cost).

    Variables created in a StatelessScope are only registered for deferred initialisation; they are dropped
    from that registry again so that no later StatelessScope exit elsewhere in the session allocates them.
    """
    pending = global_state.get_global_attribute("uninitialized_variables", [], set_to_default=True)
    already_pending = len(pending)
    with keras.StatelessScope(initialize_variables=False):
        model = getattr(keras.applications, f"EfficientNet{variant.upper()}")(weights=None, classes=1000)
    del pending[already_pending:]
    return model


@pytest.fixture(scope="module", params=B_VARIANT_PARAMS)
def model_pair(request):
    """(our model at native resolution, keras.applications' model), built once per variant for all tests."""
    variant = request.param
    ours = efficientnet(variant)
    reference = _keras_reference(variant)
    yield variant, ours, reference
    del ours, reference
    gc.collect()


def test_parameter_count_matches_keras(model_pair):
    _, ours, reference = model_pair
    assert ours.count_params() == reference.count_params()
    assert _size(ours.trainable_weights) == _size(reference.trainable_weights)
    assert _size(ours.non_trainable_weights) == _size(reference.non_trainable_weights)


def test_weight_shapes_match_keras_layer_by_layer(model_pair):
    _, ours, reference = model_pair

    def shapes_by_layer(model):
        return {
            layer.name: [tuple(w.shape) for w in layer.weights]
            for layer in _all_layers(model)
            if layer.weights and not isinstance(layer, InputNormalization | keras.layers.Normalization)
        }

    ours_shapes, reference_shapes = shapes_by_layer(ours), shapes_by_layer(reference)
    assert sorted(ours_shapes) == sorted(reference_shapes)
    assert ours_shapes == reference_shapes
    assert {"stem_conv", "stem_bn", "block1a_dwconv", "block1a_bn", "block2b_se_reduce", "top_conv"} <= set(
        ours_shapes
    )


def test_output_shape_at_native_resolution(model_pair):
    variant, ours, _ = model_pair
    size = variant_spec(variant).resolution
    assert tuple(ours.input_shape) == (None, size, size, 3)
    assert tuple(ours.output_shape) == (None, 1000)
    if variant in FORWARD_PASS_VARIANTS:
        logits = ours(_pixels(1, size), training=False)
        assert tuple(logits.shape) == (1, 1000)
        assert logits.dtype == "float32"
        assert np.all(np.isfinite(logits))


@pytest.mark.parametrize("variant, width, depth, resolution, dropout", REFERENCE_TABLE)
def test_variant_table_matches_reference(variant, width, depth, resolution, dropout):
    spec = variant_spec(variant)
    assert (spec.name, spec.width, spec.depth, spec.resolution, spec.dropout) == (
        variant,
        width,
        depth,
        resolution,
        dropout,
    )


def test_known_variants():
    assert sorted(VARIANTS) == [*B_VARIANTS, "micro", "tiny"]


@pytest.mark.parametrize(
    "filters, width, expected",
    [
        (32, 1.0, 32),
        (32, 1.1, 32),  # 35.2 rounds down to 32, within 10%
        (1280, 1.1, 1408),
        (40, 1.2, 48),
        (16, 0.25, 8),  # never below the divisor
        (40, 0.25, 16),  # 10 would round to 8, more than 10% below: one divisor up
        (112, 1.8, 200),
    ],
)
def test_round_filters(filters, width, expected):
    assert round_filters(filters, width) == expected


@pytest.mark.parametrize("repeats, depth, expected", [(1, 1.0, 1), (3, 1.1, 4), (2, 1.2, 3), (4, 3.1, 13)])
def test_round_repeats(repeats, depth, expected):
    assert round_repeats(repeats, depth) == expected


def test_tiny_block_table():
    blocks = block_specs("tiny", drop_connect_rate=0.2)
    assert [b.name for b in blocks] == [
        "block1a_",
        "block2a_",
        "block3a_",
        "block4a_",
        "block4b_",
        "block5a_",
        "block5b_",
        "block6a_",
        "block6b_",
        "block7a_",
    ]
    np.testing.assert_allclose([b.drop_rate for b in blocks], 0.2 * np.arange(10) / 10)
    assert [b.strides for b in blocks] == [1, 2, 2, 2, 1, 1, 1, 2, 1, 1]
    assert all(b.se_ratio == 0.25 for b in blocks)
    # Several residual blocks with a non-zero drop-connect rate, so the demo model exercises stochastic depth.
    assert sum(b.has_residual and b.drop_rate > 0 for b in blocks) >= 3


def test_micro_keeps_b0s_first_two_stages_with_a_residual_block():
    """The plumbing tests' network: B0's first two stages at tiny's width; its last residual block drops
    connections, so a smoke run still goes through stochastic depth."""
    blocks = block_specs("micro", drop_connect_rate=0.2)
    assert [(b.name, b.strides, b.filters_in, b.filters_out) for b in blocks] == [
        ("block1a_", 1, 8, 8),
        ("block2a_", 2, 8, 8),
        ("block2b_", 1, 8, 8),
    ]
    assert [b.has_residual for b in blocks] == [True, False, True] and blocks[2].drop_rate > 0
    model = efficientnet("micro", num_classes=10)
    assert tuple(model(_pixels(2, 32), training=False).shape) == (2, 10)
    assert model.count_params() < efficientnet("tiny", num_classes=10).count_params() / 4


def test_tiny_forward_shape_and_size(tiny):
    logits = tiny(_pixels(2, 32), training=False)
    assert tuple(logits.shape) == (2, 10)
    assert 20_000 < tiny.count_params() < 300_000


def test_kernels_are_initialised_independently(tiny):
    """Same-shaped kernels must not share values (a reused Keras initializer would repeat its draw)."""
    kernels = [np.asarray(w) for w in tiny.weights if w.path.endswith("kernel")]
    for i, first in enumerate(kernels):
        for second in kernels[i + 1 :]:
            assert first.shape != second.shape or not np.array_equal(first, second)
    assert len({k.shape for k in kernels}) < len(kernels)  # there are same-shaped kernels to compare


def test_layer_names_are_fixed_across_builds(tiny):
    first, second = tiny, efficientnet("tiny", 10)
    assert [layer.name for layer in first.layers] == [layer.name for layer in second.layers]
    assert [w.path for w in first.weights] == [w.path for w in second.weights]
    names = {layer.name for layer in first.layers}
    assert {
        "images",
        "input_normalization",
        "stem_conv",
        "stem_bn",
        "top_conv",
        "top_bn",
        "predictions",
    } <= names
    assert {"block1a_dwconv", "block1a_bn", "block4b_se_reduce", "block4b_drop", "block4b_add"} <= names


def test_bn_in_weight_paths_means_normalisation_layer(tiny):
    """LARS excludes variables whose path contains 'bn': that must select exactly the normalisation layers."""
    for layer in _all_layers(tiny):
        for weight in layer.weights:
            assert ("bn" in weight.path) == isinstance(layer, keras.layers.BatchNormalization), weight.path


@pytest.mark.parametrize("precision, conv_compute", [("float32", "float32"), ("bfloat16", "bfloat16")])
def test_layer_dtypes(precision, conv_compute, tiny, tiny_bfloat16):
    model = {"float32": tiny, "bfloat16": tiny_bfloat16}[precision]
    convs = 0
    for layer in _all_layers(model):
        is_conv = isinstance(layer, CONV_TYPES)
        convs += is_conv
        assert layer.compute_dtype == (conv_compute if is_conv else "float32"), layer.name
        assert layer.variable_dtype == "float32", layer.name
    assert convs > 30
    assert all(w.dtype == "float32" for w in model.weights)
    assert model.output.dtype == "float32"
    assert model(_pixels(2, 32), training=False).dtype == "float32"


def test_bfloat16_forward_close_to_float32(tiny, tiny_bfloat16):
    # Inference mode: with batch statistics of 8 examples on 1x1 feature maps, BN amplifies rounding noise.
    mixed = tiny_bfloat16
    mixed.set_weights(tiny.get_weights())
    pixels = _pixels(8, 32)
    expected = np.asarray(tiny(pixels, training=False))
    actual = np.asarray(mixed(pixels, training=False))
    assert actual.dtype == np.float32
    error = np.abs(actual - expected).max()
    assert 0 < error < 0.05 * np.abs(expected).max()  # really computed in bfloat16, yet close


def test_input_normalization_matches_numpy(tiny):
    model = tiny
    layer = model.get_layer("input_normalization")
    assert len(layer.non_trainable_weights) == 3 and _size(layer.non_trainable_weights) == 7
    assert not layer.trainable_weights
    pixels = _pixels(2, 32)
    mean = np.array([0.485, 0.456, 0.406]) * 255
    std = np.array([0.229, 0.224, 0.225]) * 255
    np.testing.assert_allclose(layer(pixels), (pixels - mean) / std, rtol=1e-5, atol=1e-5)

    assert InputNormalization.from_config(layer.get_config()).get_config() == layer.get_config()

    # Without the layer the model expects standardised inputs and holds exactly those 7 values fewer.
    bare = efficientnet("tiny", 10, include_input_normalization=False)
    assert "input_normalization" not in {layer.name for layer in bare.layers}
    assert model.count_params() - bare.count_params() == 7
    bare.set_weights(model.get_weights()[3:])
    np.testing.assert_allclose(
        bare((pixels - mean) / std, training=False), model(pixels, training=False), rtol=1e-4, atol=1e-6
    )


def test_drop_connect_is_per_sample_and_ramped(tiny):
    expected = {
        b.name + "drop": b.drop_rate for b in block_specs("tiny", 0.2) if b.has_residual and b.drop_rate
    }
    drops = {layer.name: layer for layer in tiny.layers if layer.name.endswith("_drop")}
    assert {name: layer.rate for name, layer in drops.items()} == pytest.approx(expected)
    layer = drops["block6b_drop"]
    assert tuple(layer.noise_shape) == (None, 1, 1, 1)
    out = np.asarray(layer(np.ones((256, 2, 2, 4), "float32"), training=True)).reshape(256, -1)
    kept = out[:, 0] > 0
    np.testing.assert_allclose(out[kept], 1 / (1 - layer.rate), rtol=1e-6)  # whole sample kept, rescaled
    np.testing.assert_array_equal(out[~kept], 0)  # or whole sample dropped
    assert 0 < kept.mean() < 1


def test_bn_options_reach_default_norm_layer():
    model = efficientnet("tiny", 10, bn_momentum=0.9, bn_epsilon=1e-5)
    norms = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert len(norms) == 2 + 3 * 9 + 2  # stem, 9 expanding blocks x 3 + block1a x 2, top
    assert all(n.momentum == 0.9 and n.epsilon == 1e-5 for n in norms)


def test_injected_norm_layer_builds_every_norm_and_is_float32():
    requested = []

    def layer_norm(name):
        requested.append(name)
        # Deliberately bfloat16: the model must make its normalisation compute in float32 anyway.
        return keras.layers.LayerNormalization(name=name, dtype="mixed_bfloat16")

    model = efficientnet("tiny", 10, norm_layer=layer_norm, precision="bfloat16")
    norms = [layer for layer in model.layers if isinstance(layer, keras.layers.LayerNormalization)]
    assert requested == [layer.name for layer in norms]
    assert not any(isinstance(layer, keras.layers.BatchNormalization) for layer in model.layers)
    assert {"stem_bn", "block1a_bn", "block2a_expand_bn", "block7a_project_bn", "top_bn"} <= set(requested)
    assert all(layer.compute_dtype == "float32" for layer in norms)


def test_norm_layer_must_honour_its_name():
    with pytest.raises(ValueError, match="stem_bn"):
        efficientnet("tiny", 10, norm_layer=lambda name: keras.layers.BatchNormalization(name=f"my_{name}"))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(variant="b8"), r"Unknown EfficientNet variant 'b8'.*'b0'.*'b7'.*'tiny'"),
        (
            dict(variant="tiny", precision="float16"),
            r"model.precision='float16' is not one of 'float32', 'bfloat16'",
        ),
        (dict(variant="tiny", dropout_rate=1.0), "dropout_rate"),
        (dict(variant="tiny", drop_connect_rate=-0.1), "drop_connect_rate"),
        (dict(variant="tiny", input_size=0), "input_size"),
        (dict(variant="tiny", num_classes=0), "num_classes"),
    ],
)
def test_bad_settings_fail_fast(kwargs, message):
    with pytest.raises(ValueError, match=message):
        efficientnet(**kwargs)


@pytest.mark.slow  # a training of about 15 s
def test_tiny_model_learns():
    """Six eager Adam steps on a learnable 4-class problem (which quadrant is bright) beat chance clearly."""
    keras.utils.set_random_seed(0)
    labels = np.tile(np.arange(4), 8)
    images = np.random.default_rng(0).uniform(0, 60, (32, 32, 32, 3)).astype("float32")
    for image, label in zip(images, labels, strict=True):
        row, col = divmod(int(label), 2)
        image[row * 16 : row * 16 + 16, col * 16 : col * 16 + 16] += 180
    model = efficientnet("tiny", num_classes=4)
    optimizer = keras.optimizers.Adam(1e-2)
    cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    losses = []
    # Eager steps: tracing a compiled train step of this model costs more than the steps themselves.
    for _ in range(6):
        with tf.GradientTape() as tape:
            loss = cross_entropy(labels, model(images, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        losses.append(float(loss))
    assert np.isfinite(losses).all()
    assert losses[0] > np.log(4)
    assert np.mean(losses[-2:]) < 0.5 * np.log(4), losses
