"""Where images come from: ILSVRC2012 archives, extracted directories, or a prepared tensorflow-datasets
copy.

Reading is split in two so that no single worker reads the 138 GB training archive end to end:

1. ``plan_units`` turns one input (an archive, a directory, a tfds data dir) into ``WorkUnit``s. For an
   archive it only walks the outer tar's headers (seeking past member data) and records each member's
   offset; for a directory it lists one level.
2. ``read_unit`` is run by any worker on one unit: it opens the archive, seeks to the unit's offsets and
   yields the images of that unit (one inner per-synset tar, or a slice of the flat validation tar).

Everything yields ``InputItem``s; an item that cannot be read or labelled carries an ``error`` instead of
bytes, so that every input is accounted for (nothing is dropped silently).
"""

from __future__ import annotations

import dataclasses
import hashlib
import posixpath
import tarfile
from collections.abc import Iterator

from beam_preprocess import tfrecord
from effnet_common import schema, storage

KIND_TRAIN_ARCHIVE = "train_archive"  # ILSVRC2012_img_train.tar: 1000 inner <wnid>.tar
KIND_VAL_ARCHIVE = "val_archive"  # ILSVRC2012_img_val.tar: flat, labels from the shipped list
KIND_SYNSET_DIR = "synset_dir"  # <split>/<wnid>/*.JPEG
KIND_VAL_DIR = "val_dir"  # val/<wnid>/*.JPEG, or flat val/ILSVRC2012_val_*.JPEG labelled by the shipped list
KIND_TFDS = "tfds"  # <data_dir>/imagenet2012/<version>/imagenet2012-<split>.tfrecord-*

# Unit kinds (what ``read_unit`` reads).
UNIT_INNER_TAR = "inner_tar"
UNIT_TAR_MEMBERS = "tar_members"
UNIT_DIR_FILES = "dir_files"
UNIT_TFRECORD = "tfrecord"
UNIT_FAILED = "failed"  # an input that could not even be planned; read_unit yields its error

