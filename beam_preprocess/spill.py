"""A work unit's spill file: what a shard writer needs to write the unit's records, without a second copy of
the images that sit untouched in a source archive (the design: docs/sharding.md).

An untouched image is a byte range of the unit's source file (a tar member), so its entry keeps only where it
is, the Example's bytes around it and the record's CRC; anything else (re-encoded, or read from a directory
or a tfds record) is copied into the spill's data region. File layout::

    [data region: the images that are not in a source file]
    [index: one entry per record, in the unit's output order, each ``entry_size`` bytes]

    entry = ENTRY_HEADER(in_source, image_at, image_len, pre_len, post_len, crc) + pre + post + zero padding

``entry_size`` is the unit's longest entry, so a shard writer finds entry r at ``index_at + r * entry_size``.
``crc`` is the record's TFRecord data CRC, taken when the image was checked: a shard writer refuses a record
whose bytes differ from those checked (a source file changed in between).
"""

from __future__ import annotations

import dataclasses
import itertools
import struct
import threading
from collections.abc import Iterator

from beam_preprocess import layout, tfrecord, threads
from effnet_common import storage

ENTRY_HEADER = struct.Struct("<BQIIII")  # in_source, image_at, image_len, pre_len, post_len, masked crc


class ChangedSourceError(OSError):
    """The bytes read for a record differ from those checked: a source changed while the run was going."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One record as its index entry describes it."""

    in_source: bool  # the image is at image_at of the unit's source file, else of the spill's data region
    image_at: int
    image_len: int
    pre: bytes
    post: bytes
    crc: int


def decode_entry(raw: bytes) -> Entry:
    in_source, image_at, image_len, pre_len, post_len, crc = ENTRY_HEADER.unpack_from(raw)
    heads = ENTRY_HEADER.size
    return Entry(
        bool(in_source),
        image_at,
        image_len,
        raw[heads : heads + pre_len],
        raw[heads + pre_len : heads + pre_len + post_len],
        crc,
    )


@dataclasses.dataclass(frozen=True)
class SpillSummary:
    """What ``SpillWriter.finish`` wrote: where the index is, the entry size, and the record order."""

    index_at: int
    entry_size: int
    keys: list[str]  # order keys of the records, in output order
    record_bytes: int  # bytes of the Examples the spill describes
    spill_bytes: int  # bytes of the spill file


class SpillWriter:
    """Appends records to an open spill file; ``finish`` writes the index in output (order key) order."""

    def __init__(self, f):
        self._f = f
        self._data_bytes = 0
        self._record_bytes = 0
        self._entries: list[tuple[str, bytes, bytes]] = []  # (order key, header, pre + post)

    def add(self, key: str, pieces: list[bytes], image: bytes, source_at: int | None) -> None:
        """One Example given as ``pieces`` (``image`` is one of them, the very object); ``source_at`` is the
        image's offset in the unit's source file when its bytes are exactly that range, else None."""
        i = next(n for n, piece in enumerate(pieces) if piece is image)
        pre, post = b"".join(pieces[:i]), b"".join(pieces[i + 1 :])
        crc = tfrecord.masked_crc_value(pieces)
        if source_at is None:
            self._f.write(image)
            in_source, image_at = 0, self._data_bytes
            self._data_bytes += len(image)
        else:
            in_source, image_at = 1, source_at
        header = ENTRY_HEADER.pack(in_source, image_at, len(image), len(pre), len(post), crc)
        self._entries.append((key, header, pre + post))
        self._record_bytes += len(pre) + len(image) + len(post)

    def finish(self) -> SpillSummary:
        self._entries.sort(key=lambda entry: entry[0])
        entry_size = max((len(h) + len(heads) for _, h, heads in self._entries), default=ENTRY_HEADER.size)
        for _, header, heads in self._entries:
            self._f.write(header + heads + bytes(entry_size - len(header) - len(heads)))
        return SpillSummary(
            index_at=self._data_bytes,
            entry_size=entry_size,
            keys=[key for key, _, _ in self._entries],
            record_bytes=self._record_bytes,
            spill_bytes=self._data_bytes + entry_size * len(self._entries),
        )


# Two image ranges of a source closer than this fraction of the next one are read together (a tar member's
# 512-byte header and padding for an ImageNet image): bytes read stay within a few percent of those needed.
_GAP_FRACTION = 1 / 16


