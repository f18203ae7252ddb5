"""Which record goes to which shard, from per-unit counts: no worker ever holds a list of a split's records.

Pure functions, called by the Beam stages of ``beam_preprocess.pipeline``. Each work unit orders its records
(training: by a seeded hash of the file name; validation: by name) and writes its spill's index
(``beam_preprocess.spill``) in that order; only a few numbers per unit travel on. A split's units are ordered
too (training: by smallest hash key; validation: by name) and numbered by prefix sums, so record r of unit k
has the global position g = start[k] + r without a list of all records.

- **Training**: record g goes to shard g mod S: shards get floor(N/S) or floor(N/S) + 1 records, every class
  lands in every shard once it has S images, and a shard finds its records of unit k directly (ranks
  (s - start[k]) mod S, + S, ...). Each shard writes its units in a seeded order, so shards do not repeat
  one class sequence.
- **Validation**: the name order is cut into S contiguous runs, shard i holding ranks [N*i/S, N*(i+1)/S).
  Units whose name ranges interleave (``val/<wnid>/`` directories, a tfds copy) are k-way merged by name;
  units that do not (the archive, a flat directory) need no names, so the layout drops them.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
import typing

from effnet_common import schema


class UnitSpill(typing.NamedTuple):
    """One unit's spill file; what the layout needs of it is a few numbers, whatever the unit's size."""

    split: str
    path: str
    order_key: str  # the unit's place in its split: smallest hash key (train), first file name (validation)
    count: int  # records
    num_bytes: int  # bytes of the unit's Examples
    keys: tuple[str, ...] = ()  # validation: the sorted file names, for merging units whose names interleave
    source: str = ""  # the file the unit's images were read from (their bytes are read again from there)
    index_at: int = 0  # where the spill's index starts
    entry_size: int = 0  # bytes of one index entry

    def index_range(self, rank: int) -> tuple[int, int]:
        """(offset, length) of the index entry of the record at ``rank`` in the unit's output order."""
        return self.index_at + rank * self.entry_size, self.entry_size


def choose_num_shards(total_bytes: int, requested: int, shard_mb: float, num_hosts: int) -> int:
    """The requested count, or enough shards of about ``shard_mb`` MiB, rounded up to a multiple of hosts."""
    if requested:
        return requested
    by_size = -(-total_bytes // int(shard_mb * 2**20))
    return max(num_hosts, -(-by_size // num_hosts) * num_hosts)


def balanced_bounds(num_records: int, num_shards: int) -> list[tuple[int, int]]:
    """[start, end) of each shard: contiguous runs whose lengths differ by at most one."""
    return [(num_records * i // num_shards, num_records * (i + 1) // num_shards) for i in range(num_shards)]


@dataclasses.dataclass(frozen=True)
class SplitLayout:
    """One split's units in order, their global start positions and the shard count."""

    split: str
    units: tuple[UnitSpill, ...]
    starts: tuple[int, ...]
    num_shards: int
    seed: int
    # Validation only: unit indices of each run of units whose names interleave (one unit when they do not).
    clusters: tuple[tuple[int, ...], ...] = ()

    @property
    def num_records(self) -> int:
        return self.starts[-1] + self.units[-1].count if self.units else 0

    @property
    def sorted_by_name(self) -> bool:
        return self.split == schema.VALIDATION

    def shard_reads(self, shard: int) -> list[tuple[int, list[int]]]:
        """(unit index, ranks in that unit) in the order shard ``shard`` writes its records."""
        if not 0 <= shard < self.num_shards:
            raise ValueError(f"{self.split} has {self.num_shards} shards, not a shard {shard}")
        if self.sorted_by_name:
            return self._contiguous_reads(*balanced_bounds(self.num_records, self.num_shards)[shard])
        return self._strided_reads(shard)

    def _strided_reads(self, shard: int) -> list[tuple[int, list[int]]]:
        reads = []
        for k, (unit, start) in enumerate(zip(self.units, self.starts, strict=True)):
            first = (shard - start) % self.num_shards
            if first < unit.count:
                reads.append((k, list(range(first, unit.count, self.num_shards))))
        random.Random(f"{self.seed}:{self.split}:{shard}").shuffle(reads)
        return reads

    def _contiguous_reads(self, begin: int, end: int) -> list[tuple[int, list[int]]]:
        reads: list[tuple[int, list[int]]] = []
        for cluster in self.clusters:
            cluster_start = self.starts[cluster[0]]
            cluster_end = self.starts[cluster[-1]] + self.units[cluster[-1]].count
            lo, hi = max(begin, cluster_start) - cluster_start, min(end, cluster_end) - cluster_start
            if lo >= hi:
                continue
            if len(cluster) == 1:
                reads.append((cluster[0], list(range(lo, hi))))
                continue
            merged = heapq.merge(*(self._named_ranks(k) for k in cluster))
            for _, k, r in itertools.islice(merged, lo, hi):
                if reads and reads[-1][0] == k:
                    reads[-1][1].append(r)
                else:
                    reads.append((k, [r]))
        return reads

    def _named_ranks(self, k: int):
        """(name, unit index, rank) of unit k's records, in name order."""
        return ((key, k, r) for r, key in enumerate(self.units[k].keys))


def build_layout(
    split: str, spills: list[UnitSpill], requested_shards: int, shard_mb: float, num_hosts: int, seed: int
) -> SplitLayout:
    """Orders one split's units, numbers their records and chooses the shard count."""
    units = sorted((u for u in spills if u.count), key=lambda u: (u.order_key, u.keys[-1:], u.path))
    starts = tuple(itertools.accumulate((u.count for u in units[:-1]), initial=0)) if units else ()
    total_bytes = sum(u.num_bytes for u in units)
    num_shards = choose_num_shards(total_bytes, requested_shards, shard_mb, num_hosts)
    clusters: tuple[tuple[int, ...], ...] = ()
    if split == schema.VALIDATION:
        clusters = _interleaving_runs(units)
        # Names are needed only to merge interleaving units: drop them elsewhere (the usual case).
        single = {c[0] for c in clusters if len(c) == 1}
        units = [u._replace(keys=()) if k in single else u for k, u in enumerate(units)]
    return SplitLayout(split, tuple(units), starts, num_shards, seed, clusters)


def _interleaving_runs(units: list[UnitSpill]) -> tuple[tuple[int, ...], ...]:
    """Groups of consecutive units (sorted by first name) whose name ranges overlap."""
    runs: list[list[int]] = []
    last_key = None
    for k, unit in enumerate(units):
        if runs and unit.keys[0] <= last_key:
            runs[-1].append(k)
            last_key = max(last_key, unit.keys[-1])
        else:
            runs.append([k])
            last_key = unit.keys[-1]
    return tuple(tuple(run) for run in runs)
