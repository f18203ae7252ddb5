"""The spill format on its own: written by SpillWriter, read back by RecordReader, records rebuilt exactly."""

import random

import pytest

from beam_preprocess import spill, storage, tfrecord


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


@pytest.mark.parametrize("keep_order", [True, False])
def test_records_are_rebuilt_exactly_in_output_order_across_batches(tmp_path, monkeypatch, keep_order):
    rng = random.Random(0)
    images = [rng.randbytes(rng.randint(100, 3000)) for _ in range(40)]
    keys = [f"k{rng.random():.6f}" for _ in images]
    source, offsets = _source_file(tmp_path, images)
    path, summary, examples = _write_spill(tmp_path, images, offsets, keys)
    assert summary.keys == sorted(keys) and summary.record_bytes == sum(map(len, examples.values()))
    # The spill holds the odd images and one entry per record, never the even ones.
    assert summary.index_at == sum(len(image) for image in images[1::2])
    assert storage.size(path) == summary.spill_bytes == summary.index_at + 40 * summary.entry_size
    monkeypatch.setattr(spill, "_BATCH_BYTES", 5000)  # several batches of images per read
    ranks = list(range(3, 40, 3))
    out = tmp_path / "shard"
    with storage.RangeReader(path) as unit_spill, spill.RecordReader() as reader, open(out, "wb") as f:
        entries = reader.entries(unit_spill, summary.index_at, summary.entry_size, ranks)
        written = [(e, image) for e, image in reader.records(unit_spill, source, entries, keep_order)]
        for e, image in written:
            spill.write_record(f, e, image, source)
    expected = [examples[summary.keys[r]] for r in ranks]
    with open(out, "rb") as f:
        records = list(tfrecord.read_records(f))  # checks both CRCs of every record
    if keep_order:
        assert records == expected
    else:  # file order: images from the source by offset, after those from the spill
        assert sorted(records) == sorted(expected)
        assert [e.image_at for e, _ in written if e.in_source] == sorted(
            e.image_at for e in entries if e.in_source
        )
    assert reader.bytes_read == sum(e.image_len for e in entries) + summary.entry_size * len(ranks)


def test_a_record_whose_image_changed_is_refused(tmp_path):
    images = [b"a" * 500, b"b" * 700]
    source, offsets = _source_file(tmp_path, images)
    path, summary, _ = _write_spill(tmp_path, images, offsets, ["x", "y"])
    with storage.RangeReader(path) as unit_spill:
        (entry,) = spill.RecordReader().entries(unit_spill, summary.index_at, summary.entry_size, [0])
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
