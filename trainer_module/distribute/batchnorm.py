"""Grouped synchronised batch normalisation (docs/recipe.md, "Distributed batch normalisation").

In training mode the statistics of a batch-norm layer are those of the union of the batches of a *group* of
replicas: group size 1 is per-replica batch norm, group size = all replicas is global (sync) batch norm. Mean
and variance come from the group's sums, E[x] and E[x^2] - E[x]^2, exact even for unequal batches; the moving
statistics average the groups' statistics over all replicas, so every replica holds the same moving mean and
variance. The reductions (``grouped_moments``) are differentiable, as in sync batch norm.

A group can also be smaller than one replica's batch: ``virtual_batch`` examples ("ghost" batch norm, Hoffer
et al. 2017), which keeps the reference LARS runs' ~128 examples per group on few replicas with large batches.
Groups of one replica, ghost ones included, take the fused batch-norm kernel when the input is a 4-D float32
image batch, much faster on CPU (why: docs/training.md, "distribute/batchnorm.py"); cross-replica groups,
bfloat16 or 5-D inputs and an epsilon below the kernel's floor keep the two-pass form.
"""

from typing import NamedTuple

import keras
import tensorflow as tf

from trainer_module.distribute.replica_groups import LAYOUTS, group_assignment

__all__ = [
    "GroupedBatchNormalization",
    "GroupMoments",
    "fused_per_replica_batch_norm",
    "fused_virtual_batch_norm",
    "group_assignment",
    "grouped_moments",
    "virtual_batch_norm",
]

# tf.nn.fused_batch_norm silently raises a smaller epsilon to this floor: smaller ones take the two-pass form.
FUSED_KERNEL_MIN_EPSILON = 1.001e-5


class GroupMoments(NamedTuple):
    """Batch statistics of one replica's group, each of shape ``[channels]``."""

    mean: tf.Tensor  # this replica's group mean, used to normalise
    variance: tf.Tensor  # this replica's group (biased) variance, used to normalise
    moving_mean_update: tf.Tensor  # average over all replicas of the group means; same on every replica
    moving_variance_update: tf.Tensor  # average over all replicas of the group variances


def grouped_moments(x, group_size, layout="consecutive"):
    """Batch statistics of channels-last ``x`` over this replica's group of replicas.

    Must run in a replica context: inside ``strategy.run`` or with no strategy at all (one replica). Sums and
    element counts are reduced, not per-replica means, so the statistics are exact even for unequal batches;
    the moving statistics weigh every group equally, which is the average over all replicas (every group has
    as many replicas) and exact for equal per-replica batches, as the input pipeline guarantees.

    Off TPU (MirroredStrategy, MultiWorkerMirroredStrategy, the default strategy) one all-reduce (SUM) of a
    ``[num_groups, 2 * channels + 1]`` table, in which each replica fills only its own group's row with its
    (sum, sum of squares, count), yields every group's sums at once: the replica reads its own row to
    normalise and averages all rows for the moving averages. On TPUStrategy, ``CrossReplicaSum`` with the
    group assignment, plus one all-replica ``CrossReplicaSum`` for the moving averages (the reference's "one
    extra all-reduce per layer").

    Args:
        x: Float tensor ``[batch, ..., channels]``, this replica's batch.
        group_size: Replicas per group; must divide ``num_replicas_in_sync``.
        layout: How replica ids form groups: ``"consecutive"`` or ``"torus2d"`` (see
            ``trainer_module.distribute.replica_groups``).

    Returns:
        ``GroupMoments`` of float tensors of shape ``[channels]`` (biased variance, as Keras uses).

    Raises:
        ValueError: outside a replica context, on a group size that does not divide the number of replicas,
            or on an empty batch.
    """
    context = _replica_context()
    num_replicas = context.num_replicas_in_sync
    groups = group_assignment(num_replicas, group_size, layout)
    if group_size == 1:
        return _per_replica_moments(x, context)
    local_sums = _local_sums(x)
    channels = x.shape[-1]
    if isinstance(tf.distribute.get_strategy(), _TPU_STRATEGIES):
        return _moments_by_cross_replica_sum(local_sums, channels, groups, num_replicas)
    return _moments_by_all_reduce(local_sums, channels, groups, context)


