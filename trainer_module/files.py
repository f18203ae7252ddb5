"""Reading and writing the run's small files through ``tf.io.gfile``, on any filesystem TensorFlow knows.

Model directories are local on a laptop and ``gs://`` on Vertex (``ram://`` in tests). Two rules follow:

- every path goes through ``tf.io.gfile``, never ``open`` or ``os.path`` calls that touch the filesystem;
- a file is written whole, by the rule every stage follows (``effnet_common.whole``).
"""

from __future__ import annotations

import json
import os
import posixpath

import tensorflow as tf

from effnet_common import whole

# TensorFlow's in-memory filesystem appends where "w" should truncate (seen with TF 2.16): remove first there.
# Object stores (gs://, s3://) replace the object, atomically, and need no removal.
APPENDING_SCHEMES = ("ram://",)


is_local = whole.is_local


def join(directory: str, *names: str) -> str:
    """``directory/name/...`` for local paths and URLs alike (URLs keep their ``//``)."""
    return posixpath.join(directory, *names)


def dirname(path: str) -> str:
    """The directory of ``path`` (a URL's up to its last '/')."""
    if "://" in path:
        return path.rstrip("/").rsplit("/", 1)[0]
    return os.path.dirname(path.rstrip("/"))


def _create(path: str):
    parent = posixpath.dirname(path)
    if parent:
        tf.io.gfile.makedirs(parent)
    if path.startswith(APPENDING_SCHEMES) and tf.io.gfile.exists(path):
        tf.io.gfile.remove(path)
    return tf.io.gfile.GFile(path, "wb")


_BACKEND = whole.Backend(
    create=_create,
    rename=lambda source, target: tf.io.gfile.rename(source, target, overwrite=True),
    exists=tf.io.gfile.exists,
    delete=tf.io.gfile.remove,
)


def write_bytes(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` whole (``effnet_common.whole``), creating the parent directory."""
    with whole.write(path, _BACKEND) as f:
        f.write(data)


def write_text(path: str, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str, value) -> None:
    write_text(path, json.dumps(value, indent=2, default=str) + "\n")


def read_text(path: str) -> str:
    with tf.io.gfile.GFile(path, "r") as f:
        return f.read()


def read_bytes(path: str) -> bytes:
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read()


def read_json(path: str):
    return json.loads(read_text(path))


def exists(path: str) -> bool:
    return tf.io.gfile.exists(path)


def copy_tree(source: str, destination: str, skip: tuple[str, ...] = ()) -> None:
    """Copies every file under ``source`` to the same place under ``destination``, each written whole; the
    top-level entries named in ``skip`` are left out."""
    for directory, _, names in tf.io.gfile.walk(source):
        relative = directory[len(source) :].strip("/")
        if relative.split("/")[0] in skip:
            continue
        for name in names:
            if not relative and name in skip:
                continue
            with tf.io.gfile.GFile(join(directory, name), "rb") as f:
                write_bytes(join(destination, relative, name), f.read())


def remove_tree(path: str) -> None:
    """Removes ``path`` and everything under it, if it exists."""
    if tf.io.gfile.exists(path):
        tf.io.gfile.rmtree(path)


def glob(pattern: str) -> list[str]:
    return tf.io.gfile.glob(pattern)


def read_first_byte(path: str) -> bytes:
    """The first byte of ``path`` (a check that it can be read, without fetching more of an object)."""
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read(1)


def make_directory(path: str) -> None:
    """Creates ``path`` and its parents; NotADirectoryError when something else is there."""
    tf.io.gfile.makedirs(path)
    if not tf.io.gfile.isdir(path):
        raise NotADirectoryError(path)


# What tf.io.gfile raises for a path it cannot use (missing, refused, unknown scheme).
Error = tf.errors.OpError
