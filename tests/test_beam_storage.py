"""The storage layer on a local disk (gs:// is covered against the emulator in test_gcs_storage.py)."""

import pytest

from effnet_common import storage


def test_a_failed_write_leaves_neither_the_file_nor_a_temporary(tmp_path):
    path = str(tmp_path / "deep" / "er" / "file.bin")
    with pytest.raises(RuntimeError, match="interrupted"):
        with storage.open_write(path) as f:
            f.write(b"half")
            raise RuntimeError("interrupted")
    assert not storage.exists(path) and storage.list_tree(str(tmp_path)) == []
    with storage.open_write(path) as f:  # parent directories are created
        f.write(b"whole")
    assert storage.list_tree(str(tmp_path)) == [path]


def test_read_ranges_returns_exactly_the_ranges_and_refuses_a_short_file(tmp_path):
    path = str(tmp_path / "spill")
    storage.write_text(path, "0123456789" * 10)
    ranges = [(0, 3), (3, 4), (50, 5), (98, 2)]
    assert list(storage.read_ranges(path, ranges)) == [b"012", b"3456", b"01234", b"89"]
    with pytest.raises(OSError, match=f"{path} is cut short: 2 of 5 bytes at offset 98"):
        list(storage.read_ranges(path, [(98, 5)]))


def test_ranges_close_enough_are_fetched_in_one_request(tmp_path, monkeypatch):
    path = str(tmp_path / "archive")
    data = bytes(range(256)) * 40
    with storage.open_write(path) as f:
        f.write(data)
    fetched = []
    fetch = storage.RangeReader.fetch
    monkeypatch.setattr(
        storage.RangeReader, "fetch", lambda self, at, n: fetched.append((at, n)) or fetch(self, at, n)
    )
    # Gaps of at most 1/16 of the next range are read along (10 <= 200 / 16); larger ones are not (90 > 50 / 16);
    # a range before the last one's end starts a new request.
    ranges = [(0, 100), (110, 200), (400, 50), (100, 10)]
    with storage.RangeReader(path) as reader:
        assert reader.read(ranges, max_gap=1 / 16) == [data[at : at + n] for at, n in ranges]
    assert fetched == [(0, 310), (400, 50), (100, 10)]
    fetched.clear()
    with storage.RangeReader(path) as reader:  # without a gap allowance, only ranges that touch are joined
        assert reader.read([(0, 100), (100, 5), (110, 200)]) == [data[:100], data[100:105], data[110:310]]
    assert fetched == [(0, 105), (110, 200)]


def test_list_dir_and_remove_tree(tmp_path):
    root = str(tmp_path / "root")
    for name in ("b/x.JPEG", "b/c/y.JPEG", "a.txt"):
        storage.write_text(storage.join(root, name), name)
    assert storage.list_dir(root) == [("a.txt", False), ("b", True)]
    assert storage.dirname("gs://bucket/a/manifest.json") == "gs://bucket/a"
    assert storage.remove_tree(root) == 3
    assert not storage.exists(root) and storage.remove_tree(root) == 0


def test_a_window_reads_only_its_bytes_and_seeks_within_them(tmp_path):
    path = str(tmp_path / "archive")
    storage.write_text(path, "".join(chr(ord("a") + i % 26) for i in range(1000)))
    with storage.open_window(path, 100, 50, buffer_size=16) as f:
        assert f.read(5) == b"wxyza"
        f.seek(45)
        assert f.read(100) == b"pqrst"  # clamped to the window's end
        assert f.read(1) == b""
        f.seek(-10, 2)
        assert f.tell() == 40 and f.read(3) == b"klm"
    assert storage.size(path) == 1000
    with pytest.raises(FileNotFoundError, match="no such file"):
        storage.size(str(tmp_path / "missing"))