def fused_per_replica_batch_norm(x, scale, offset, epsilon):
    """Training-mode batch norm over this replica's own batch (groups of one) in one fused kernel.

    Computes what normalising with ``grouped_moments(x, group_size=1)`` computes (within float rounding),
    gradients included. Must run in a replica context, like ``grouped_moments``.

    Args:
        x: Float32 tensor ``[batch, height, width, channels]``, this replica's batch.
        scale: Float32 ``[channels]`` (gamma); ones for no scaling.
        offset: Float32 ``[channels]`` (beta); zeros for no offset.
        epsilon: Added to the variance before the square root; at least ``FUSED_KERNEL_MIN_EPSILON``.

    Returns:
        ``(outputs, moving_mean_update, moving_variance_update)``: the normalised batch, and the average over
        all replicas of their batch means and biased batch variances (no gradient).

    Raises:
        ValueError: outside a replica context, on inputs that are not a non-empty 4-D batch, or on an
            epsilon below the kernel's floor.
    """
    context = _replica_context()
    _check_fused_kernel_inputs(x, epsilon)
    x, count = _checked_element_count(x)
    outputs, mean, unbiased_variance = tf.compat.v1.nn.fused_batch_norm(
        x, scale, offset, epsilon=epsilon, data_format="NHWC", is_training=True
    )
    # The kernel reports the variance times n / (n - 1); undo it (n = 1 gives 0, the biased variance then).
    variance = unbiased_variance * ((count - 1.0) / count)
    return (outputs, *_replica_average(mean, variance, context))


def fused_virtual_batch_norm(x, virtual_batch, scale, offset, epsilon):
    """``virtual_batch_norm`` through the fused kernel, one kernel call per sub-batch.

    The sub-batches are consecutive slices of the batch along its first axis, so each is handed to the kernel
    as it lies in memory and the outputs are joined in the same order; the kernel's statistics and gradient
    are then exactly each sub-batch's, and the gradients of scale and offset sum over the sub-batches as in
    the two-pass form. Same results within float rounding as ``virtual_batch_norm``.

    Folding the sub-batches into channels (``[G * v, H, W, C]`` to ``[v, H, W, G * C]``, one kernel call)
    computes the same, but its four transposes (two forward, two backward) cost more than the slicing here in
    most shapes (``benchmarks/ghost_batch_norm.py`` measures both; docs/performance.md).

    Args:
        x: Float32 tensor ``[batch, height, width, channels]`` with a static batch size, this replica's batch.
        virtual_batch: Examples per statistics group; must divide the batch.
        scale: Float32 ``[channels]`` (gamma); ones for no scaling.
        offset: Float32 ``[channels]`` (beta); zeros for no offset.
        epsilon: Added to the variance before the square root; at least ``FUSED_KERNEL_MIN_EPSILON``.

    Returns:
        ``(outputs, moving_mean_update, moving_variance_update)``, as ``virtual_batch_norm``.

    Raises:
        ValueError: as ``fused_per_replica_batch_norm``, or on a batch ``virtual_batch`` does not divide.
    """
    groups = _ghost_groups(x, virtual_batch)
    if groups == 1:
        return fused_per_replica_batch_norm(x, scale, offset, epsilon)
    context = _replica_context()
    _check_fused_kernel_inputs(x, epsilon)
    x, count = _checked_element_count(x)
    normalised = [
        tf.compat.v1.nn.fused_batch_norm(
            sub_batch, scale, offset, epsilon=epsilon, data_format="NHWC", is_training=True
        )
        for sub_batch in tf.split(x, groups, axis=0)
    ]
    outputs = tf.concat([output for output, _, _ in normalised], axis=0)
    mean = tf.reduce_mean(tf.stack([mean for _, mean, _ in normalised]), axis=0)
    # The kernel reports each sub-batch's variance times n / (n - 1), n its elements per channel.
    sub_batch_count = count / groups
    unbiased = tf.reduce_mean(tf.stack([variance for _, _, variance in normalised]), axis=0)
    variance = unbiased * ((sub_batch_count - 1.0) / sub_batch_count)
    return (outputs, *_replica_average(mean, variance, context))


