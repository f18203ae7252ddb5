"""The files through which a Trainer step and the workers of its TPU VM slice talk, spelled here only.

Under the step's status directory (its model run), ``slice/`` holds the command worker 0 runs
(``command.json``, the same for every attempt) and a directory per attempt, named as the attempt's node: each
worker reports there (``worker-N.json``), and worker 0 reports the trainer's end (``trainer.json``) with the
end of its error output (``trainer-errors.txt``). The node's metadata names its attempt's directory
(``ATTEMPT_DIR_KEY``). The step keeps the states it saw each attempt's slice in, and when (``states.jsonl``:
``{"attempt", "state", "time"}`` a line), for the run's time account. Paths may be local or on an object store
(``trainer_module.files``).
"""

from __future__ import annotations

import json

STATUS_DIR = "slice"
COMMAND_FILE = "command.json"
TRAINER_STATUS = "trainer.json"
TRAINER_ERRORS = "trainer-errors.txt"
WORKER_STATUS = "worker-{n}.json"
STATES_FILE = "states.jsonl"
# The state written once an attempt's queued resource is deleted.
DELETED = "DELETED"
# The node's metadata key naming its attempt's directory (beside the startup script that reports there).
ATTEMPT_DIR_KEY = "effnet-attempt-dir"


def attempt_dir(status_dir: str, node_id: str) -> str:
    """The directory of the attempt whose node is ``node_id``."""
    return f"{status_dir.rstrip('/')}/{STATUS_DIR}/{node_id}"


def status_dir_of(attempt: str) -> str:
    """The step's status directory (its model run) of an attempt's directory."""
    return attempt.rstrip("/").rsplit("/", 2)[0]


def command_path(attempt: str) -> str:
    """The command worker 0 runs: one file for every attempt, beside their directories."""
    return f"{attempt.rstrip('/').rsplit('/', 1)[0]}/{COMMAND_FILE}"


def write_command(status_dir: str, command: list[str], env: dict[str, str]) -> None:
    from trainer_module import files

    path = files.join(status_dir, STATUS_DIR, COMMAND_FILE)
    files.write_text(path, json.dumps({"command": command, "env": env}, indent=1))


def read_command(attempt: str) -> dict:
    """``{"command": [...], "env": {...}}``, as the step wrote it."""
    from trainer_module import files

    return json.loads(files.read_text(command_path(attempt)))


def trainer_status_path(attempt: str) -> str:
    return f"{attempt.rstrip('/')}/{TRAINER_STATUS}"


def read_status(attempt: str) -> dict | None:
    """What worker 0 reported when the trainer ended (``{"exit_code", "last_line"}``), or None."""
    from trainer_module import files

    path = trainer_status_path(attempt)
    try:
        if not files.exists(path):
            return None
        return json.loads(files.read_text(path))
    except (files.Error, ValueError):
        return None


def read_errors(attempt: str) -> str:
    """The end of the trainer's error output that worker 0 kept beside its report, or ''."""
    from trainer_module import files

    try:
        return files.read_text(files.join(attempt, TRAINER_ERRORS))
    except files.Error:
        return ""


def workers_reported(attempt: str) -> int:
    """How many workers report their set-up done."""
    from trainer_module import files

    try:
        return len(files.glob(files.join(attempt, WORKER_STATUS.format(n="*"))))
    except files.Error:
        return 0


def write_states(status_dir: str, states: list[dict]) -> None:
    """The states seen so far (``{"attempt", "state", "time"}``), the file rewritten whole."""
    from trainer_module import files

    text = "".join(json.dumps(state) + "\n" for state in states)
    files.write_text(files.join(status_dir, STATUS_DIR, STATES_FILE), text)


def read_states(status_dir: str) -> list[dict]:
    """The states the step saw, oldest first; [] when it recorded none."""
    from trainer_module import files

    path = files.join(status_dir, STATUS_DIR, STATES_FILE)
    if not files.exists(path):
        return []
    return [json.loads(line) for line in files.read_text(path).splitlines() if line.strip()]
