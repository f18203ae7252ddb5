"""Which replicas share batch-norm statistics: the grouping maths, in pure Python.

Two layouts:

- ``consecutive``: replicas ``[0..k-1], [k..2k-1], ...`` (the reference's ``arange(R).reshape(-1, k)``).
- ``torus2d``: each group is a compact 2-D tile of TPU chips, walked as a back-and-forth ring so that
  neighbours in the group are neighbours on the torus and the group's all-reduce never leaves its tile (what
  it assumes of a TPU v3 slice: ``_torus_tile_groups``).

The tensorflow/tpu reference also renumbers replicas along a ring over the whole slice; here the ids are
row-major, as docs/recipe.md ("Distributed batch normalisation") states (2048 cores, groups of 8: group 0 is
``[0, 1, 2, 3, 66, 67, 64, 65]``). How many replicas form a group is the config's to resolve
(``trainer_module.config.GROUP_SIZE_RULES``, the plan's ``bn_group_replicas``); this module lays them out.
"""

from trainer_module.choices import BN_LAYOUTS

CORES_PER_CHIP = 2

LAYOUTS = BN_LAYOUTS


def group_assignment(num_replicas, group_size, layout="consecutive"):
    """Partitions replica ids into batch-norm groups.

    Args:
        num_replicas: Total number of replicas (TPU cores, GPUs, devices) in sync, >= 1.
        group_size: Replicas per group, >= 1; must divide ``num_replicas``. 1 means per-replica statistics,
            ``num_replicas`` means global statistics.
        layout: ``"consecutive"`` or ``"torus2d"`` (see ``_torus_tile_groups``). ``"torus2d"`` needs
            power-of-two ``num_replicas`` and ``group_size``, as TPU slices and their tiles have.

    Returns:
        A list of ``num_replicas // group_size`` lists of ``group_size`` replica ids. Every id in
        ``range(num_replicas)`` appears exactly once. For ``torus2d`` each list is in ring order.

    Raises:
        ValueError: on a non-integer or non-positive size, a group size that does not divide the replica
            count, an unknown layout, or a torus layout the slice cannot have.
    """
    _check_positive_int("num_replicas", num_replicas)
    _check_positive_int("group_size", group_size)
    LAYOUTS.check(layout)
    if num_replicas % group_size:
        raise ValueError(
            f"group_size={group_size} does not divide num_replicas={num_replicas}: batch-norm groups must "
            "split the replicas evenly."
        )
    if group_size == 1:
        return _consecutive_groups(num_replicas, group_size)
    return LAYOUTS.build(layout, num_replicas, group_size)


def chip_grid_shape(num_chips):
    """Returns ``(rows, cols)`` of the chip grid (or tile) holding ``num_chips`` chips, a power of two.

    Square when ``num_chips`` is an even power of two, otherwise twice as wide as tall: 4 -> (2, 2),
    8 -> (2, 4), 512 -> (16, 32), 1024 -> (32, 32).
    """
    _check_power_of_two("number of chips", num_chips)
    exponent = num_chips.bit_length() - 1
    rows = 2 ** (exponent // 2)
    return rows, num_chips // rows


def chip_of_replica(replica_id, grid_cols):
    """Returns the ``(row, col)`` of the chip that runs ``replica_id`` in a grid ``grid_cols`` chips wide."""
    return divmod(replica_id // CORES_PER_CHIP, grid_cols)


def ring_order(rows, cols):
    """Visits every cell of a ``rows x cols`` grid once, each step moving to an adjacent cell.

    Back-and-forth ("boustrophedon") walk: along row 0, back along row 1, and so on over columns 1.., then up
    column 0 to the start, so the last cell is also adjacent to the first (a closed ring) whenever ``rows`` is
    even. A single row or column is a straight line (a ring when it has at most two cells).
    """
    if rows == 1 or cols == 1:
        return [(row, col) for row in range(rows) for col in range(cols)]
    if rows % 2:
        raise ValueError(f"A back-and-forth ring needs an even number of rows, got a {rows}x{cols} grid.")
    ring = [(0, 0)]
    for row in range(rows):
        columns = range(1, cols) if row % 2 == 0 else range(cols - 1, 0, -1)
        ring.extend((row, col) for col in columns)
    ring.extend((row, 0) for row in range(rows - 1, 0, -1))
    return ring


@LAYOUTS.register("consecutive")
def _consecutive_groups(num_replicas, group_size):
    return [list(range(start, start + group_size)) for start in range(0, num_replicas, group_size)]


@LAYOUTS.register("torus2d")
def _torus_tile_groups(num_replicas, group_size):
    """Groups as compact tiles of TPU chips, each walked as a ring. What it assumes of a slice (TPU v3):

    - A chip holds ``CORES_PER_CHIP = 2`` cores and every core runs one replica.
    - A slice of ``2**n`` chips is a ``rows x cols`` grid with ``rows = 2**(n // 2)`` and ``cols = rows`` or
      ``2 * rows`` (the longer side is the column axis): 8 cores = 2x2 chips, 32 = 4x4, 128 = 8x8,
      256 = 8x16, 512 = 16x16, 1024 = 16x32, 2048 = 32x32.
    - Replica ids are laid out row-major over that grid, two consecutive ids per chip: replica ``r`` runs on
      core ``r % 2`` of chip ``(row, col) = divmod(r // 2, cols)``.
    - A group of ``k`` cores is a tile of ``k / 2`` chips shaped by the same rule: 8 cores = 2x2 chips,
      16 = 2x4, 32 = 4x4, 64 = 4x8. Tiles are numbered row-major across the grid. Groups of 1 or 2 cores stay
      on one chip and groups of 4 cover a chip pair, which makes them identical to the consecutive layout.
    """
    _check_power_of_two("torus2d num_replicas (TPU cores in the slice)", num_replicas)
    _check_power_of_two("torus2d group_size", group_size)
    grid_rows, grid_cols = chip_grid_shape(num_replicas // CORES_PER_CHIP)
    tile_rows, tile_cols = chip_grid_shape(group_size // CORES_PER_CHIP)
    # Both shapes follow the same power-of-two rule, so a tile no larger than the grid always fits it.
    ring = ring_order(tile_rows, tile_cols)
    groups = []
    for tile_row in range(0, grid_rows, tile_rows):
        for tile_col in range(0, grid_cols, tile_cols):
            chips = [(tile_row + row, tile_col + col) for row, col in ring]
            groups.append(
                [
                    (row * grid_cols + col) * CORES_PER_CHIP + core
                    for row, col in chips
                    for core in range(CORES_PER_CHIP)
                ]
            )
    return groups


def _check_positive_int(what, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be an integer >= 1, got {value!r}.")


def _check_power_of_two(what, value):
    if value < 1 or value & (value - 1):
        raise ValueError(f"The {what} must be a power of two, got {value}.")