def virtual_batch_norm(x, virtual_batch, scale, offset, epsilon):
    """Training-mode batch norm over consecutive sub-batches of ``virtual_batch`` examples of this replica.

    Each sub-batch is normalised with its own mean and biased variance; the moving-average updates are the
    average of the sub-batches' statistics over the replica and then over all replicas (no gradient), so every
    replica holds the same moving statistics. ``virtual_batch`` equal to the batch is per-replica batch norm.

    Args:
        x: Float tensor ``[batch, ..., channels]`` with a static batch size, this replica's batch.
        virtual_batch: Examples per statistics group; must divide the batch.
        scale: ``[channels]`` (gamma) or None.
        offset: ``[channels]`` (beta) or None.
        epsilon: Added to the variance before the square root.

    Returns:
        ``(outputs, moving_mean_update, moving_variance_update)``.

    Raises:
        ValueError: outside a replica context, on an unknown batch size or one ``virtual_batch`` does not
            divide.
    """
    context = _replica_context()
    x, _ = _checked_element_count(x)
    groups, channels = _ghost_groups(x, virtual_batch), x.shape[-1]
    grouped = tf.reshape(x, [groups, virtual_batch, *x.shape[1:]])
    mean, variance = tf.nn.moments(grouped, axes=list(range(1, grouped.shape.rank - 1)), keepdims=True)
    outputs = tf.reshape(
        tf.nn.batch_normalization(grouped, mean, variance, offset, scale, epsilon), tf.shape(x)
    )
    sub_batch_average = [tf.reduce_mean(tf.reshape(m, [groups, channels]), 0) for m in (mean, variance)]
    return (outputs, *_replica_average(*sub_batch_average, context))


