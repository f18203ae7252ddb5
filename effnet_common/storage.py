"""Every user path goes through Beam's ``FileSystems``: local disks, ``gs://`` and any other Beam file
system. What Beam's API does not offer is done here per file system, and only here:

- **Whole-object writes** (``effnet_common.whole``, the rule the trainer's files follow too).
- **Exact range reads.** ``FileSystems.open`` on ``gs://`` buffers 16 MiB per read miss, so reading one
  record of a spill object, or one inner tar, would fetch up to 16 MiB more. ``RangeReader`` and
  ``open_window`` ask GCS for exactly the bytes wanted, through Beam's own GCS client (the same credentials
  and endpoint, ``STORAGE_EMULATOR_HOST`` included).
- **Listing one directory level** (Beam lists recursively): a delimiter listing on GCS, ``os.scandir`` on a
  local disk.
- **Local files without Beam.** A path without a scheme is read and written as Beam's ``LocalFileSystem``
  does, without importing Beam, which would cost every sharding worker process seconds of CPU before its
  first image (``beam_preprocess.processes``). Other schemes, ``file://`` included, go through Beam.

Beam is imported on first use only: the trainer reads manifests through this module and needs no Beam.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import mmap
import os
import posixpath
import shutil
import threading
from collections.abc import Iterable, Iterator

from effnet_common import whole


def _filesystems():
    from apache_beam.io.filesystems import FileSystems

    return FileSystems


is_local = whole.is_local  # no scheme, or file://


def is_gcs(path: str) -> bool:
    return path.startswith("gs://")


def join(directory: str, *names: str) -> str:
    if "://" in directory:
        return posixpath.join(directory, *names)
    return os.path.join(directory, *names)


def dirname(path: str) -> str:
    if "://" in path:
        scheme, rest = path.split("://", 1)
        return f"{scheme}://{posixpath.dirname(rest)}"
    return os.path.dirname(path)


def _plain_local(path: str) -> bool:
    """A path of the local disk given without a scheme (``file://`` paths are left to Beam)."""
    return "://" not in path


def open_read(path: str):
    """A binary file object for sequential reading (buffered reads on object stores)."""
    if _plain_local(path):
        return open(path, "rb")  # noqa: SIM115 - the caller closes it, as Beam's
    return _filesystems().open(path, compression_type="uncompressed")


def _create_local(path: str):
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    return open(path, "wb")  # noqa: SIM115 - the caller closes it, as Beam's


def _delete_local(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


# Beam's LocalFileSystem's operations, done here without importing Beam.
_LOCAL_BACKEND = whole.Backend(
    create=_create_local,
    rename=os.replace,
    exists=os.path.exists,
    delete=_delete_local,
)


@functools.cache
def _whole_backend() -> whole.Backend:
    fs = _filesystems()
    return whole.Backend(
        create=lambda path: fs.create(
            path, compression_type="uncompressed"
        ),  # creates the parent directories
        rename=lambda source, target: fs.rename([source], [target]),
        exists=fs.exists,
        delete=lambda path: fs.delete([path]),
    )


def open_write(path: str):
    """A binary file object whose contents appear at ``path`` whole, and only if the block exits normally
    (``effnet_common.whole``)."""
    return whole.write(path, _LOCAL_BACKEND if _plain_local(path) else _whole_backend())


# Adjacent ranges are fetched in one request, up to this size: one GET for a run of consecutive records.
MAX_REQUEST_BYTES = 4 * 2**20


@dataclasses.dataclass
class Request:
    """One read of ``size`` bytes at ``start`` of ``path`` that serves several wanted ranges."""

    path: str
    start: int
    size: int
    pieces: list[tuple[int, int]]  # (offset in the request's bytes, length) of each wanted range, in order
    items: list  # what each range was wanted for, in order

    def split(self, data: bytes) -> list[bytes]:
        """The bytes of each wanted range, out of the request's ``data``."""
        return [data[at : at + length] for at, length in self.pieces]


def plan_requests(wanted: Iterable[tuple[object, str, int, int]], max_gap: float = 0.0) -> Iterator[Request]:
    """The requests that read ``(item, path, offset, length)`` ranges, in the order wanted.

    Consecutive ranges of one file are read in one request when each starts where the previous one ended or
    after a gap of at most ``max_gap`` times its own length (the gap's bytes are read and dropped: 1/16 reads
    tar members in one request at the price of their headers), up to ``MAX_REQUEST_BYTES``.
    """
    run: Request | None = None
    for item, path, offset, length in wanted:
        if run is not None:
            gap, size = offset - (run.start + run.size), offset + length - run.start
            if path == run.path and 0 <= gap <= max_gap * length and size <= MAX_REQUEST_BYTES:
                run.pieces.append((offset - run.start, length))
                run.items.append(item)
                run.size = size
                continue
            yield run
        run = Request(path, offset, length, [(0, length)], [item])
    if run is not None:
        yield run


# Reads in flight at once for a shard writer whose files are on an object store: enough to hide a GCS
# request's latency (far longer than transferring an ImageNet image) without holding much memory
# (docs/performance.md, 'Sharding': requests in flight on GCS).
OBJECT_STORE_READ_THREADS = 8


def read_threads(paths) -> int:
    """Threads worth reading ``paths`` on: 1 when all are on local disks, else
    ``OBJECT_STORE_READ_THREADS``."""
    one_per_scheme = {path.split("://", 1)[0] if "://" in path else "": path for path in paths}
    return 1 if all(is_local(path) for path in one_per_scheme.values()) else OBJECT_STORE_READ_THREADS


class RangeReader:
    """Reads byte ranges of one file, fetching no more than asked for (see the module doc); thread-safe.

    Adjacent ranges are fetched together; on a local disk the file stays open between ``read`` calls.
    """

    def __init__(self, path: str):
        self.path = path
        self._file = None
        self._blob = None
        self._seek_lock = threading.Lock()  # one seek-and-read at a time on a file; GCS requests need none
        if is_gcs(path):
            from apache_beam.io.gcp import gcsio

            bucket_name, blob_name = gcsio.parse_gcs_path(path)
            self._blob = _gcs_client().bucket(bucket_name).blob(blob_name)
        else:
            self._file = open_read(path)

    def __enter__(self) -> RangeReader:
        return self

    def __exit__(self, *exc) -> None:
        if self._file is not None:
            self._file.close()

    def read(self, ranges: list[tuple[int, int]], max_gap: float = 0.0) -> list[bytes]:
        """The bytes of each ``(offset, length)``, in the order given.

        Ranges that follow each other are fetched in one request, and so are ranges separated by a gap of at
        most ``max_gap`` times the next range's length (the gap's bytes are fetched and dropped): 1/16 reads
        tar members in one request at the price of their headers.
        """
        out = []
        for request in plan_requests(((None, self.path, at, n) for at, n in ranges), max_gap):
            out.extend(request.split(self.fetch(request.start, request.size)))
        return out

    def fetch(self, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset`` (one request on an object store)."""
        if not length:
            return b""
        if self._blob is not None:
            data = self._blob.download_as_bytes(start=offset, end=offset + length - 1, checksum=None)
        else:
            with self._seek_lock:
                self._file.seek(offset)
                data = self._file.read(length)
        if len(data) != length:
            raise OSError(f"{self.path} is cut short: {len(data)} of {length} bytes at offset {offset}")
        return data


class _Window:
    """The position of a reader of ``_size`` bytes: seeking is clamped to the window."""

    _size: int
    _pos: int

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, min(self._size, base + pos))
        return self._pos


class _WindowRaw(_Window, io.RawIOBase):
    """``size`` bytes at ``offset`` of a file as a seekable raw stream; each read fetches exactly what it
    asks."""

    def __init__(self, path: str, offset: int, size: int):
        self._reader, self._offset, self._size, self._pos = RangeReader(path), offset, size, 0

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self._size - self._pos)
        if n <= 0:
            return 0
        buffer[:n] = self._reader.fetch(self._offset + self._pos, n)
        self._pos += n
        return n

    def close(self) -> None:
        if not self.closed:
            self._reader.__exit__(None, None, None)
        super().close()


class _MappedWindow(_Window):
    """``size`` bytes at ``offset`` of a local file, read through a memory map: a read is one copy of the
    bytes asked for, where a buffered window copies each byte three times (file to bytes, bytes to buffer,
    buffer to the result), a noticeable share of the checking stage beside decoding (docs/performance.md)."""

    def __init__(self, mapped: mmap.mmap, offset: int, size: int):
        self._map, self._offset, self._size, self._pos = mapped, offset, size, 0
        self.closed = False

    def __enter__(self) -> _MappedWindow:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def read(self, n: int = -1) -> bytes:
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        data = self._map[self._offset + self._pos : self._offset + end] if end > self._pos else b""
        self._pos = max(self._pos, end)
        return data

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._map.close()


def _mapped_window(path: str, offset: int, size: int) -> _MappedWindow | None:
    """The window through a memory map, or None when the file is shorter than the window or empty (the
    buffered window then reads it and reports it cut short, as on any file system)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < offset + size or not size:
            return None
        return _MappedWindow(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), offset, size)


def open_window(path: str, offset: int, size: int, buffer_size: int = 8 * 2**20):
    """``size`` bytes at ``offset`` of ``path`` as a seekable file object of their own.

    Reads fetch at most ``buffer_size`` bytes at a time and never past the window, so reading a member of an
    archive on GCS costs its bytes, not the rest of a 16 MiB read-ahead; a small ``buffer_size`` suits
    skipping from header to header. A local file (no scheme) is read through a memory map instead.
    """
    if _plain_local(path):
        mapped = _mapped_window(path, offset, size)
        if mapped is not None:
            return mapped
    return io.BufferedReader(_WindowRaw(path, offset, size), buffer_size=buffer_size)


def size(path: str) -> int:
    """The size of one file in bytes."""
    matches = _filesystems().match([path])[0].metadata_list
    if len(matches) != 1:
        raise FileNotFoundError(f"{path}: no such file")
    return matches[0].size_in_bytes


def read_ranges(path: str, ranges: list[tuple[int, int]]) -> list[bytes]:
    """The bytes of each ``(offset, length)`` of ``path`` (one ``RangeReader.read``)."""
    with RangeReader(path) as reader:
        return reader.read(ranges)


@functools.cache
def _gcs_client():
    """Beam's GCS client (its credentials, or anonymous; the emulator when STORAGE_EMULATOR_HOST is set)."""
    from apache_beam.io.gcp import gcsio

    return gcsio.GcsIO().client


def exists(path: str) -> bool:
    return _filesystems().exists(path)


def glob(pattern: str) -> list[str]:
    return sorted(m.path for m in _filesystems().match([pattern])[0].metadata_list)


def remove(paths: list[str]) -> None:
    if paths:
        _filesystems().delete(paths)


def list_tree(directory: str) -> list[str]:
    """Every file under ``directory`` (recursively), sorted; [] when there is none."""
    return glob(directory.rstrip("/") + "/**")


def remove_tree(directory: str) -> int:
    """Deletes everything under ``directory``; returns how many files there were.

    Beam's GCS ``delete`` of ``dir/`` matches ``dir/*``, which does not cross ``/``: objects deeper down would
    stay. The objects are listed recursively and deleted in batches of 100 (GCS's batch limit).
    """
    paths = list_tree(directory)
    if not paths:
        return 0
    if is_local(directory):
        _filesystems().delete([directory])  # recursive on local disks: the directories go too
    elif is_gcs(directory):
        from apache_beam.io.gcp import gcsio

        client = gcsio.GcsIO()
        for start in range(0, len(paths), gcsio.MAX_BATCH_OPERATION_SIZE):
            failed = [
                (p, e)
                for p, e in client.delete_batch(paths[start : start + gcsio.MAX_BATCH_OPERATION_SIZE])
                if e
            ]
            if failed:
                raise OSError(f"could not delete {len(failed)} objects under {directory}, e.g. {failed[0]}")
    else:
        _filesystems().delete(paths)
    return len(paths)


def list_dir(path: str) -> list[tuple[str, bool]]:
    """(name, is_dir) of the entries of one directory, sorted by name."""
    if is_local(path):
        with os.scandir(path) as it:
            return sorted((e.name, e.is_dir()) for e in it)
    if is_gcs(path):
        return _gcs_list_dir(path)
    # Other object stores: one recursive listing, folded to its first level.
    prefix = path.rstrip("/") + "/"
    entries = {}
    for full in glob(prefix + "**"):
        head, sep, _ = full[len(prefix) :].partition("/")
        entries[head] = entries.get(head, False) or bool(sep)
    return sorted(entries.items())


def _gcs_list_dir(path: str) -> list[tuple[str, bool]]:
    from apache_beam.io.gcp import gcsio

    bucket_name, prefix = gcsio.parse_gcs_path(path.rstrip("/") + "/", object_optional=True)
    blobs = _gcs_client().list_blobs(bucket_name, prefix=prefix, delimiter="/")
    files = [(blob.name[len(prefix) :], False) for blob in blobs if blob.name != prefix]
    dirs = [(p[len(prefix) :].rstrip("/"), True) for p in blobs.prefixes]  # known once the pages are read
    if not files and not dirs:
        raise FileNotFoundError(f"{path}: no such directory (no object has this prefix)")
    return sorted(files + dirs)


def read_text(path: str) -> str:
    with open_read(path) as f:
        return f.read().decode("utf-8")


def write_text(path: str, text: str) -> None:
    with open_write(path) as f:
        f.write(text.encode("utf-8"))
