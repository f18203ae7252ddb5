"""What a person sees while a command runs, and where everything else goes.

The commands (``python -m beam_preprocess``, ``python -m trainer_module``, ``python -m
pipeline.local_runner``) print a short account: ``say``'s lines on stdout and, for a problem the user can
fix, one ``error: ...`` line on stderr (``fail``). Everything the libraries log goes to a log file whose path
is printed near the start; ``--verbose`` shows it live on stderr instead. Nothing here imports TensorFlow:
Beam workers import this module.

- The account is the ``console`` logger: bare lines inside a ``session`` (and in the log file too), ordinary
  records outside one (a TFX Trainer on Vertex, a test). Every other record goes to the log file.
- What bypasses Python logging (TensorFlow's C++, gRPC, Beam's worker processes) writes to descriptor 2, which
  a real process's session points at the log file while ``sys.stderr`` stays on the terminal.
- The log starts in a local temporary file (imports print before the output is checked); ``keep_log`` moves
  it into place after the preflight (a ``gs://`` log is uploaded at the end); an early error leaves none.
- Ctrl-C: the session arms ``effnet_common.stopping`` (one ``stopped by the user`` line, exit 130).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import logging
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

from effnet_common import stopping

CONSOLE_LOGGER = "console"
# Exit statuses every command shares: a bad input or setting, a missed target, Ctrl-C.
USAGE_EXIT = 2
MISSED_TARGET_EXIT = 3
STOPPED_EXIT = stopping.STOPPED_EXIT
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_console = logging.getLogger(CONSOLE_LOGGER)
_current: Session | None = None  # the session of the running command


class UsageError(Exception):
    """A problem the user fixes by changing a flag: printed as one ``error: FLAG VALUE: problem`` line."""

    def __init__(self, flag: str, value: object, problem: str):
        where = " ".join(str(part) for part in (flag, value) if str(part))
        super().__init__(f"{where}: {problem}" if where else problem)
        self.flag = flag


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose refusals are one ``error:`` line and exit status 2 (argparse prints its whole
    usage first): an unknown option is named with the options spelt like it (``--num_hosts``: did you mean
    ``--num-hosts``?), and ``--help`` still lists them all. Its subcommands' parsers are of this class too."""

    # Options another parser takes after this one (Beam's, for beam_preprocess): spellings to suggest too.
    more_options: tuple[str, ...] = ()

    def error(self, message: str):
        unknown = message.partition("unrecognized arguments: ")[2]
        if unknown:
            message += did_you_mean(unknown.split(), [*self.option_strings(), *self.more_options])
        sys.stderr.write(f"error: {message}; see {self.prog} --help\n")
        sys.exit(USAGE_EXIT)

    def option_strings(self) -> list[str]:
        """This parser's options and its subcommands' (the top parser reports a subcommand's unknown
        option)."""
        options = [option for action in self._actions for option in action.option_strings]
        for action in self._actions:
            if isinstance(action.choices, dict):  # the subcommands' parsers, by name
                options += [
                    option for parser in action.choices.values() for option in parser.option_strings()
                ]
        return list(dict.fromkeys(options))


def did_you_mean(unknown: list[str], known: list[str]) -> str:
    """`` (did you mean --a?)`` for the unknown options spelt like a known one (``_`` for ``-``, a typo), or
    ''."""
    options = [option.partition("=")[0] for option in unknown if option.startswith("--")]
    guesses = {}
    for name in options:
        close = difflib.get_close_matches(name.replace("_", "-"), known, n=1, cutoff=0.75)
        if close:
            guesses[name] = close[0]
    if len(options) == 1 and guesses:
        return f" (did you mean {guesses[options[0]]}?)"
    said = ", ".join(f"{guess} for {name}" for name, guess in guesses.items())
    return f" (did you mean {said}?)" if said else ""


def say(message: str, *args: object) -> None:
    """One line of the short account (``message % args``)."""
    _console.info(message, *args)


def one_line(error: BaseException | str) -> str:
    """The first line of an error's message, without a trailing colon (the rest belongs in the log file)."""
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0].rstrip(":")


def fail(error: BaseException | str, status: int = USAGE_EXIT) -> int:
    """Prints ``error: <first line>`` on stderr (the whole error, with its traceback, goes to the session's
    log file); returns ``status`` for the command to exit with."""
    keeps_log = _current is not None and not _current.verbose  # --verbose: the line is enough on the console
    if keeps_log and isinstance(error, BaseException) and not isinstance(error, UsageError):
        logging.getLogger(__name__).info("the run stops on this error", exc_info=error)
    _console.error("%s", one_line(error))
    return status


def plural(count: int, noun: str, nouns: str = "") -> str:
    """'1 host', '2 hosts' (``nouns`` for an irregular plural: '1 replica'... are regular)."""
    return f"{count:,} {noun if count == 1 else nouns or noun + 's'}"