@keras.saving.register_keras_serializable(package="trainer_module")
class GroupedBatchNormalization(keras.layers.BatchNormalization):
    """Keras batch normalisation whose training statistics are shared by a group of replicas.

    Same variables (``gamma``, ``beta``, ``moving_mean``, ``moving_variance``), parameter count and inference
    behaviour as ``keras.layers.BatchNormalization``; channels-last only. In training mode the batch mean and
    (biased) variance come from ``grouped_moments``, and the moving statistics follow Keras' convention
    ``moving = moving * momentum + statistic * (1 - momentum)`` with the all-replica average of the group
    statistics, so they stay identical on every replica. With no strategy (one replica) and ``group_size=1``
    it computes what ``keras.layers.BatchNormalization`` computes.

    Args:
        group_size: Replicas whose batches form one statistics group: 1 = per replica, the number of
            replicas = global. Must divide ``num_replicas_in_sync``; checked when the layer is called.
        layout: ``"consecutive"`` (replicas ``[0..k-1], [k..2k-1], ...``) or ``"torus2d"`` (compact 2-D tiles
            of TPU chips, see ``trainer_module.distribute.replica_groups``).
        momentum: Momentum of the moving averages.
        epsilon: Added to the variance before the square root.
        name: Layer name.
        fused: Use the fused batch-norm kernel where it applies (groups of one replica, with or without
            ``virtual_batch``; 4-D float32 inputs; epsilon >= ``FUSED_KERNEL_MIN_EPSILON``); same results
            within float rounding, several times faster on CPU. False always takes the two-pass form
            (moments, then normalisation).
        virtual_batch: Examples per statistics group within a replica (``virtual_batch_norm``); None = the
            replica's whole batch. Only with ``group_size=1``; must divide the per-replica batch.
        **batch_norm_options: Other ``keras.layers.BatchNormalization`` arguments (``center``, ``scale``,
            initialisers, regularisers, constraints, ``dtype``...). ``axis`` must be -1; ``synchronized`` and
            ``renorm`` are not supported (grouping replaces the former; the latter changes the statistics).
    """

    def __init__(
        self,
        group_size=1,
        layout="consecutive",
        momentum=0.99,
        epsilon=1e-3,
        name=None,
        fused=True,
        virtual_batch=None,
        **batch_norm_options,
    ):
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(
                f"GroupedBatchNormalization group_size must be an integer >= 1, got {group_size!r}"
            )
        if virtual_batch is not None:
            if isinstance(virtual_batch, bool) or not isinstance(virtual_batch, int) or virtual_batch < 1:
                raise ValueError(
                    f"GroupedBatchNormalization virtual_batch must be an integer >= 1, got {virtual_batch!r}"
                )
            if group_size != 1:
                raise ValueError(
                    f"GroupedBatchNormalization virtual_batch={virtual_batch} splits a replica's batch; it "
                    f"needs group_size=1, got {group_size}"
                )
        LAYOUTS.check(layout)
        axis = batch_norm_options.get("axis", -1)
        if axis != -1:
            raise ValueError(f"GroupedBatchNormalization is channels-last only (axis=-1), got axis={axis}.")
        for unsupported in ("synchronized", "renorm"):
            if batch_norm_options.get(unsupported):
                raise ValueError(f"GroupedBatchNormalization does not support {unsupported}=True.")
        super().__init__(momentum=momentum, epsilon=epsilon, name=name, **batch_norm_options)
        self.group_size = group_size
        self.layout = layout
        self.fused = bool(fused)
        self.virtual_batch = virtual_batch

    def call(self, inputs, training=None, mask=None):
        if not (training and self.trainable):
            # Inference (or a frozen layer): moving statistics, exactly as Keras does it.
            return super().call(inputs, training=False, mask=mask)
        if mask is not None:
            raise ValueError(f"Batch-norm layer {self.name!r}: masks are not supported in training mode.")

        compute_dtype = keras.backend.result_type(inputs.dtype, "float32")
        inputs = keras.ops.cast(inputs, compute_dtype)
        offset = keras.ops.cast(self.beta, compute_dtype) if self.center else None
        scale = keras.ops.cast(self.gamma, compute_dtype) if self.scale else None
        try:
            if self._takes_fused_kernel(inputs):
                channels = inputs.shape[-1]
                scale = tf.ones([channels], compute_dtype) if scale is None else scale
                offset = tf.zeros([channels], compute_dtype) if offset is None else offset
                if self.virtual_batch is None:
                    normalised = fused_per_replica_batch_norm(inputs, scale, offset, self.epsilon)
                else:
                    normalised = fused_virtual_batch_norm(
                        inputs, self.virtual_batch, scale, offset, self.epsilon
                    )
                outputs, moving_mean_update, moving_variance_update = normalised
            elif self.virtual_batch is not None:
                outputs, moving_mean_update, moving_variance_update = virtual_batch_norm(
                    inputs, self.virtual_batch, scale, offset, self.epsilon
                )
            else:
                moments = grouped_moments(inputs, self.group_size, self.layout)
                moving_mean_update, moving_variance_update = (
                    moments.moving_mean_update,
                    moments.moving_variance_update,
                )
                outputs = keras.ops.batch_normalization(
                    x=inputs,
                    mean=moments.mean,
                    variance=moments.variance,
                    axis=-1,
                    offset=offset,
                    scale=scale,
                    epsilon=self.epsilon,
                )
        except ValueError as error:
            raise ValueError(f"Batch-norm layer {self.name!r}: {error}") from error

        self._update_moving_average(self.moving_mean, moving_mean_update)
        self._update_moving_average(self.moving_variance, moving_variance_update)
        return keras.ops.cast(outputs, self.compute_dtype)

    def _takes_fused_kernel(self, inputs):
        return (
            self.fused
            and self.group_size == 1
            and inputs.shape.rank == 4
            and inputs.dtype == tf.float32
            and self.epsilon >= FUSED_KERNEL_MIN_EPSILON
        )

    def _update_moving_average(self, variable, statistic):
        """Keras' convention: ``moving = moving * momentum + statistic * (1 - momentum)``."""
        statistic = keras.ops.cast(statistic, variable.dtype)
        variable.assign(variable * self.momentum + statistic * (1.0 - self.momentum))

    def get_config(self):
        return {
            **super().get_config(),
            "group_size": self.group_size,
            "layout": self.layout,
            "fused": self.fused,
            "virtual_batch": self.virtual_batch,
        }


def _replica_context():
    context = tf.distribute.get_replica_context()
    if context is None:
        raise ValueError(
            "Grouped batch norm in training mode must run in a replica context (inside strategy.run, or with "
            "no strategy); it was called in a cross-replica context, where it cannot tell its replica."
        )
    return context


def _check_fused_kernel_inputs(x, epsilon):
    if x.shape.rank != 4:
        raise ValueError(
            f"The fused batch-norm kernel needs inputs [batch, height, width, channels], got {x.shape}."
        )
    if epsilon < FUSED_KERNEL_MIN_EPSILON:
        raise ValueError(f"epsilon={epsilon} is below the fused kernel's floor {FUSED_KERNEL_MIN_EPSILON}.")


def _ghost_groups(x, virtual_batch):
    """How many sub-batches of ``virtual_batch`` examples this replica's batch holds."""
    batch = x.shape[0] if x.shape.rank else None
    if batch is None or batch % virtual_batch:
        raise ValueError(f"virtual_batch={virtual_batch} does not divide the per-replica batch of {batch}.")
    return batch // virtual_batch


