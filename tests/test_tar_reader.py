"""The inner-tar reader's direct header path gives exactly what tarfile gives, for every tar it may meet."""

import io
import tarfile

import pytest

from beam_preprocess import sources
from effnet_common import storage

SYNSET = "n01440764"


def _tar(members, tar_format):
    """An uncompressed tar of ``members``: (name, bytes) files, or ready TarInfo objects (dirs, links)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tar_format) as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
            else:
                name, data = member
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _items(path, size, reader):
    unit = sources.WorkUnit("train", sources.UNIT_INNER_TAR, path, offset=0, size=size, synset=SYNSET)
    if reader == "direct":
        return list(sources.read_unit(unit))
    with storage.open_window(path, 0, size) as f:  # tarfile only, from the first header: the reference
        return list(sources._read_inner_tar_with_tarfile(unit, f, f"{path}[{SYNSET}.tar]"))


def _images(count, start=0):
    return [(f"{SYNSET}_{i}.JPEG", bytes([i % 251]) * (100 + 700 * i)) for i in range(start, start + count)]


def _special_members():
    directory = tarfile.TarInfo("adir")
    directory.type = tarfile.DIRTYPE
    link = tarfile.TarInfo("alink.JPEG")
    link.type = tarfile.SYMTYPE
    link.linkname = f"{SYNSET}_0.JPEG"
    return [
        *_images(3),
        ("x" * 120 + ".JPEG", b"long name"),  # GNU: an 'L' header; PAX: an 'x' header
        ("some/dir/" + "y" * 90 + ".JPEG", b"ustar prefix"),  # fits the ustar prefix field
        directory,
        link,
        ("../escape.JPEG", b"unsafe"),
        (f"{SYNSET}_empty.JPEG", b""),
        *_images(2, start=3),
    ]


@pytest.mark.parametrize("tar_format", [tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT, tarfile.PAX_FORMAT])
@pytest.mark.parametrize(
    "damage",
    ["none", "cut in a member's data", "cut in a member's padding", "bad checksum in the 3rd header",
     "bad checksum in the 1st header", "empty"],
)  # fmt: skip
def test_direct_reading_equals_tarfile(tmp_path, tar_format, damage):
    members = _special_members()
    if tar_format == tarfile.USTAR_FORMAT:  # ustar has no way to store a 120-character name
        members = [m for m in members if isinstance(m, tarfile.TarInfo) or len(m[0]) < 120]
    data = _tar(members, tar_format)
    if damage == "cut in a member's data":
        data = data[: 512 * 3 + 300]
    elif damage == "cut in a member's padding":
        data = data[: 512 + 100 + 50]  # first header, first member's 100 bytes, part of its padding
    elif damage.startswith("bad checksum"):
        headers = [0]
        for info in tarfile.open(fileobj=io.BytesIO(data)).getmembers():
            headers.append(info.offset_data + -(-info.size // 512) * 512)
        at = headers[2] if "3rd" in damage else 0
        data = data[: at + 148] + b"0000000\0" + data[at + 156 :]
    elif damage == "empty":
        data = b""
    path = tmp_path / "inner.tar"
    path.write_bytes(data)
    direct, reference = _items(str(path), len(data), "direct"), _items(str(path), len(data), "tarfile")
    assert direct == reference
    if damage == "none":
        assert len([i for i in direct if i.data is not None]) >= 7  # the test reads real members


def test_every_plain_member_takes_the_direct_path(tmp_path, monkeypatch):
    data = _tar(_images(20), tarfile.GNU_FORMAT)
    path = tmp_path / "inner.tar"
    path.write_bytes(data)

    def tarfile_must_only_see_the_end(unit, f, outer):
        assert f.read(1024) == b"\0" * 1024  # the two zero blocks that end the archive
        return iter(())

    monkeypatch.setattr(sources, "_read_inner_tar_with_tarfile", tarfile_must_only_see_the_end)
    items = _items(str(path), len(data), "direct")
    assert [i.filename for i in items] == [name for name, _ in _images(20)]
    assert [i.data for i in items] == [payload for _, payload in _images(20)]


def _corrupt_header(data: bytes, index: int) -> bytes:
    """``data`` with the checksum of its ``index``-th header (0-based) overwritten."""
    at = 0
    for info in tarfile.open(fileobj=io.BytesIO(data)).getmembers()[:index]:
        at = info.offset_data + -(-info.size // 512) * 512
    return data[: at + 148] + b"0000000\0" + data[at + 156 :]


def test_a_corrupt_header_midway_is_a_failure_not_a_silent_end(tmp_path):
    # tarfile ends an archive quietly at an unreadable header past the first: the members after it would
    # be lost without a word.
    data = _corrupt_header(_tar(_images(5), tarfile.GNU_FORMAT), 2)
    path = tmp_path / "inner.tar"
    path.write_bytes(data)
    items = _items(str(path), len(data), "direct")
    assert [i.filename for i in items if i.data is not None] == [name for name, _ in _images(2)]
    assert items[-1].data is None and items[-1].error.startswith("corrupt tar: unreadable tar header at byte")


def test_planning_reports_a_corrupt_header_in_the_validation_archive(tmp_path):
    names = [f"ILSVRC2012_val_{i:08d}.JPEG" for i in range(1, 6)]
    data = _corrupt_header(_tar([(name, b"jpeg") for name in names], tarfile.GNU_FORMAT), 3)
    path = tmp_path / "ILSVRC2012_img_val.tar"
    path.write_bytes(data)
    spec = sources.InputSpec("validation", sources.KIND_VAL_ARCHIVE, str(path))
    units = list(sources.plan_units(spec, members_per_unit=2))
    planned = [name for unit in units for name, _, _ in unit.members]
    assert planned == names[:3]
    assert units[-1].kind == sources.UNIT_FAILED and "unreadable tar header" in units[-1].error