class RecordReader:
    """Reads the records of one shard: entries from the units' spills, images from the sources, by exact
    ranges.

    Consecutive ranges of a file are read in one request (``storage.plan_requests``). On an object store
    every request has a latency (tens of milliseconds on GCS) that dwarfs the transfer of one image, and a
    training shard of ImageNet takes one or two records from each of about 1,000 units: about two requests a
    record. With ``threads`` > 1 that many requests are in flight at once, the records still come out in the
    shard's order, and at most ``2 * threads`` requests' bytes (``storage.MAX_REQUEST_BYTES`` each) are
    held. On a local disk one thread reads (``storage.read_threads``).
    """

    def __init__(self, threads: int = 1):
        self._threads = threads
        self._readers: dict[str, storage.RangeReader] = {}
        self._readers_lock = threading.Lock()
        self.bytes_read = 0  # entries, images and spill data read, for the counters

    def __enter__(self) -> RecordReader:
        return self

    def __exit__(self, *exc) -> None:
        for reader in self._readers.values():
            reader.__exit__(None, None, None)
        self._readers.clear()

    def shard_records(
        self, reads: list[tuple[layout.UnitSpill, list[int]]], keep_order: bool
    ) -> Iterator[tuple[layout.UnitSpill, Entry, bytes]]:
        """(unit, entry, image) of every record of ``reads``: the units in the order given, each unit's ranks
        in the order given when ``keep_order``, else in file order (training order within a unit is free, so
        each file is read front to back)."""
        located = self._located(reads, keep_order)
        wanted = (
            ((unit, entry), unit.source if entry.in_source else unit.path, entry.image_at, entry.image_len)
            for unit, entry in located
        )
        for (unit, entry), image in self._fetch(wanted):
            self.bytes_read += entry.image_len
            yield unit, entry, image

    def _located(self, reads, keep_order: bool) -> Iterator[tuple[layout.UnitSpill, Entry]]:
        """(unit, entry) of every record, in the order its image is to be read."""
        wanted = (
            (i, unit.path, *unit.index_range(rank)) for i, (unit, ranks) in enumerate(reads) for rank in ranks
        )
        for i, fetched in itertools.groupby(self._fetch(wanted), key=lambda pair: pair[0]):
            unit, ranks = reads[i]
            entries = [decode_entry(raw) for _, raw in fetched]
            self.bytes_read += unit.entry_size * len(ranks)
            for entry in entries if keep_order else sorted(entries, key=_file_order):
                yield unit, entry

    def _fetch(self, wanted) -> Iterator[tuple[object, bytes]]:
        """(item, bytes) for every ``(item, path, offset, length)`` wanted, in order; requests run on
        threads."""
        requests = storage.plan_requests(wanted, _GAP_FRACTION)
        for request, data in threads.ordered_map(self._get, requests, self._threads, "read"):
            yield from zip(request.items, request.split(data), strict=True)

    def _get(self, request: storage.Request) -> bytes:
        with self._readers_lock:
            reader = self._readers.get(request.path)
            if reader is None:
                reader = self._readers[request.path] = storage.RangeReader(request.path)
        return reader.fetch(request.start, request.size)


def _file_order(entry: Entry) -> tuple[bool, int]:
    return entry.in_source, entry.image_at


_CHANGED = "changed while the run was going"


def write_record(out, entry: Entry, image: bytes, where: str) -> int:
    """Writes the record of ``entry`` to ``out`` after checking it against the CRC taken when it was
    checked."""
    pieces = [entry.pre, image, entry.post]
    if tfrecord.masked_crc_value(pieces) != entry.crc:
        raise ChangedSourceError(
            f"{where} {_CHANGED}: the {entry.image_len} bytes at offset {entry.image_at} differ from the "
            "image checked earlier in this run; rerun once the inputs stay as they are"
        )
    return tfrecord.write_record_pieces(out, pieces, entry.crc)


def changed_source(error: BaseException) -> str | None:
    """The ``ChangedSourceError`` line inside ``error`` (runners wrap a worker's error in their own), or
    None."""
    for line in str(error).splitlines():
        if _CHANGED in line:
            return line.split(f"{ChangedSourceError.__name__}: ")[-1].split(" [while running")[0].strip()
    return None