TFDS_SPLIT_NAMES = {schema.TRAIN: "train", schema.VALIDATION: "validation"}


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One input of a split, as given on the command line."""

    split: str
    kind: str
    path: str


@dataclasses.dataclass(frozen=True)
class WorkUnit:
    """A piece of input one worker reads on its own."""

    split: str
    kind: str
    path: str
    offset: int = 0
    size: int = 0
    synset: str | None = None
    # (name, offset, size) of tar members, or (file path, 0, 0) of directory files.
    members: tuple[tuple[str, int, int], ...] = ()
    error: str | None = None

    @property
    def unit_id(self) -> str:
        key = f"{self.split}|{self.kind}|{self.path}|{self.offset}|{self.synset}|{self.members[:1]}"
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    @property
    def description(self) -> str:
        if self.kind == UNIT_INNER_TAR:
            return f"{self.path}[{self.synset}.tar]"
        if self.kind == UNIT_TAR_MEMBERS:
            return f"{self.path}[{len(self.members)} members from {self.members[0][0]}]"
        return self.path


@dataclasses.dataclass(frozen=True)
class InputItem:
    """One image as read (``data``), or the reason it could not be read (``error``)."""

    split: str
    source: str  # where it came from, for error messages: archive[member] or a path
    filename: str  # basename recorded in image/filename
    synset: str | None
    data: bytes | None = None
    error: str | None = None
    # Where ``data`` sits in the unit's file (``WorkUnit.path``) when it is exactly those bytes (a tar
    # member), so that a shard writer can read it again from there; None otherwise.
    at: int | None = None


def unsafe_member_reason(name: str) -> str | None:
    """Why a tar member name is refused (absolute, or escaping with ``..``), or None when it is safe."""
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return "absolute member path would escape the output directory"
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        return "member path with '..' would escape the output directory"
    return None


# Planning reads only tar headers. The training archive's members are inner tars of about 140 MB: reading
# 64 KiB at each header skips them. The validation archive's members (about 130 KB each) sit so close together
# that reading it end to end with the usual large buffers is faster than one small request per header.
HEADER_BUFFER_BYTES = {KIND_TRAIN_ARCHIVE: 64 * 2**10}


def _index_tar(path: str, kind: str) -> Iterator[tuple[tarfile.TarInfo, int]]:
    """Members of an uncompressed tar with their data offsets, reading headers only (member data is
    skipped)."""
    buffer_size = HEADER_BUFFER_BYTES.get(kind)
    opened = (
        storage.open_window(path, 0, storage.size(path), buffer_size)
        if buffer_size
        else storage.open_read(path)
    )
    with opened as f, tarfile.open(fileobj=f, mode="r:") as tar:
        while True:
            member = tar.next()
            if member is None:
                break
            yield member, member.offset_data
        stopped = _stopped_early(tar, f)
    if stopped:
        raise tarfile.ReadError(stopped)


def _stopped_early(tar: tarfile.TarFile, f) -> str | None:
    """Why ``tar`` ended before its end-of-archive blocks, or None when it reached them (or the end of data).

    Past its first member, tarfile takes a header it cannot read (a bad checksum, garbage) for the end of
    the archive and returns no more members: without this check every member after it would be lost
    without a word.
    """
    f.seek(tar.offset)
    block = f.read(_BLOCK)
    if not block or block.count(0) == len(block):
        return None
    return f"unreadable tar header at byte {tar.offset}: the members after it cannot be read"


def plan_units(spec: InputSpec, members_per_unit: int = 1000) -> Iterator[WorkUnit]:
    """Splits one input into work units (headers and directory listings only, no image data)."""
    try:
        yield from _plan_units(spec, members_per_unit)
    except (OSError, tarfile.TarError, EOFError) as e:
        yield WorkUnit(spec.split, UNIT_FAILED, spec.path, error=f"cannot read {spec.kind}: {e}")


def _plan_units(spec: InputSpec, members_per_unit: int) -> Iterator[WorkUnit]:
    if spec.kind == KIND_TRAIN_ARCHIVE:
        for member, offset in _index_tar(spec.path, spec.kind):
            yield _plan_inner_tar(spec, member, offset)
    elif spec.kind == KIND_VAL_ARCHIVE:
        batch: list[tuple[str, int, int]] = []
        stopped = None
        try:
            for member, offset in _index_tar(spec.path, spec.kind):
                if member.isdir():
                    continue
                if not member.isfile():
                    yield WorkUnit(
                        spec.split, UNIT_FAILED, f"{spec.path}[{member.name}]", error="not a regular file"
                    )
                    continue
                batch.append((member.name, offset, member.size))
                if len(batch) == members_per_unit:
                    yield WorkUnit(spec.split, UNIT_TAR_MEMBERS, spec.path, members=tuple(batch))
                    batch = []
        except tarfile.ReadError as e:  # the members indexed before it are planned all the same
            stopped = e
        if batch:
            yield WorkUnit(spec.split, UNIT_TAR_MEMBERS, spec.path, members=tuple(batch))
        if stopped:
            raise stopped
    elif spec.kind in (KIND_SYNSET_DIR, KIND_VAL_DIR):
        entries = storage.list_dir(spec.path)
        if spec.kind == KIND_VAL_DIR and not any(is_dir for _, is_dir in entries):
            names = [name for name, _ in entries]
            for start in range(0, len(names), members_per_unit):
                chunk = tuple(
                    (storage.join(spec.path, n), 0, 0) for n in names[start : start + members_per_unit]
                )
                yield WorkUnit(spec.split, UNIT_DIR_FILES, spec.path, members=chunk)
            return
        for name, is_dir in entries:
            full = storage.join(spec.path, name)
            if not is_dir:
                yield WorkUnit(
                    spec.split, UNIT_FAILED, full, error="a file where a <wnid>/ directory was expected"
                )
            elif name not in schema.synset_to_label():
                yield WorkUnit(
                    spec.split, UNIT_FAILED, full, error=f"'{name}' is not a known ILSVRC2012 synset"
                )
            else:
                yield WorkUnit(spec.split, UNIT_DIR_FILES, full, synset=name)
    elif spec.kind == KIND_TFDS:
        for path in tfds_record_files(spec.path, spec.split):
            yield WorkUnit(spec.split, UNIT_TFRECORD, path)
    else:
        raise ValueError(f"unknown input kind {spec.kind!r}")


def _plan_inner_tar(spec: InputSpec, member: tarfile.TarInfo, offset: int) -> WorkUnit:
    where = f"{spec.path}[{member.name}]"
    if not member.isfile():
        return WorkUnit(spec.split, UNIT_FAILED, where, error="not a regular file (expected <wnid>.tar)")
    unsafe = unsafe_member_reason(member.name)
    if unsafe:
        return WorkUnit(spec.split, UNIT_FAILED, where, error=unsafe)
    base = posixpath.basename(member.name)
    synset = base[: -len(".tar")] if base.endswith(".tar") else None
    if synset is None or synset not in schema.synset_to_label():
        return WorkUnit(
            spec.split, UNIT_FAILED, where, error=f"'{base}' is not <known ILSVRC2012 synset>.tar"
        )
    return WorkUnit(spec.split, UNIT_INNER_TAR, spec.path, offset=offset, size=member.size, synset=synset)


def tfds_record_files(data_dir: str, split: str) -> list[str]:
    """The TFRecord files of a prepared tensorflow-datasets ``imagenet2012`` (newest version) for
    ``split``."""
    root = storage.join(data_dir, "imagenet2012")
    try:
        entries = storage.list_dir(root)
    except OSError:
        raise OSError(
            f"{root} does not exist: is {data_dir} a tensorflow-datasets data_dir holding imagenet2012?"
        ) from None
    versions = sorted(
        (name for name, is_dir in entries if is_dir and name.replace(".", "").isdigit()),
        key=lambda v: tuple(int(x) for x in v.split(".")),
    )
    if not versions:
        raise OSError(f"{root} holds no prepared version")
    pattern = storage.join(root, versions[-1], f"imagenet2012-{TFDS_SPLIT_NAMES[split]}.tfrecord-*")
    files = storage.glob(pattern)
    if not files:
        raise OSError(f"no files match {pattern}")
    return files


def read_unit(unit: WorkUnit) -> Iterator[InputItem]:
    """The images of one work unit, each either with its bytes or with the reason it could not be read."""
    if unit.kind == UNIT_FAILED:
        yield InputItem(unit.split, unit.path, posixpath.basename(unit.path), None, error=unit.error)
    elif unit.kind == UNIT_INNER_TAR:
        yield from _read_inner_tar(unit)
    elif unit.kind == UNIT_TAR_MEMBERS:
        yield from _read_tar_members(unit)
    elif unit.kind == UNIT_DIR_FILES:
        yield from _read_dir_files(unit)
    elif unit.kind == UNIT_TFRECORD:
        yield from _read_tfds_records(unit)
    else:
        raise ValueError(f"unknown unit kind {unit.kind!r}")


def _read_inner_tar(unit: WorkUnit) -> Iterator[InputItem]:
    """The members of one per-synset inner tar: plain file headers read directly, anything else by tarfile."""
    outer = f"{unit.path}[{unit.synset}.tar]"
    with storage.open_window(unit.path, unit.offset, unit.size) as f:
        yield from _read_plain_members(unit, f, outer)
        yield from _read_inner_tar_with_tarfile(unit, f, outer)


_BLOCK = 512
_PLAIN_FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE)


def _plain_file_header(header: bytes) -> tuple[str, int] | None:
    """(name, size) when ``header`` is a regular file's ustar/GNU header with nothing unusual, else None.

    Parsing a header with ``tarfile`` costs a third of reading an ImageNet image (docs/performance.md,
    'Sharding'); this reads the same fields for the one case every ILSVRC2012 member is. Anything else (pax
    and GNU long-name headers, links, directories, sparse files, base-256 sizes, a checksum only the signed
    sum matches, the end of the archive, a short block) returns None and is left to ``tarfile``.
    """
    if len(header) != _BLOCK or header[156:157] not in _PLAIN_FILE_TYPES or header[124] & 0x80:
        return None
    try:
        stored_checksum = int(header[148:156].split(b"\0", 1)[0].strip() or b"0", 8)
        size = int(header[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        return None
    if stored_checksum != 256 + sum(header[:148]) + sum(header[156:]):  # tarfile's unsigned checksum
        return None
    name = header[:100].split(b"\0", 1)[0].decode(tarfile.ENCODING, "surrogateescape")
    if header[156:157] == tarfile.AREGTYPE and name.endswith("/"):
        return None  # the old V7 way of writing a directory
    prefix = header[345:500].split(b"\0", 1)[0]
    if prefix:  # a ustar long name, joined as tarfile joins it
        name = prefix.decode(tarfile.ENCODING, "surrogateescape") + "/" + name
    return name, size


def _read_plain_members(unit: WorkUnit, f, outer: str) -> Iterator[InputItem]:
    """Members read straight from their headers, until one needs ``tarfile``; ``f`` is left at that header."""
    while True:
        at = f.tell()
        plain = _plain_file_header(f.read(_BLOCK))
        if plain is None:
            f.seek(at)
            return
        name, size = plain
        data_at = f.tell()
        data = f.read(size)
        padding = -size % _BLOCK
        if len(data) != size or len(f.read(padding)) != padding:
            f.seek(at)  # cut short: tarfile reads this member again and reports the error
            return
        base = posixpath.basename(name)
        unsafe = unsafe_member_reason(name)
        if unsafe:
            yield InputItem(unit.split, f"{outer}/{name}", base, unit.synset, error=unsafe)
        else:
            yield InputItem(
                unit.split, f"{outer}/{name}", base, unit.synset, data=data, at=unit.offset + data_at
            )


def _read_inner_tar_with_tarfile(unit: WorkUnit, f, outer: str) -> Iterator[InputItem]:
    """The members from ``f``'s position on, read by ``tarfile`` (which starts at the current position)."""
    try:
        with tarfile.open(fileobj=f, mode="r:") as tar:
            while True:
                try:
                    member = tar.next()
                except (tarfile.TarError, OSError, EOFError) as e:
                    yield InputItem(
                        unit.split, outer, f"{unit.synset}.tar", unit.synset, error=f"corrupt tar: {e}"
                    )
                    return
                if member is None:
                    break
                yield _tar_member_item(unit, tar, member, outer, unit.synset)
            stopped = _stopped_early(tar, f)
            if stopped:
                yield InputItem(
                    unit.split, outer, f"{unit.synset}.tar", unit.synset, error=f"corrupt tar: {stopped}"
                )
    except (tarfile.TarError, OSError, EOFError) as e:
        yield InputItem(unit.split, outer, f"{unit.synset}.tar", unit.synset, error=f"unreadable tar: {e}")


