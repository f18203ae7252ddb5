"""Grouped batch norm: the replica-group layouts (pure Python) and the layer under MirroredStrategy.

The layer is checked against an independent NumPy rendering of batch norm over the concatenated batches of
each group, on 8 logical CPU replicas, each holding a different batch.
"""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer_module.distribute.batchnorm import GroupedBatchNormalization, group_assignment
from trainer_module.distribute.replica_groups import (
    CORES_PER_CHIP,
    chip_grid_shape,
    chip_of_replica,
    ring_order,
)

NUM_REPLICAS = 8
PER_REPLICA_SHAPE = (3, 4, 4, 5)  # batch, height, width, channels
CHANNELS = PER_REPLICA_SHAPE[-1]
EPSILON = 1e-3
MOMENTUM = 0.75  # far from 1 so that one update moves the moving statistics visibly
GAMMA = np.array([0.5, 1.0, 1.5, -2.0, 3.0], np.float32)
BETA = np.array([0.1, -0.2, 0.3, 0.0, 1.0], np.float32)


# Replica-group layouts ---------------------------------------------------------------------------------------


def test_torus2d_reproduces_reference_groups_on_2048_cores():
    groups = group_assignment(2048, 8, "torus2d")

    assert groups[0] == [0, 1, 2, 3, 66, 67, 64, 65]
    assert groups[1] == [4, 5, 6, 7, 70, 71, 68, 69]
    assert len(groups) == 256