def _checked_element_count(x):
    """``(x, elements per channel)``, with ``x`` made to wait for the non-empty check where it is needed.

    A batch of static shape is checked here, at trace time; one whose size is only known at run time is
    checked there (XLA drops that check, which then costs nothing).
    """
    if x.shape.rank is None or x.shape.rank < 2:
        raise ValueError(f"Grouped batch norm needs inputs [batch, ..., channels], got shape {x.shape}.")
    per_channel = x.shape[:-1]
    if 0 in per_channel:
        raise ValueError(f"Grouped batch norm got an empty per-replica batch (input shape {x.shape}).")
    if per_channel.is_fully_defined():
        return x, tf.constant(per_channel.num_elements(), x.dtype)
    count = tf.cast(tf.reduce_prod(tf.shape(x)[:-1]), x.dtype)
    check = tf.debugging.assert_positive(count, message="Grouped batch norm got an empty per-replica batch.")
    with tf.control_dependencies([check]):
        return tf.identity(x), tf.identity(count)


# Statistics from per-replica sums.


def _local_sums(x):
    """This replica's per-channel ``sum(x)``, ``sum(x^2)`` and element count, shape ``[2 * channels + 1]``."""
    x, count = _checked_element_count(x)
    reduction_axes = list(range(x.shape.rank - 1))
    sums = tf.reduce_sum(x, reduction_axes)
    square_sums = tf.reduce_sum(tf.square(x), reduction_axes)
    return tf.concat([sums, square_sums, count[None]], axis=0)


def _moments_from_sums(sums, channels):
    """Mean and biased variance from ``[..., 2 * channels + 1]`` sums (last entry: element count)."""
    count = sums[..., 2 * channels :]
    mean = sums[..., :channels] / count
    mean_of_squares = sums[..., channels : 2 * channels] / count
    # E[x^2] - E[x]^2 can round to slightly below zero for a near-constant channel.
    return mean, tf.maximum(mean_of_squares - tf.square(mean), 0.0)


# Groups of one replica: local statistics; only the moving averages cross replicas (no gradient needed).


def _replica_average(mean, variance, context):
    """Moving-average updates: ``[channels]`` mean and variance averaged over all replicas, no gradient."""
    statistics = tf.stop_gradient(tf.concat([mean, variance], axis=0))
    if context.num_replicas_in_sync > 1:
        statistics = context.all_reduce(tf.distribute.ReduceOp.MEAN, statistics)
    channels = mean.shape[-1]
    return statistics[:channels], statistics[channels:]


def _per_replica_moments(x, context):
    x, _ = _checked_element_count(x)
    mean, variance = tf.nn.moments(x, axes=list(range(x.shape.rank - 1)))
    return GroupMoments(mean, variance, *_replica_average(mean, variance, context))


# Non-TPU strategies: one all-reduce of a per-group table.


def _moments_by_all_reduce(local_sums, channels, groups, context):
    group_of_replica = [0] * sum(len(members) for members in groups)
    for group_index, members in enumerate(groups):
        for replica in members:
            group_of_replica[replica] = group_index
    own_group = tf.gather(tf.constant(group_of_replica), context.replica_id_in_sync_group)
    # Only the own group's row is non-zero, so after the SUM row g holds group g's sums.
    table = tf.one_hot(own_group, len(groups), dtype=local_sums.dtype)[:, None] * local_sums[None, :]
    group_sums = context.all_reduce(tf.distribute.ReduceOp.SUM, table)
    means, variances = _moments_from_sums(group_sums, channels)
    return GroupMoments(
        mean=tf.gather(means, own_group),
        variance=tf.gather(variances, own_group),
        moving_mean_update=tf.stop_gradient(tf.reduce_mean(means, axis=0)),
        moving_variance_update=tf.stop_gradient(tf.reduce_mean(variances, axis=0)),
    )


# TPU: CrossReplicaSum with a group assignment (cannot run on this project's CPU test machines).

_TPU_STRATEGIES = (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy)


def _moments_by_cross_replica_sum(local_sums, channels, groups, num_replicas):
    group_sums = tf.compat.v1.tpu.cross_replica_sum(local_sums, group_assignment=groups)
    mean, variance = _moments_from_sums(group_sums, channels)
    statistics = tf.stop_gradient(tf.concat([mean, variance], axis=0))
    replica_average = tf.compat.v1.tpu.cross_replica_sum(statistics) / num_replicas
    return GroupMoments(mean, variance, replica_average[:channels], replica_average[channels:])
