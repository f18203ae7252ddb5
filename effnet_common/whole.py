"""Writing a file whole: one rule for every file system, whichever library opens it.

A reader, or a run killed half-way, must never see half a file. On a local disk the file is written under
``path + TEMPORARY_SUFFIX`` and renamed over ``path`` (atomic), and the temporary file is removed if the
write fails (or the command is stopped by Ctrl-C). On an object store the object appears whole when its
single upload completes, and a rename would be a copy plus a delete, so the object is written once under its
final name.

Two backends use it: ``effnet_common.storage`` (Beam's ``FileSystems``, for the sharding stage) and
``trainer_module.files`` (``tf.io.gfile``, for the trainer, which does not import Beam). Each passes the four
file operations of its library (``Backend``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import BinaryIO

from effnet_common import stopping

TEMPORARY_SUFFIX = ".inprogress"


def is_local(path: str) -> bool:
    """Whether ``path`` is on the local disk: no ``scheme://`` prefix (``file://`` counts as local)."""
    return "://" not in path or path.startswith("file://")


@dataclasses.dataclass(frozen=True)
class Backend:
    """A file library's operations: ``create`` opens a binary file for writing (creating the parent
    directories, replacing an existing file), ``rename`` moves over an existing file."""

    create: Callable[[str], contextlib.AbstractContextManager[BinaryIO]]
    rename: Callable[[str, str], None]
    exists: Callable[[str], bool]
    delete: Callable[[str], None]


@contextlib.contextmanager
def write(path: str, backend: Backend) -> Iterator[BinaryIO]:
    """A binary file object whose contents appear at ``path`` whole, and only if the block exits normally."""
    if not is_local(path):
        with backend.create(path) as f:
            yield f
        return
    temporary = path + TEMPORARY_SUFFIX

    def remove_temporary() -> None:
        if backend.exists(temporary):
            backend.delete(temporary)

    try:
        # Ctrl-C ends a command without unwinding this block (``effnet_common.stopping``): it removes the
        # file.
        with stopping.cleanup(remove_temporary):
            with backend.create(temporary) as f:
                yield f
            backend.rename(temporary, path)
    except BaseException:
        remove_temporary()
        raise
