"""The spill format on its own: written by SpillWriter, read back by RecordReader, records rebuilt exactly."""

import random

import pytest

from beam_preprocess import layout, spill, tfrecord
from effnet_common import storage


def _source_file(tmp_path, images: list[bytes]) -> tuple[str, list[int]]:
    """A file holding the images a 512-byte header apart, as a tar does; returns its path and their offsets."""
    path = str(tmp_path / "source.tar")
    offsets, data = [], bytearray()
    for image in images:
        data += b"h" * 512
        offsets.append(len(data))
        data += image
    with storage.open_write(path) as f:
        f.write(bytes(data))
    return path, offsets


def _write_spill(tmp_path, images, offsets, keys):
    """Every other image lives in the source; the rest are copied into the spill (as re-encoded ones are)."""
    examples = {}
    path = str(tmp_path / "unit.spill")
    with storage.open_write(path) as f:
        writer = spill.SpillWriter(f)
        for i, (image, at, key) in enumerate(zip(images, offsets, keys, strict=True)):
            features = {
                "image/encoded": image,
                "image/filename": f"{key}.JPEG".encode(),
                "image/class/label": i,
            }
            pieces = tfrecord.example_pieces(features)
            writer.add(key, pieces, image, at if i % 2 == 0 else None)
            examples[key] = b"".join(pieces)
        summary = writer.finish()
    return path, summary, examples


def _unit(path, source, summary) -> layout.UnitSpill:
    return layout.UnitSpill(
        "train", path, summary.keys[0], len(summary.keys), summary.record_bytes,
        source=source, index_at=summary.index_at, entry_size=summary.entry_size,
    )  # fmt: skip


@pytest.mark.parametrize("read_threads", [1, 3])
@pytest.mark.parametrize("keep_order", [True, False])
def test_records_are_rebuilt_exactly_in_output_order_across_batches(
    tmp_path, monkeypatch, keep_order, read_threads
):
    rng = random.Random(0)
    images = [rng.randbytes(rng.randint(100, 3000)) for _ in range(40)]
    keys = [f"k{rng.random():.6f}" for _ in images]
    source, offsets = _source_file(tmp_path, images)
    path, summary, examples = _write_spill(tmp_path, images, offsets, keys)
    assert summary.keys == sorted(keys) and summary.record_bytes == sum(map(len, examples.values()))
    # The spill holds the odd images and one entry per record, never the even ones.
    assert summary.index_at == sum(len(image) for image in images[1::2])
    assert storage.size(path) == summary.spill_bytes == summary.index_at + 40 * summary.entry_size
    monkeypatch.setattr(storage, "MAX_REQUEST_BYTES", 5000)  # several requests, several in flight
    unit = _unit(path, source, summary)
    # The same unit read twice, as a shard that takes two runs of its ranks would.
    reads = [(unit, list(range(3, 40, 3))), (unit, [1, 0, 2])]
    out = tmp_path / "shard"
    with spill.RecordReader(read_threads) as reader, open(out, "wb") as f:
        written = list(reader.shard_records(reads, keep_order))
        for _, entry, image in written:
            spill.write_record(f, entry, image, source)
    with open(out, "rb") as f:
        records = list(tfrecord.read_records(f))  # checks both CRCs of every record
    for (_, ranks), start in zip(reads, [0, len(reads[0][1])], strict=True):
        expected = [examples[summary.keys[r]] for r in ranks]
        got = records[start : start + len(ranks)]
        if keep_order:
            assert got == expected
        else:  # file order: images from the spill by offset, then those from the source by offset
            assert sorted(got) == sorted(expected)
            entries = [entry for _, entry, _ in written[start : start + len(ranks)]]
            assert entries == sorted(entries, key=lambda e: (e.in_source, e.image_at))
    ranks = [r for _, rs in reads for r in rs]
    image_bytes = sum(len(image) for _, _, image in written)
    assert image_bytes == sum(len(images[keys.index(summary.keys[r])]) for r in ranks)
    assert reader.bytes_read == image_bytes + summary.entry_size * len(ranks)


def test_a_read_that_fails_on_a_reading_thread_surfaces_in_the_writer(tmp_path):
    images = [b"a" * 500, b"b" * 700, b"c" * 300]
    source, offsets = _source_file(tmp_path, images)
    path, summary, _ = _write_spill(tmp_path, images, offsets, ["x", "y", "z"])
    storage.write_text(source, "cut")  # the source lost its images after they were checked
    with spill.RecordReader(3) as reader:
        with pytest.raises(OSError, match="source.tar is cut short"):
            list(reader.shard_records([(_unit(path, source, summary), [0, 1, 2])], keep_order=True))


def test_a_record_whose_image_changed_is_refused(tmp_path):
    images = [b"a" * 500, b"b" * 700]
    source, offsets = _source_file(tmp_path, images)
    path, summary, _ = _write_spill(tmp_path, images, offsets, ["x", "y"])
    with spill.RecordReader() as reader:
        ((_, entry, _),) = reader.shard_records([(_unit(path, source, summary), [0])], keep_order=True)
    with open(tmp_path / "shard", "wb") as f:
        with pytest.raises(
            spill.ChangedSourceError, match="source.tar changed while the run was going: the 500"
        ):
            spill.write_record(f, entry, b"a" * 499 + b"!", source)
    error = RuntimeError(f"Traceback ...\nbeam_preprocess.spill.ChangedSourceError: {source} changed while the run "
                         "was going: the 500 bytes at offset 512 differ [while running 'WriteShards']")  # fmt: skip
    assert (
        spill.changed_source(error)
        == f"{source} changed while the run was going: the 500 bytes at offset 512 differ"
    )
    assert spill.changed_source(RuntimeError("something else")) is None