def duration(seconds: float) -> str:
    """12.3s, 4m05s, 2h03m (a negative time is 0.0s)."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def wants_verbose(argv: list[str]) -> bool:
    """Whether ``argv`` asks for --verbose, before the full parser is built (building it imports TensorFlow,
    whose import already prints)."""
    return any(len(arg) > 4 and "--verbose".startswith(arg) for arg in argv)


# -- the session


class _ConsoleHandler(logging.Handler):
    """The account's lines: INFO on stdout, WARNING and above as ``error: ...`` on stderr.

    The streams are looked up at each record, so a replaced ``sys.stdout`` (a test's capture) is honoured.
    """

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if record.levelno >= logging.WARNING:
                stream, line = sys.stderr, f"error: {record.getMessage()}"
            else:
                stream, line = sys.stdout, record.getMessage()
            stream.write(line + "\n")
            stream.flush()
        except Exception:  # logging must never raise into the program
            self.handleError(record)


class _CurrentStderrHandler(logging.StreamHandler):
    """--verbose: every record on whatever ``sys.stderr`` is when it is emitted."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def _not_console(record: logging.LogRecord) -> bool:
    return not (record.name == CONSOLE_LOGGER or record.name.startswith(CONSOLE_LOGGER + "."))


class Session:
    """One command's console set-up; use ``session(verbose)``."""

    def __init__(self, verbose: bool):
        self.verbose = verbose
        self.log_path: str | None = None
        self._temp_path: str | None = None
        self._stream = None
        self._upload: Callable[[str, str], None] | None = None
        self._terminal_fd: int | None = None
        self._terminal = sys.stderr  # where a stop's line goes
        self._handlers: list[tuple[logging.Logger, logging.Handler]] = []
        self._levels: list[tuple[logging.Logger, int]] = []
        self._restore: list[Callable[[], None]] = []

    # -- set-up and tear-down

    def _open(self) -> None:
        program = _is_program()
        self._add(_console, _ConsoleHandler(logging.INFO))
        self._set_level(_console, logging.INFO)
        root = logging.getLogger()
        if self.verbose:
            handler: logging.Handler = _CurrentStderrHandler()
            handler.addFilter(_not_console)
        else:
            fd, self._temp_path = tempfile.mkstemp(prefix="effnet-", suffix=".log")
            self._stream = open(fd, "a", encoding="utf-8", errors="backslashreplace", buffering=1)
            handler = logging.StreamHandler(self._stream)
            self._redirect_fd2(self._stream.fileno())
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        self._file_handler = handler
        self._add(root, handler)
        self._set_level(root, logging.INFO)
        self._absl_info()
        logging.captureWarnings(True)
        if program:
            stopping.arm(self._quiet, self._report_stop, lambda: self._finish_log(close=False))
            self._replace(threading, "excepthook", stopping.log_thread_exception)

    def _quiet(self) -> None:
        """A stop has begun: what the program's threads print on ``sys.stderr`` (a failing thread, a logging
        error) goes to descriptor 2, the log file, instead of the terminal (unless --verbose shows it all)."""
        logging.raiseExceptions = False
        self._terminal = sys.stderr
        if self._terminal_fd is not None:
            sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)

    def _report_stop(self, line: str) -> None:
        """The stop's line on the terminal."""
        self._terminal.write(line + "\n")
        self._terminal.flush()

    def _redirect_fd2(self, fd: int) -> None:
        """Points descriptor 2 at ``fd`` and ``sys.stderr`` at the terminal (a real process only)."""
        if self._terminal_fd is None:
            if not _is_program():
                return
            sys.stderr.flush()
            self._terminal_fd = os.dup(2)
            sys.stderr = open(
                self._terminal_fd, "w", encoding="utf-8", errors="backslashreplace", buffering=1
            )
        os.dup2(fd, 2)

    def close(self) -> None:
        stopping.disarm()
        logging.captureWarnings(False)
        for logger, handler in reversed(self._handlers):
            logger.removeHandler(handler)
        for logger, level in reversed(self._levels):
            logger.setLevel(level)
        for restore in reversed(self._restore):
            restore()
        # Descriptor 2 stays on the log file (and sys.stderr on the terminal) until the process exits: what
        # TensorFlow prints while shutting down (gRPC, the multi-worker coordination service) belongs there.
        self._finish_log()

    def _finish_log(self, close: bool = True) -> None:
        """The log file completed: kept where ``keep_log`` put it, uploaded to a remote place, or removed when
        it was never kept (an early error, or a command that keeps none). A stop (``close=False``) flushes it
        instead of closing it: the program's other threads may still write until the process exits."""
        if self._stream is not None:
            self._stream.flush()
            if close:
                self._stream.close()
                self._stream = None
        if self._temp_path is None:
            return
        if self._upload is not None and self.log_path is not None:
            try:
                self._upload(self._temp_path, self.log_path)
            except Exception as e:  # the run's own outcome matters more than its log
                sys.stderr.write(
                    f"warning: the log stays at {self._temp_path}: copying it to {self.log_path} failed "
                    f"({one_line(e)})\n"
                )
                return
        os.remove(self._temp_path)
        self._temp_path = None

    def _absl_info(self) -> None:
        """TFX logs through absl, whose level is its ``verbosity`` flag: set to INFO through absl itself,
        since TensorFlow resets the level to the flag's value (for instance while saving a model)."""
        try:
            from absl import logging as absl_logging
        except ImportError:  # a Beam worker without absl: nothing logs through it
            return
        previous, logger = absl_logging.get_verbosity(), logging.getLogger("absl")
        level = logger.level
        absl_logging.set_verbosity(absl_logging.INFO)

        def restore() -> None:
            absl_logging.set_verbosity(previous)
            logger.setLevel(level)

        self._restore.append(restore)

    def _replace(self, owner: object, name: str, value: object) -> None:
        previous = getattr(owner, name)
        setattr(owner, name, value)
        self._restore.append(lambda: setattr(owner, name, previous))

    def _add(self, logger: logging.Logger, handler: logging.Handler) -> None:
        logger.addHandler(handler)
        self._handlers.append((logger, handler))

    def _set_level(self, logger: logging.Logger, level: int) -> None:
        self._levels.append((logger, logger.level))
        logger.setLevel(level)

    # -- the log file

    def keep_log(self, path: str, upload: Callable[[str, str], None] | None = None) -> None:
        """Keeps the log at ``path`` (local, or remote through ``upload(local_file, path)`` at the end; Beam's
        ``FileSystems`` by default) and says where it is. Nothing to keep with --verbose."""
        if self.verbose or self._stream is None:
            return
        self.log_path = path
        local = _local_path(path)
        if local is not None:
            # A plain file, not FileSystems: descriptor 2 is pointed at it.
            os.makedirs(os.path.dirname(os.path.abspath(local)), exist_ok=True)
            stream = open(local, "a", encoding="utf-8", errors="backslashreplace", buffering=1)
            self._stream.flush()
            with open(self._temp_path, encoding="utf-8", errors="backslashreplace") as earlier:
                shutil.copyfileobj(earlier, stream)
            self._file_handler.setStream(stream)
            if self._terminal_fd is not None:
                self._redirect_fd2(stream.fileno())
            self._stream.close()
            os.remove(self._temp_path)
            self._stream, self._temp_path = stream, None
        else:
            self._upload = upload or _upload_with_filesystems
        say("full log: %s", path)


