"""File access for local paths and any Beam filesystem (gs:// on Dataflow), without importing TensorFlow.

Local paths use the standard library (fast, no extra imports); paths with a scheme go through Beam's
``FileSystems``. Listing one directory level of an object store needs delimiter listing, which Beam does not
offer: that one call uses tf.io.gfile, imported only then.
"""

from __future__ import annotations

import glob as local_glob
import os
import posixpath
import shutil


def is_remote(path: str) -> bool:
    return "://" in path


def join(directory: str, name: str) -> str:
    return posixpath.join(directory, name) if is_remote(directory) else os.path.join(directory, name)


def open_read(path: str):
    if is_remote(path):
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.open(path, compression_type="uncompressed")
    return open(path, "rb")


def open_write(path: str):
    if is_remote(path):
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.create(path, compression_type="uncompressed")
    return open(path, "wb")


def makedirs(path: str) -> None:
    if not is_remote(path):  # object stores have no directories to create
        os.makedirs(path, exist_ok=True)


def rename(src: str, dst: str) -> None:
    if is_remote(src):
        from apache_beam.io.filesystems import FileSystems

        if FileSystems.exists(dst):
            FileSystems.delete([dst])
        FileSystems.rename([src], [dst])
    else:
        os.replace(src, dst)


def exists(path: str) -> bool:
    if is_remote(path):
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.exists(path)
    return os.path.exists(path)


def glob(pattern: str) -> list[str]:
    if is_remote(pattern):
        from apache_beam.io.filesystems import FileSystems

        return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
    return sorted(local_glob.glob(pattern))


def remove(paths: list[str]) -> None:
    remote = [p for p in paths if is_remote(p)]
    if remote:
        from apache_beam.io.filesystems import FileSystems

        FileSystems.delete(remote)
    for path in paths:
        if not is_remote(path):
            os.remove(path)


def remove_tree(path: str) -> None:
    if is_remote(path):
        from apache_beam.io.filesystems import FileSystems

        if FileSystems.exists(path.rstrip("/") + "/"):
            FileSystems.delete([path.rstrip("/") + "/"])
    elif os.path.isdir(path):
        shutil.rmtree(path)


def list_dir(path: str) -> list[tuple[str, bool]]:
    """(name, is_dir) of the entries of one directory, sorted by name."""
    if is_remote(path):
        import tensorflow as tf

        # Object stores report sub-directories with a trailing '/': no per-entry stat.
        return sorted((name.rstrip("/"), name.endswith("/")) for name in tf.io.gfile.listdir(path))
    with os.scandir(path) as it:
        return sorted((e.name, e.is_dir()) for e in it)


def read_text(path: str) -> str:
    with open_read(path) as f:
        return f.read().decode("utf-8")


def write_text(path: str, text: str) -> None:
    with open_write(path) as f:
        f.write(text.encode("utf-8"))
