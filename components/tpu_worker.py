"""What runs on the workers of a TPU VM slice (``components.tpu_vm``): the project's package they install, the
startup script every worker runs at boot, and the program the script starts (``python -m components.tpu_worker``).

- **The package.** The Trainer step writes a wheel of exactly the project it runs (built from the source pip
  recorded when the project was installed: the checkout, or the image's copy) and the constraints it was
  installed with, under the pipeline root (``write_package``; once per wheel content). Every worker installs
  them into a virtual environment of its own: the same versions as the step's image.
- **The startup script** (``startup_script``) runs on every worker at every boot: it finds its worker number
  (the metadata server's ``agent-worker-number``), sets the environment up once (``ready`` marker), and hands
  over to this module's program.
- **The program** reports the worker's set-up to the attempt's status directory (``worker-N.json``); on worker
  0 only, it runs the command the step wrote (``command.json``: TFX's executor on this step's inputs and
  outputs, what a Vertex job would run) with ``TPU_NAME`` naming the slice and ``TPU_LOAD_LIBRARY=0`` (the chips
  belong to the ``tpu-runtime`` service of the pod runtime), then reports its exit status and its last line of
  error output (``trainer.json``), which the step reads. A rebooted worker 0 whose trainer already reported
  does not train again.

A rehearsal (``pipeline.tpu_rehearsal``) runs the same script on local processes: ``EFFNET_TPU_WORKER`` gives the
worker number, ``EFFNET_TPU_HOME`` its directory, and ``EFFNET_TPU_REHEARSAL`` the interpreter whose installed
libraries stand in for the worker's (the wheel is installed over them, without dependencies: no network), and
``EFFNET_TPU_STAND_IN`` the slice's replicas, which worker 0's trainer runs as logical CPUs
(``pipeline.tpu_stand_in``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile

PROJECT = "effnet-pipeline"
CONSTRAINTS = ("constraints.txt", "constraints-accelerators.txt")
WORKER_STATUS = "worker-{n}.json"
# Set by a rehearsal only: the slice's replicas, which the CPU stands in for (pipeline.tpu_stand_in).
STAND_IN_VARIABLE = "EFFNET_TPU_STAND_IN"
# The lines of the trainer's error output kept on the worker for its report (the last non-empty one is reported).
TAIL_BYTES = 64 * 1024


def source_directory() -> str:
    """Where the installed project's source is: the directory pip recorded at install time (``direct_url.json``:
    the checkout for an editable install, the image's copy otherwise)."""
    from importlib import metadata
    from urllib.parse import unquote, urlparse

    # The installed distribution's record (an egg-info a build left in the checkout, found first from there,
    # has none).
    texts = [d.read_text("direct_url.json") for d in metadata.distributions(name=PROJECT)]
    recorded = json.loads(next((text for text in texts if text), "{}"))
    path = unquote(urlparse(recorded.get("url", "")).path)
    if not path or not os.path.isfile(os.path.join(path, "setup.py")):
        raise RuntimeError(
            f"the installed {PROJECT} does not say where its source is (direct_url.json: {recorded}): install it "
            "from a checkout (pip install .) to train on a TPU VM slice"
        )
    return path


# What a wheel is built from (setuptools leaves its build directory in the source it is given, so it is given
# a copy of these).
WHEEL_SOURCES = ("setup.py", "beam_preprocess", "components", "effnet_common", "pipeline", "trainer_module")


def build_wheel(out_dir: str) -> str:
    """Builds the project's wheel into ``out_dir``; returns its path."""
    source = source_directory()
    with tempfile.TemporaryDirectory(prefix="effnet-source-") as copy:
        for name in WHEEL_SOURCES:
            path = os.path.join(source, name)
            if os.path.isdir(path):
                shutil.copytree(path, os.path.join(copy, name), ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(path, copy)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "-q",
                "-w",
                out_dir,
                copy,
            ],
            check=True,
            capture_output=True,
        )
    (wheel,) = [name for name in os.listdir(out_dir) if name.endswith(".whl")]
    return os.path.join(out_dir, wheel)


def write_package(root: str) -> tuple[str, str]:
    """Writes the project's wheel and constraints under ``root`` (a directory of their content's digest, left
    as it is when it exists); returns (that directory, the wheel's file name)."""
    from trainer_module import files

    source = source_directory()
    with tempfile.TemporaryDirectory(prefix="effnet-wheel-") as tmp:
        wheel = build_wheel(tmp)
        digest = hashlib.sha256()
        contents = {}
        for path in (wheel, *(os.path.join(source, name) for name in CONSTRAINTS)):
            with open(path, "rb") as f:
                contents[os.path.basename(path)] = f.read()
            digest.update(contents[os.path.basename(path)])
        directory = files.join(root, digest.hexdigest()[:16])
        for name, data in contents.items():
            target = files.join(directory, name)
            if not files.exists(target):
                files.write_bytes(target, data)
    return directory, os.path.basename(wheel)


