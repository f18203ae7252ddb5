"""A work unit's spill file: everything a shard writer needs to write the unit's records, without a second copy
of the images that sit untouched in a source archive.

Checking (``ProcessUnitFn``) reads every image of a unit once. An image that passes through untouched is a byte
range of the unit's source file (a member of a tar archive), so its spill keeps only where it is, the Example's
bytes before and after it, and the record's CRC; a shard writer reads the image from the source again, by
exactly its byte range. An image that is not such a range (re-encoded, or read from a directory or a
tensorflow-datasets record) is written into the spill's data region. For ImageNet the spill is about 300 bytes
an image instead of a 140 GB copy of the training set, so the dataset is written once, as shards.

File layout::

    [data region: the images that are not in a source file]
    [index: one entry per record, in the unit's output order, each ``entry_size`` bytes]

    entry = ENTRY_HEADER(in_source, image_at, image_len, pre_len, post_len, crc) + pre + post + zero padding

``pre`` and ``post`` are the Example's bytes around the image; ``entry_size`` is the unit's longest entry, so a
shard writer finds entry r at ``index_at + r * entry_size`` and reads one entry and one image per record.
``crc`` is the record's TFRecord data CRC, computed when the image was checked: a shard writer computes it again
over the bytes it read and refuses to write a record whose bytes differ from those checked (a source file
changed in between).
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator

from beam_preprocess import storage, tfrecord

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
    """Reads records described by spill entries: images from the source files and the spill, by exact ranges.

    One reader per source file is kept open for the reader's life (a shard's units usually share one archive).
    """

    def __init__(self):
        self._sources: dict[str, storage.RangeReader] = {}
        self.bytes_read = 0  # entries, images and spill data read, for the counters

    def __enter__(self) -> RecordReader:
        return self

    def __exit__(self, *exc) -> None:
        for reader in self._sources.values():
            reader.__exit__(None, None, None)
        self._sources.clear()

    def entries(
        self, spill: storage.RangeReader, index_at: int, entry_size: int, ranks: list[int]
    ) -> list[Entry]:
        raw = spill.read([(index_at + r * entry_size, entry_size) for r in ranks])
        self.bytes_read += entry_size * len(ranks)
        return [decode_entry(e) for e in raw]

    def records(
        self, spill: storage.RangeReader, source: str, entries: list[Entry], keep_order: bool
    ) -> Iterator[tuple[Entry, bytes]]:
        """(entry, image bytes) of every entry: in the order given when ``keep_order``, else in file order.

        Images are read a batch of about ``_BATCH_BYTES`` at a time, so memory stays bounded whatever the
        number of a unit's records a shard takes (validation: up to a whole unit).
        """
        if not keep_order:
            entries = sorted(entries, key=lambda e: (e.in_source, e.image_at))
        for batch in _batches(entries):
            images: dict[int, bytes] = {}  # by id() of the entry
            spilled = [e for e in batch if not e.in_source]
            if spilled:
                for e, data in zip(
                    spilled, spill.read([(e.image_at, e.image_len) for e in spilled]), strict=True
                ):
                    images[id(e)] = data
            from_source = [e for e in batch if e.in_source]
            if from_source:
                ranges = [(e.image_at, e.image_len) for e in from_source]
                for e, data in zip(
                    from_source, self._source(source).read(ranges, max_gap=_GAP_FRACTION), strict=True
                ):
                    images[id(e)] = data
            self.bytes_read += sum(e.image_len for e in batch)
            for e in batch:
                yield e, images[id(e)]

    def _source(self, path: str) -> storage.RangeReader:
        reader = self._sources.get(path)
        if reader is None:
            reader = self._sources[path] = storage.RangeReader(path)
        return reader


_BATCH_BYTES = 16 * 2**20


def _batches(entries: list[Entry]) -> Iterator[list[Entry]]:
    """Consecutive runs of entries whose images add up to about ``_BATCH_BYTES``."""
    batch, size = [], 0
    for e in entries:
        if batch and size + e.image_len > _BATCH_BYTES:
            yield batch
            batch, size = [], 0
        batch.append(e)
        size += e.image_len
    if batch:
        yield batch


_CHANGED = "changed while the run was going"


def write_record(out, entry: Entry, image: bytes, where: str) -> int:
    """Writes the record of ``entry`` to ``out`` after checking it against the CRC taken when it was checked."""
    pieces = [entry.pre, image, entry.post]
    if tfrecord.masked_crc_value(pieces) != entry.crc:
        raise ChangedSourceError(
            f"{where} {_CHANGED}: the {entry.image_len} bytes at offset {entry.image_at} differ from the image"
            " checked earlier in this run; rerun once the inputs stay as they are"
        )
    return tfrecord.write_record_pieces(out, pieces, entry.crc)


def changed_source(error: BaseException) -> str | None:
    """The ``ChangedSourceError`` line inside ``error`` (runners wrap a worker's error in their own), or None."""
    for line in str(error).splitlines():
        if _CHANGED in line:
            return line.split(f"{ChangedSourceError.__name__}: ")[-1].split(" [while running")[0].strip()
    return None