def _tar_member_item(unit: WorkUnit, tar: tarfile.TarFile, member, where: str, synset: str | None):
    source = f"{where}/{member.name}"
    name = posixpath.basename(member.name)
    unsafe = unsafe_member_reason(member.name)
    if unsafe:
        return InputItem(unit.split, source, name, synset, error=unsafe)
    if not member.isfile():
        return InputItem(unit.split, source, name, synset, error="not a regular file")
    at = None
    try:
        if member.issparse():
            data = tar.extractfile(member).read()
        else:  # a plain member is its bytes at offset_data: read without tarfile's file object per member
            tar.fileobj.seek(member.offset_data)
            data = tar.fileobj.read(member.size)
            at = unit.offset + member.offset_data  # tarfile's offsets are positions in the unit's window
    except (tarfile.TarError, OSError, EOFError) as e:
        return InputItem(unit.split, source, name, synset, error=f"unreadable member: {e}")
    if len(data) != member.size:
        return InputItem(unit.split, source, name, synset, error="archive member is cut short")
    return InputItem(unit.split, source, name, synset, data=data, at=at)


def _val_synset(name: str) -> tuple[str | None, str | None]:
    synset = schema.validation_synset_for(name)
    if synset is None:
        return None, f"'{name}' is not an ILSVRC2012 validation file name: its label is unknown"
    return synset, None


