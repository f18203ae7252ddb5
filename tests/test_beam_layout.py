"""The record-to-shard layout from per-unit counts: coverage, +-1 balance, order, determinism, seeding."""

import collections
import random

import pytest

from beam_preprocess import layout, work
from effnet_common import schema


def _train_names(index: int, count: int, seed: int = 0) -> list[str]:
    """A synset's file names in the unit's output order (by seeded hash), as ProcessUnitFn orders them."""
    names = [f"n{index:08d}_{i}.JPEG" for i in range(count)]
    return sorted(names, key=lambda n: work.train_sort_key(seed, n))


def _train_unit(index: int, count: int, seed: int = 0) -> layout.UnitSpill:
    names = _train_names(index, count, seed)
    key = work.train_sort_key(seed, names[0]) if names else ""
    return layout.UnitSpill(schema.TRAIN, f"spill/{index}", key, count, num_bytes=1000 * count)


def _val_unit(index: int, names: list[str]) -> layout.UnitSpill:
    names = sorted(names)
    return layout.UnitSpill(
        schema.VALIDATION, f"spill/{index}", names[0], len(names), 10 * len(names), tuple(names)
    )


def _all_reads(split_layout):
    return [split_layout.shard_reads(s) for s in range(split_layout.num_shards)]


@pytest.mark.parametrize(
    "counts,num_shards",
    [([5, 3, 9, 1], 4), ([1300] * 3 + [732], 1024), ([32] * 40, 1024), ([7], 3), ([2, 2], 8)],
)
def test_train_layout_places_every_record_once_in_shards_balanced_within_one(counts, num_shards):
    units = [_train_unit(i, n) for i, n in enumerate(counts)]
    split_layout = layout.build_layout(schema.TRAIN, units, num_shards, 128, 1, seed=0)
    reads = _all_reads(split_layout)
    placed = collections.Counter(
        (split_layout.units[k].path, r) for shard in reads for k, ranks in shard for r in ranks
    )
    assert sorted(placed) == sorted((u.path, r) for u in units for r in range(u.count))
    assert set(placed.values()) == {1}
    sizes = [sum(len(ranks) for _, ranks in shard) for shard in reads]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == sum(counts)


def test_train_shard_visits_each_spill_file_once_and_finds_its_index_entries():
    units = [_train_unit(i, 1300) for i in range(6)]
    split_layout = layout.build_layout(schema.TRAIN, units, 1024, 128, 1, seed=0)
    for shard in (0, 511, 1023):
        reads = split_layout.shard_reads(shard)
        assert len({k for k, _ in reads}) == len(reads)  # one visit per spill file
        assert all(ranks in ([r], [r, r + 1024]) for _, ranks in reads for r in ranks[:1])
    # The index follows the spill's data region: one entry of the unit's entry size per record, in output order.
    unit = units[0]._replace(index_at=5000, entry_size=180)
    assert unit.index_range(0) == (5000, 180) and unit.index_range(2) == (5000 + 360, 180)


def test_train_layout_is_deterministic_and_independent_of_the_order_units_arrive_in():
    units = [_train_unit(i, n) for i, n in enumerate([40, 17, 33, 8, 25])]
    first = _all_reads(layout.build_layout(schema.TRAIN, units, 6, 128, 2, seed=3))
    shuffled = random.Random(1).sample(units, len(units))
    again = layout.build_layout(schema.TRAIN, shuffled, 6, 128, 2, seed=3)
    paths = [[(again.units[k].path, ranks) for k, ranks in shard] for shard in _all_reads(again)]
    original = layout.build_layout(schema.TRAIN, units, 6, 128, 2, seed=3)
    assert paths == [[(original.units[k].path, ranks) for k, ranks in shard] for shard in first]


def test_train_seed_changes_the_assignment_and_shards_mix_classes():
    def shard_of(seed):
        """File name -> shard."""
        units = [_train_unit(i, 50, seed) for i in range(10)]
        split_layout = layout.build_layout(schema.TRAIN, units, 8, 128, 1, seed=seed)
        names = {u.path: _train_names(i, 50, seed) for i, u in enumerate(units)}
        return {
            names[split_layout.units[k].path][r]: s
            for s, shard in enumerate(_all_reads(split_layout))
            for k, ranks in shard
            for r in ranks
        }

    a, b = shard_of(0), shard_of(1)
    assert a == shard_of(0) and len(a) == 500
    assert sum(a[name] != b[name] for name in a) > len(a) // 2
    # Every one of the 10 synsets reaches every one of the 8 shards.
    per_shard = collections.defaultdict(set)
    for name, shard in a.items():
        per_shard[shard].add(name.split("_")[0])
    assert all(len(synsets) == 10 for synsets in per_shard.values())


def _val_names(indices):
    return [schema.validation_filename(i) for i in indices]


@pytest.mark.parametrize("interleaved", [False, True])
def test_validation_shards_are_contiguous_runs_of_the_sorted_names(interleaved):
    rng = random.Random(0)
    indices = list(range(103))
    if interleaved:  # like val/<wnid>/ directories: every unit spans the whole name range
        rng.shuffle(indices)
        chunks = [indices[i::5] for i in range(5)]
    else:  # like the archive: consecutive ranges
        chunks = [indices[i : i + 30] for i in range(0, 103, 30)]
    units = [_val_unit(i, _val_names(chunk)) for i, chunk in enumerate(chunks)]
    split_layout = layout.build_layout(schema.VALIDATION, rng.sample(units, len(units)), 4, 128, 2, seed=0)
    by_path = {u.path: u for u in units}
    names = [
        [by_path[split_layout.units[k].path].keys[r] for k, ranks in shard for r in ranks]
        for shard in _all_reads(split_layout)
    ]
    assert [n for shard in names for n in shard] == sorted(_val_names(range(103)))
    assert [len(shard) for shard in names] == [25, 26, 26, 26]
    # Names travel on only where units interleave.
    assert all(bool(u.keys) == interleaved for u in split_layout.units)
    assert len(split_layout.clusters) == (1 if interleaved else 4)


def test_empty_units_are_skipped_and_a_bad_shard_index_is_refused():
    split_layout = layout.build_layout(schema.TRAIN, [_train_unit(0, 0), _train_unit(1, 5)], 2, 128, 1, 0)
    assert split_layout.num_records == 5 and len(split_layout.units) == 1
    with pytest.raises(ValueError, match="train has 2 shards, not a shard 2"):
        split_layout.shard_reads(2)