@pytest.mark.parametrize(
    "num_cores, grid",
    [(2, (1, 1)), (8, (2, 2)), (32, (4, 4)), (128, (8, 8)), (256, (8, 16)), (512, (16, 16))]
    + [(1024, (16, 32)), (2048, (32, 32))],
)
def test_chip_grid_of_pod_slices(num_cores, grid):
    assert chip_grid_shape(num_cores // CORES_PER_CHIP) == grid


@pytest.mark.parametrize(
    "group_size, tile", [(4, (1, 2)), (8, (2, 2)), (16, (2, 4)), (32, (4, 4)), (64, (4, 8))]
)
def test_group_tile_shapes(group_size, tile):
    assert chip_grid_shape(group_size // CORES_PER_CHIP) == tile


def test_consecutive_layout_is_arange_reshaped():
    assert group_assignment(8, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert group_assignment(12, 4, "consecutive") == np.arange(12).reshape(-1, 4).tolist()
    assert group_assignment(8, 1) == [[r] for r in range(8)]
    assert group_assignment(8, 8) == [list(range(8))]


LAYOUT_CASES = [
    (num_replicas, group_size, layout)
    for num_replicas in (8, 16, 32, 128, 512, 1024, 2048)
    for group_size in (1, 2, 4, 8, 16, 32, 64)
    for layout in ("consecutive", "torus2d")
    if group_size <= num_replicas
]


@pytest.mark.parametrize("num_replicas, group_size, layout", LAYOUT_CASES)
def test_groups_partition_the_replicas(num_replicas, group_size, layout):
    groups = group_assignment(num_replicas, group_size, layout)

    assert len(groups) == num_replicas // group_size
    assert all(len(group) == group_size for group in groups)
    assert sorted(itertools.chain.from_iterable(groups)) == list(range(num_replicas))


TORUS_CASES = [case[:2] for case in LAYOUT_CASES if case[2] == "torus2d" and case[1] >= 4]


@pytest.mark.parametrize("num_replicas, group_size", TORUS_CASES)
def test_torus2d_groups_are_aligned_compact_tiles(num_replicas, group_size):
    _, grid_cols = chip_grid_shape(num_replicas // CORES_PER_CHIP)
    tile_rows, tile_cols = chip_grid_shape(group_size // CORES_PER_CHIP)

    for group in group_assignment(num_replicas, group_size, "torus2d"):
        chips = [chip_of_replica(replica, grid_cols) for replica in group]
        rows = sorted({row for row, _ in chips})
        cols = sorted({col for _, col in chips})
        # A full rectangle of tile_rows x tile_cols chips, both cores of every chip, aligned to the tile grid.
        assert rows == list(range(rows[0], rows[0] + tile_rows))
        assert cols == list(range(cols[0], cols[0] + tile_cols))
        assert sorted(set(chips)) == sorted(itertools.product(rows, cols))
        assert all(chips.count(chip) == CORES_PER_CHIP for chip in set(chips))
        assert rows[0] % tile_rows == 0 and cols[0] % tile_cols == 0


@pytest.mark.parametrize("num_replicas, group_size", TORUS_CASES)
def test_torus2d_ring_neighbours_are_adjacent_chips(num_replicas, group_size):
    _, grid_cols = chip_grid_shape(num_replicas // CORES_PER_CHIP)

    for group in group_assignment(num_replicas, group_size, "torus2d"):
        chips = [chip_of_replica(replica, grid_cols) for replica in group]
        # Cyclic: the last member also neighbours the first, closing the ring.
        for (row_a, col_a), (row_b, col_b) in zip(chips, chips[1:] + chips[:1], strict=True):
            assert abs(row_a - row_b) + abs(col_a - col_b) <= 1


@pytest.mark.parametrize("rows, cols", [(2, 2), (2, 4), (4, 4), (4, 8), (8, 8)])
def test_ring_order_is_a_closed_walk_over_every_cell(rows, cols):
    ring = ring_order(rows, cols)

    assert sorted(ring) == sorted(itertools.product(range(rows), range(cols)))
    for (row_a, col_a), (row_b, col_b) in zip(ring, ring[1:] + ring[:1], strict=True):
        assert abs(row_a - row_b) + abs(col_a - col_b) == 1


@pytest.mark.parametrize(
    "num_replicas, group_size, layout, message",
    [
        (8, 3, "consecutive", "group_size=3 does not divide num_replicas=8"),
        (8, 16, "torus2d", "group_size=16 does not divide num_replicas=8"),
        (8, 0, "consecutive", "group_size must be an integer >= 1"),
        (8, -2, "consecutive", "group_size must be an integer >= 1"),
        (8, 2.0, "consecutive", "group_size must be an integer >= 1"),
        (0, 1, "consecutive", "num_replicas must be an integer >= 1"),
        (8, 2, "hexagonal", "model.bn_group_layout=.hexagonal. is not one of"),
        (24, 8, "torus2d", "torus2d num_replicas (TPU cores in the slice) must be a power of two, got 24"),
        (48, 12, "torus2d", "power of two"),
    ],
)
def test_bad_group_settings_fail_clearly(num_replicas, group_size, layout, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        group_assignment(num_replicas, group_size, layout)


# The layer under MirroredStrategy --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def strategy(logical_cpus):
    assert len(logical_cpus) == NUM_REPLICAS
    return tf.distribute.MirroredStrategy(devices=logical_cpus)


def _replica_batches(seed):
    """Eight different per-replica batches: each replica has its own offset and spread."""
    rng = np.random.default_rng(seed)
    replica = np.arange(NUM_REPLICAS).reshape(-1, 1, 1, 1, 1)
    noise = rng.normal(size=(NUM_REPLICAS, *PER_REPLICA_SHAPE))
    return (noise * (1.0 + 0.25 * replica) + 0.5 * replica).astype(np.float32)


def _numpy_group_batch_norm(batches, group_size):
    """Reference: plain batch norm over each group's concatenated batch (float64, biased variance)."""
    groups = batches.astype(np.float64).reshape(NUM_REPLICAS // group_size, -1, CHANNELS)
    mean = groups.mean(axis=1, keepdims=True)
    variance = groups.var(axis=1, keepdims=True)
    outputs = (groups - mean) / np.sqrt(variance + EPSILON) * GAMMA + BETA
    return outputs.reshape(batches.shape), mean[:, 0].mean(axis=0), variance[:, 0].mean(axis=0)


def _build_layer(strategy, group_size, layout="consecutive"):
    with strategy.scope():
        layer = GroupedBatchNormalization(
            group_size=group_size, layout=layout, momentum=MOMENTUM, epsilon=EPSILON
        )
        layer.build((None, *PER_REPLICA_SHAPE[1:]))
        layer.gamma.assign(GAMMA)
        layer.beta.assign(BETA)
    return layer


def _distribute(strategy, batches):
    return strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(batches[context.replica_id_in_sync_group])
    )


def _replica_copies(variable):
    """The value of a Keras variable on every replica's device."""
    return [component.numpy() for component in variable.value.values]


@pytest.mark.parametrize(
    "group_size, layout",
    [(1, "consecutive"), (2, "consecutive"), (4, "consecutive")]
    + [(8, "consecutive"), (4, "torus2d"), (8, "torus2d")],
)
def test_training_outputs_and_moving_statistics_match_numpy(strategy, group_size, layout):
    layer = _build_layer(strategy, group_size, layout)
    train_step = tf.function(lambda batches: strategy.run(lambda x: layer(x, training=True), args=(batches,)))
    first, second = _replica_batches(seed=1), _replica_batches(seed=2)

    train_step(_distribute(strategy, first))
    outputs = strategy.experimental_local_results(train_step(_distribute(strategy, second)))

    expected_outputs, second_mean, second_variance = _numpy_group_batch_norm(second, group_size)
    _, first_mean, first_variance = _numpy_group_batch_norm(first, group_size)
    np.testing.assert_allclose(np.stack(outputs), expected_outputs, atol=1e-5, rtol=1e-5)
    # Keras convention, twice, from moving mean 0 and moving variance 1.
    expected_mean = (0.0 * MOMENTUM + first_mean * (1 - MOMENTUM)) * MOMENTUM + second_mean * (1 - MOMENTUM)
    expected_variance = (1.0 * MOMENTUM + first_variance * (1 - MOMENTUM)) * MOMENTUM + second_variance * (
        1 - MOMENTUM
    )
    for replica_mean, replica_variance in zip(
        _replica_copies(layer.moving_mean), _replica_copies(layer.moving_variance), strict=True
    ):
        np.testing.assert_allclose(replica_mean, expected_mean, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(replica_variance, expected_variance, atol=1e-5, rtol=1e-5)


def test_group_variance_is_not_the_average_of_replica_variances():
    """Guards the reference's 2019 bug: the batches differ in mean, so averaging variances would be wrong."""
    batches = _replica_batches(seed=1).reshape(NUM_REPLICAS, -1, CHANNELS)
    _, _, group_variance = _numpy_group_batch_norm(_replica_batches(seed=1), NUM_REPLICAS)

    assert np.all(group_variance > batches.var(axis=1).mean(axis=0) + 0.1)


def test_inference_uses_the_moving_statistics(strategy):
    layer = _build_layer(strategy, group_size=4)
    layer.moving_mean.assign(np.linspace(-1.0, 1.0, CHANNELS))
    layer.moving_variance.assign(np.linspace(0.5, 2.0, CHANNELS))
    batches = _replica_batches(seed=3)

    outputs = strategy.experimental_local_results(
        strategy.run(lambda x: layer(x, training=False), args=(_distribute(strategy, batches),))
    )

    mean, variance = np.linspace(-1.0, 1.0, CHANNELS), np.linspace(0.5, 2.0, CHANNELS)
    expected = (batches - mean) / np.sqrt(variance + EPSILON) * GAMMA + BETA
    np.testing.assert_allclose(np.stack(outputs), expected, atol=1e-5, rtol=1e-5)


def _reference_gradients(batches, output_weights, group_size):
    """d(sum over replicas of sum(output * weight)) / d(input, gamma), batch norm per group, in float64 TF."""
    inputs = tf.constant(batches.astype(np.float64).reshape(NUM_REPLICAS // group_size, -1, CHANNELS))
    gamma = tf.constant(GAMMA.astype(np.float64))
    with tf.GradientTape() as tape:
        tape.watch([inputs, gamma])
        mean, variance = tf.nn.moments(inputs, axes=[1], keepdims=True)
        outputs = tf.nn.batch_normalization(inputs, mean, variance, BETA.astype(np.float64), gamma, EPSILON)
        loss = tf.reduce_sum(outputs * output_weights.astype(np.float64).reshape(outputs.shape))
    input_gradient, gamma_gradient = tape.gradient(loss, [inputs, gamma])
    return input_gradient.numpy().reshape(batches.shape), gamma_gradient.numpy()


@pytest.mark.parametrize("group_size", [1, 2, 8])
def test_gradients_flow_through_group_statistics(strategy, group_size):
    layer = _build_layer(strategy, group_size)
    batches = _replica_batches(seed=4)
    output_weights = np.random.default_rng(5).normal(size=batches.shape).astype(np.float32)

    def replica_gradients(x, weights):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(layer(x, training=True) * weights)
        return tape.gradient(loss, [x, layer.gamma])

    input_gradients, gamma_gradients = tf.function(lambda x, w: strategy.run(replica_gradients, args=(x, w)))(
        _distribute(strategy, batches), _distribute(strategy, output_weights)
    )

    input_gradients = np.stack(strategy.experimental_local_results(input_gradients))
    gamma_gradient = np.sum(strategy.experimental_local_results(gamma_gradients), axis=0)
    assert np.all(np.isfinite(input_gradients)) and np.all(np.isfinite(gamma_gradient))
    assert np.count_nonzero(input_gradients) == input_gradients.size and np.all(gamma_gradient != 0)
    # Each replica's input gradient includes what its input did to the other replicas' outputs through the
    # shared statistics; summing gamma's per-replica gradients gives the gradient of the summed loss.
    expected_input_gradient, expected_gamma_gradient = _reference_gradients(
        batches, output_weights, group_size
    )
    np.testing.assert_allclose(input_gradients, expected_input_gradient, atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(gamma_gradient, expected_gamma_gradient, atol=1e-4, rtol=1e-5)


def test_group_size_that_does_not_divide_the_replicas_fails_at_call_time(strategy):
    layer = _build_layer(strategy, group_size=3)

    with pytest.raises(ValueError, match="group_size=3 does not divide num_replicas=8"):
        strategy.run(
            lambda x: layer(x, training=True), args=(_distribute(strategy, _replica_batches(seed=6)),)
        )


def test_empty_per_replica_batch_fails(strategy):
    layer = _build_layer(strategy, group_size=2)
    empty = np.zeros((NUM_REPLICAS, 0, *PER_REPLICA_SHAPE[1:]), np.float32)

    with pytest.raises(ValueError, match="empty per-replica batch"):
        strategy.run(lambda x: layer(x, training=True), args=(_distribute(strategy, empty),))


def test_empty_batch_of_unknown_size_fails_when_run():
    layer = GroupedBatchNormalization()
    layer.build((None, 4, 4, CHANNELS))
    call = tf.function(
        lambda x: layer(x, training=True), input_signature=[tf.TensorSpec([None, 4, 4, CHANNELS], tf.float32)]
    )

    with pytest.raises(tf.errors.InvalidArgumentError, match="empty per-replica batch"):
        call(tf.zeros((0, 4, 4, CHANNELS)))


def test_training_in_cross_replica_context_fails(strategy):
    layer = _build_layer(strategy, group_size=1)

    with strategy.scope(), pytest.raises(ValueError, match="cross-replica context"):
        layer(tf.constant(_replica_batches(seed=7)[0]), training=True)


# The layer without a strategy ------------------------------------------------------------------------------------


def test_virtual_batches_normalise_each_sub_batch_and_average_their_statistics(strategy):
    """Ghost batch norm: each replica's batch of 4 in sub-batches of 2, against NumPy."""
    rng = np.random.default_rng(5)
    shape = (NUM_REPLICAS, 2, 2, 3, 3, CHANNELS)  # replica, sub-batch, example in it, height, width, channels
    batches = (rng.normal(size=shape) * (1.0 + np.arange(2).reshape(1, 2, 1, 1, 1, 1)) + 0.7).astype(
        np.float32
    )
    with strategy.scope():
        layer = GroupedBatchNormalization(momentum=MOMENTUM, epsilon=EPSILON, virtual_batch=2)
        layer.build((None, 3, 3, CHANNELS))
        layer.gamma.assign(GAMMA)
        layer.beta.assign(BETA)
    per_replica = batches.reshape(NUM_REPLICAS, 4, 3, 3, CHANNELS)
    train_step = tf.function(lambda x: strategy.run(lambda b: layer(b, training=True), args=(x,)))
    outputs = strategy.experimental_local_results(train_step(_distribute(strategy, per_replica)))

    wide = batches.astype(np.float64)
    mean = wide.mean(axis=(2, 3, 4), keepdims=True)
    variance = wide.var(axis=(2, 3, 4), keepdims=True)
    expected = ((wide - mean) / np.sqrt(variance + EPSILON) * GAMMA + BETA).reshape(per_replica.shape)
    np.testing.assert_allclose(np.stack(outputs), expected, atol=1e-5, rtol=1e-5)
    expected_mean = mean.mean(axis=(0, 1)).ravel() * (1 - MOMENTUM)
    expected_variance = MOMENTUM + variance.mean(axis=(0, 1)).ravel() * (1 - MOMENTUM)
    for replica_mean, replica_variance in zip(
        _replica_copies(layer.moving_mean), _replica_copies(layer.moving_variance), strict=True
    ):
        np.testing.assert_allclose(replica_mean, expected_mean, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(replica_variance, expected_variance, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="virtual_batch=3 does not divide the per-replica batch of 4"):
        GroupedBatchNormalization(virtual_batch=3, name="bn")(tf.ones((4, 3, 3, CHANNELS)), training=True)


def test_without_strategy_group_size_one_equals_keras_batch_norm():
    batches = _replica_batches(seed=8)
    ours = GroupedBatchNormalization(momentum=MOMENTUM, epsilon=EPSILON)
    keras_layer = keras.layers.BatchNormalization(momentum=MOMENTUM, epsilon=EPSILON)
    for layer in (ours, keras_layer):
        layer.build((None, *PER_REPLICA_SHAPE[1:]))
        layer.gamma.assign(GAMMA)
        layer.beta.assign(BETA)

    for batch in batches[:2]:
        np.testing.assert_allclose(ours(batch, training=True), keras_layer(batch, training=True), atol=1e-5)
    np.testing.assert_allclose(ours.moving_mean.numpy(), keras_layer.moving_mean.numpy(), atol=1e-6)
    np.testing.assert_allclose(ours.moving_variance.numpy(), keras_layer.moving_variance.numpy(), atol=1e-5)
    np.testing.assert_allclose(
        ours(batches[2], training=False), keras_layer(batches[2], training=False), atol=1e-6
    )


def test_without_strategy_group_size_above_one_fails():
    layer = GroupedBatchNormalization(group_size=2, name="stem_bn")

    with pytest.raises(ValueError, match="'stem_bn'.*group_size=2 does not divide num_replicas=1"):
        layer(tf.ones((2, 4, 4, CHANNELS)), training=True)


@pytest.mark.parametrize("options", [{}, {"center": False}, {"scale": False}])
def test_variables_and_parameter_count_equal_keras_batch_norm(options):
    ours = GroupedBatchNormalization(group_size=4, **options)
    keras_layer = keras.layers.BatchNormalization(**options)
    for layer in (ours, keras_layer):
        layer.build((None, 7, 7, 24))

    assert ours.count_params() == keras_layer.count_params()
    assert [v.name for v in ours.weights] == [v.name for v in keras_layer.weights]
    assert [v.name for v in ours.trainable_weights] == [v.name for v in keras_layer.trainable_weights]


def test_config_round_trip():
    layer = GroupedBatchNormalization(group_size=8, layout="torus2d", momentum=0.9, epsilon=1e-5, name="bn")
    clone = GroupedBatchNormalization.from_config(layer.get_config())
    ghost = GroupedBatchNormalization.from_config(GroupedBatchNormalization(virtual_batch=128).get_config())
    assert ghost.virtual_batch == 128 and clone.virtual_batch is None

    assert (clone.group_size, clone.layout, clone.momentum, clone.epsilon, clone.name) == (
        8,
        "torus2d",
        0.9,
        1e-5,
        "bn",
    )


@pytest.mark.parametrize(
    "options, message",
    [
        ({"group_size": 0}, "group_size must be an integer >= 1"),
        ({"group_size": 2.5}, "group_size must be an integer >= 1"),
        ({"layout": "ring"}, "model.bn_group_layout=.ring. is not one of"),
        ({"axis": 1}, "channels-last only"),
        ({"synchronized": True}, "does not support synchronized=True"),
        ({"renorm": True}, "does not support renorm=True"),
        ({"virtual_batch": 0}, "virtual_batch must be an integer >= 1"),
        (
            {"group_size": 2, "virtual_batch": 64},
            "virtual_batch=64 splits a replica's batch; it needs group_size=1",
        ),
    ],
)
def test_bad_layer_settings_fail_at_construction(options, message):
    with pytest.raises(ValueError, match=message):
        GroupedBatchNormalization(**options)


# The fused kernel against the two-pass form ----------------------------------------------------------------------


def _train_outputs_and_gradients(layer, x, output_weights):
    """One training call: outputs, d(sum(outputs * weights)) / d(x, gamma, beta), and the moving statistics."""

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            outputs = layer(x, training=True)
            loss = tf.reduce_sum(outputs * output_weights)
        return (outputs, *tape.gradient(loss, [x, layer.gamma, layer.beta]))

    results = [tensor.numpy() for tensor in step(tf.constant(x))]
    return results + [layer.moving_mean.numpy(), layer.moving_variance.numpy()]


def _op_types(layer, shape):
    graph = tf.function(lambda x: layer(x, training=True)).get_concrete_function(tf.TensorSpec(shape)).graph
    return {op.type for op in graph.get_operations()}


@pytest.mark.parametrize(
    "shape, virtual_batch", [((256, 14, 14, 40), 128), ((256, 7, 7, 112), 64), ((12, 3, 5, 4), 3)]
)
def test_fused_ghost_batch_norm_matches_the_two_pass_form(shape, virtual_batch):
    """Outputs, gradients of input, gamma and beta, and moving statistics, within float rounding."""
    rng = np.random.default_rng(11)
    channels = shape[-1]
    # Each sub-batch its own offset and spread, so mixing sub-batches up would show.
    sub_batch = np.repeat(np.arange(shape[0] // virtual_batch), virtual_batch).reshape(-1, 1, 1, 1)
    x = (rng.normal(size=shape) * (1.0 + 0.5 * sub_batch) + sub_batch).astype(np.float32)
    output_weights = rng.normal(size=shape).astype(np.float32)
    gamma, beta = rng.normal(size=(2, channels)).astype(np.float32)
    results = {}
    for fused in (True, False):
        layer = GroupedBatchNormalization(
            momentum=MOMENTUM, epsilon=EPSILON, virtual_batch=virtual_batch, fused=fused
        )
        layer.build((None, *shape[1:]))
        layer.gamma.assign(gamma)
        layer.beta.assign(beta)
        results[fused] = _train_outputs_and_gradients(layer, x, output_weights)

    names = ["outputs", "input gradient", "gamma gradient", "beta gradient", "moving mean", "moving variance"]
    for name, fused, two_pass in zip(names, results[True], results[False], strict=True):
        scale = np.abs(two_pass).max()
        np.testing.assert_allclose(fused, two_pass, atol=1e-5 * scale, rtol=1e-4, err_msg=name)


def test_fused_ghost_batch_norm_takes_the_kernel_only_where_it_applies():
    shape = (8, 4, 4, CHANNELS)
    ghost = GroupedBatchNormalization(virtual_batch=4)
    assert "FusedBatchNormV3" in _op_types(ghost, shape)
    for layer, layer_shape in [
        (GroupedBatchNormalization(virtual_batch=4, fused=False), shape),
        (GroupedBatchNormalization(virtual_batch=4, epsilon=1e-6), shape),
        (GroupedBatchNormalization(virtual_batch=4), (8, 2, 4, 4, CHANNELS)),  # 5-D
        # bfloat16 layers compute in float32 (and take the kernel); a float64 layer cannot.
        (GroupedBatchNormalization(virtual_batch=4, dtype="float64"), shape),
    ]:
        assert "FusedBatchNormV3" not in _op_types(layer, layer_shape), layer.get_config()


def test_fused_ghost_batch_norm_under_a_strategy_averages_the_statistics_over_replicas(strategy):
    """Every replica's batch split in two sub-batches; the fused kernel against NumPy, as the two-pass test."""
    rng = np.random.default_rng(12)
    per_replica = (
        rng.normal(size=(NUM_REPLICAS, 6, 3, 3, CHANNELS)) + np.arange(6).reshape(1, 6, 1, 1, 1)
    ).astype(np.float32)
    with strategy.scope():
        layer = GroupedBatchNormalization(momentum=MOMENTUM, epsilon=EPSILON, virtual_batch=3)
        layer.build((None, 3, 3, CHANNELS))
        layer.gamma.assign(GAMMA)
        layer.beta.assign(BETA)
    step = tf.function(lambda x: strategy.run(lambda b: layer(b, training=True), args=(x,)))
    graph = step.get_concrete_function(_distribute(strategy, per_replica)).graph
    assert "FusedBatchNormV3" in {op.type for op in graph.get_operations()}
    outputs = strategy.experimental_local_results(step(_distribute(strategy, per_replica)))

    wide = per_replica.astype(np.float64).reshape(NUM_REPLICAS, 2, 3, 3, 3, CHANNELS)
    mean = wide.mean(axis=(2, 3, 4), keepdims=True)
    variance = wide.var(axis=(2, 3, 4), keepdims=True)
    expected = ((wide - mean) / np.sqrt(variance + EPSILON) * GAMMA + BETA).reshape(per_replica.shape)
    np.testing.assert_allclose(np.stack(outputs), expected, atol=1e-5, rtol=1e-5)
    for replica_mean, replica_variance in zip(
        _replica_copies(layer.moving_mean), _replica_copies(layer.moving_variance), strict=True
    ):
        np.testing.assert_allclose(replica_mean, mean.mean(axis=(0, 1)).ravel() * (1 - MOMENTUM), atol=1e-5)
        np.testing.assert_allclose(
            replica_variance, MOMENTUM + variance.mean(axis=(0, 1)).ravel() * (1 - MOMENTUM), atol=1e-5
        )