def startup_script(package_dir: str, wheel: str) -> str:
    """The script every worker runs at boot; ``{attempt_dir}`` is left for ``components.tpu_vm`` to fill in."""
    q = shlex.quote
    fetch = " ".join(q(name) for name in (wheel, *CONSTRAINTS))
    return f"""#!/bin/bash
# effnet-pipeline: set up this worker of the slice, then run components.tpu_worker (on worker 0: the trainer).
set -uo pipefail
PACKAGE={q(package_dir)}
ATTEMPT_DIR='{{attempt_dir}}'
METADATA=http://metadata.google.internal/computeMetadata/v1/instance/attributes
WORKER="${{EFFNET_TPU_WORKER:-$(curl -sf -H 'Metadata-Flavor: Google' "$METADATA/agent-worker-number")}}"
HOME_DIR="${{EFFNET_TPU_HOME:-/opt/effnet-pipeline}}"
fetch() {{ case "$1" in gs://*) gcloud storage cp -q "$1" "$2" ;; *) cp "$1" "$2" ;; esac; }}
mkdir -p "$HOME_DIR/package" || exit 1
if [ -n "${{EFFNET_TPU_REHEARSAL:-}}" ]; then
  PYTHON="$EFFNET_TPU_REHEARSAL"
  export PYTHONPATH="$HOME_DIR/site"
else
  PYTHON="$HOME_DIR/venv/bin/python"
fi
if [ ! -f "$HOME_DIR/ready" ]; then
  for name in {fetch}; do fetch "$PACKAGE/$name" "$HOME_DIR/package/$name" || exit 1; done
  if [ -n "${{EFFNET_TPU_REHEARSAL:-}}" ]; then
    "$PYTHON" -m pip install -q --no-deps --no-index --target "$HOME_DIR/site" "$HOME_DIR/package/{wheel}" || exit 1
  else
    python3 -m venv "$HOME_DIR/venv" || exit 1
    "$PYTHON" -m pip install -q -c "$HOME_DIR/package/constraints.txt" "$HOME_DIR/package/{wheel}" || exit 1
  fi
  touch "$HOME_DIR/ready"
fi
cd "$HOME_DIR" || exit 1  # the installed project, not one that happens to be in the working directory
exec "$PYTHON" -m components.tpu_worker --worker "$WORKER" --attempt-dir "$ATTEMPT_DIR" --home "$HOME_DIR"
"""


def command_path(attempt_dir: str) -> str:
    """The command worker 0 runs: one file for every attempt, beside their directories."""
    from trainer_module import files

    return files.join(files.dirname(attempt_dir.rstrip("/")), "command.json")


def write_command(status_dir: str, command: list[str], env: dict[str, str]) -> None:
    from components import tpu_vm
    from trainer_module import files

    path = files.join(status_dir, tpu_vm.STATUS_DIR, "command.json")
    files.write_text(path, json.dumps({"command": command, "env": env}, indent=1))


def _report(path: str, values: dict) -> None:
    """Through Beam's filesystems, which the workers that only report (all but worker 0) load in a tenth of a
    second where TensorFlow takes seconds of their host's CPU."""
    from effnet_common import storage

    storage.write_text(path, json.dumps(values, sort_keys=True))


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run_trainer(attempt_dir: str, home: str) -> int:
    """Worker 0: runs the step's command to its end and reports it (once per attempt); returns its status."""
    from components import tpu_vm
    from trainer_module import files

    status = files.join(attempt_dir, tpu_vm.TRAINER_STATUS)
    if files.exists(status):
        return 0  # a reboot after the trainer ended: nothing to do
    spec = json.loads(files.read_text(command_path(attempt_dir)))
    node = attempt_dir.rstrip("/").rsplit("/", 1)[1]
    env = {**os.environ, **spec["env"], "TPU_NAME": node, "TPU_LOAD_LIBRARY": "0"}
    command = list(spec["command"])
    if command[:1] == ["python"]:  # the interpreter of the worker's environment, not the system's
        command[0] = sys.executable
    replicas = os.environ.get(STAND_IN_VARIABLE)
    if replicas:
        command = [sys.executable, "-m", "pipeline.tpu_stand_in", "--replicas", replicas, "--", *command]
    log = os.path.join(home, "trainer.stderr")
    with open(log, "wb") as err:
        code = subprocess.run(command, env=env, stderr=err, check=False).returncode
    with open(log, "rb") as f:
        f.seek(max(0, os.path.getsize(log) - TAIL_BYTES))
        tail = f.read().decode(errors="replace")
    _report(status, {"exit_code": code, "last_line": last_line(tail)})
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m components.tpu_worker", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--worker", type=int, required=True)
    parser.add_argument("--attempt-dir", required=True)
    parser.add_argument("--home", required=True)
    args = parser.parse_args(argv)
    import components
    from effnet_common import storage

    _report(
        storage.join(args.attempt_dir, WORKER_STATUS.format(n=args.worker)),
        {
            "worker": args.worker,
            "setup": "done",
            "host": socket.gethostname(),
            "package": components.__file__,
        },
    )
    return run_trainer(args.attempt_dir, args.home) if args.worker == 0 else 0


if __name__ == "__main__":
    from effnet_common import quick_exit

    quick_exit.exit_with(main())