def _is_program() -> bool:
    """Whether this is a command's own process (its stderr the process's descriptor 2, on the main thread),
    not a test calling a command's ``main`` under pytest's capture."""
    if sys.stderr is not sys.__stderr__ or sys.__stderr__ is None or not stopping.can_arm():
        return False
    try:
        return sys.__stderr__.fileno() == 2
    except (AttributeError, OSError, ValueError):
        return False


def _local_path(path: str) -> str | None:
    """The local file a path names (no scheme, or file://), None for a remote one (gs://, ram://...)."""
    if path.startswith("file://"):
        return path[len("file://") :]
    return None if "://" in path else path


def _upload_with_filesystems(local_path: str, path: str) -> None:
    from effnet_common import storage

    with open(local_path, "rb") as source, storage.open_write(path) as target:
        shutil.copyfileobj(source, target)


@contextlib.contextmanager
def session(verbose: bool = False) -> Iterator[Session]:
    """Sets up the console for one command (see the module's docstring) and restores everything on exit."""
    global _current
    current = Session(verbose)
    current._open()
    _current = current
    try:
        yield current
    except Exception:
        if not verbose:  # the traceback shows on the terminal; the log file keeps it beside what led to it
            logging.getLogger(__name__).error("the run ends with an unexpected error", exc_info=True)
        raise
    finally:
        _current = None
        current.close()


def program_command(name: str) -> str:
    """How a person runs the console script ``name`` of this Python environment as printed: its bare name when
    the shell finds this environment's, else its path (a virtualenv that is not activated)."""
    here = os.path.join(os.path.dirname(sys.executable), name)
    found = shutil.which(name)
    if not os.path.exists(here) or (found and os.path.realpath(found) == os.path.realpath(here)):
        return name
    return shlex.quote(here)


def tensorboard_command(logdir: str) -> str:
    """The command that opens ``logdir`` in TensorBoard as printed (``program_command``), the directory
    quoted."""
    return f"{program_command('tensorboard')} --logdir {shlex.quote(logdir)}"


def log_name(program: str) -> str:
    """``program-YYYYmmdd-HHMMSS.log``: one log file per run."""
    return f"{program}-{time.strftime('%Y%m%d-%H%M%S')}.log"
