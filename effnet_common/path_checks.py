"""Checks of the paths a person gives, before any work starts: a bad one becomes one ``UsageError`` line
naming the flag (``console.fail`` prints it). Every path goes through Beam's ``FileSystems``
(``effnet_common.storage``): local disks and gs:// alike.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import os

from effnet_common import console, storage


def _reason(error: BaseException) -> str:
    """'Not a directory', 'Permission denied', ... of an OSError, also when Beam wrapped it."""
    details = getattr(error, "exception_details", None)  # BeamIOError: {path: the underlying exception}
    if isinstance(details, dict) and details:
        error = next(iter(details.values()))
    while (
        isinstance(error, OSError)
        and not error.strerror
        and error.args
        and isinstance(error.args[0], BaseException)
    ):
        error = error.args[0]  # Beam's local file system raises IOError(the OSError)
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return console.one_line(error)


def check_file(flag: str, path: str) -> None:
    """``path`` exists, is not empty and its first byte can be read (that byte only: a buffered open of an
    object would fetch megabytes)."""
    try:
        if not storage.exists(path):
            raise console.UsageError(flag, path, "no such file")
        if storage.size(path) == 0:
            raise console.UsageError(flag, path, "is an empty file")
        storage.read_ranges(path, [(0, 1)])
    except console.UsageError:
        raise
    except Exception as e:  # any file system's refusal is the user's to fix
        raise console.UsageError(flag, path, f"cannot read ({_reason(e)})") from None


def check_directory(flag: str, path: str) -> None:
    """``path`` is a directory holding at least one entry."""
    try:
        entries = storage.list_dir(path)
    except Exception as e:
        problem = "no such directory" if isinstance(e, FileNotFoundError) else f"cannot list ({_reason(e)})"
        raise console.UsageError(flag, path, problem) from None
    if not entries:
        raise console.UsageError(flag, path, "is an empty directory")


def make_writable_directory(flag: str, path: str) -> None:
    """Creates ``path`` if needed and writes (then deletes) a probe file in it: the output location works."""
    from apache_beam.io.filesystems import FileSystems

    try:
        if not FileSystems.exists(path):
            FileSystems.mkdirs(path)  # a no-op on object stores
        probe = storage.join(path, f".write-probe-{os.getpid()}")
        with FileSystems.create(probe) as f:
            f.write(b"")
        FileSystems.delete([probe])
    except Exception as e:
        raise console.UsageError(flag, path, f"cannot write here ({_reason(e)})") from None