def _read_tar_members(unit: WorkUnit) -> Iterator[InputItem]:
    start = min(offset for _, offset, _ in unit.members)
    end = max(offset + size for _, offset, size in unit.members)
    with storage.open_window(unit.path, start, end - start) as f:
        for name, offset, size in unit.members:
            source = f"{unit.path}[{name}]"
            base = posixpath.basename(name)
            unsafe = unsafe_member_reason(name)
            synset, error = _val_synset(base)
            if unsafe or error:
                yield InputItem(unit.split, source, base, synset, error=unsafe or error)
                continue
            try:
                f.seek(offset - start)
                data = f.read(size)
            except OSError as e:
                yield InputItem(unit.split, source, base, synset, error=f"unreadable member: {e}")
                continue
            if len(data) != size:
                yield InputItem(unit.split, source, base, synset, error="archive member is cut short")
            else:
                yield InputItem(unit.split, source, base, synset, data=data, at=offset)


def _read_dir_files(unit: WorkUnit) -> Iterator[InputItem]:
    if unit.synset is not None:  # <split>/<wnid>/ directory: list it here, on the worker
        try:
            entries = storage.list_dir(unit.path)
        except OSError as e:
            yield InputItem(unit.split, unit.path, unit.synset, unit.synset, error=f"cannot list: {e}")
            return
        paths = []
        for name, is_dir in entries:
            if is_dir:
                full = storage.join(unit.path, name)
                yield InputItem(
                    unit.split, full, name, unit.synset, error="unexpected directory inside a synset dir"
                )
            else:
                paths.append(storage.join(unit.path, name))
    else:
        paths = [path for path, _, _ in unit.members]
    for path in paths:
        base = posixpath.basename(path.replace("\\", "/"))
        synset, error = (unit.synset, None) if unit.synset is not None else _val_synset(base)
        if error:
            yield InputItem(unit.split, path, base, synset, error=error)
            continue
        try:
            with storage.open_read(path) as f:
                data = f.read()
        except OSError as e:
            yield InputItem(unit.split, path, base, synset, error=f"unreadable file: {e}")
            continue
        yield InputItem(unit.split, path, base, synset, data=data)


def _read_tfds_records(unit: WorkUnit) -> Iterator[InputItem]:
    synsets = schema.synsets()
    try:
        with storage.open_read(unit.path) as f:
            for i, record in enumerate(tfrecord.read_records(f)):
                source = f"{unit.path}[record {i}]"
                try:
                    feature = tfrecord.decode_example(record)
                    data = feature["image"][0]
                    label = feature["label"][0]
                    name = feature["file_name"][0].decode()
                except (KeyError, IndexError, UnicodeDecodeError, ValueError) as e:
                    yield InputItem(
                        unit.split, source, f"record-{i}", None, error=f"not a tfds imagenet2012 record: {e}"
                    )
                    continue
                if not 0 <= label < len(synsets):
                    yield InputItem(unit.split, source, name, None, error=f"label {label} is outside 0..999")
                    continue
                yield InputItem(unit.split, f"{unit.path}[{name}]", name, synsets[label], data=data)
    except OSError as e:
        yield InputItem(
            unit.split, unit.path, posixpath.basename(unit.path), None, error=f"corrupt TFRecord: {e}"
        )
