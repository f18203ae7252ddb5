"""What runs on the workers of a multi-host TPU VM slice (``components.tpu_vm``): the startup script every
worker runs at boot, and the program worker 0 runs in the trainer image (``python -m components.tpu_worker``).

Only worker 0 runs the TensorFlow program: it drives every host's TPU worker (the ``-pod`` runtime's
``tpu-runtime`` service), where the per-host input pipelines run as graph ops. Workers 1..N-1 only report to
the attempt's directory (``components.slice_files``). Worker 0 runs the ``trainer-tpu`` image a Vertex AI TPU
job runs, with the Docker of Google's TPU VM images, on the host's network, ``TPU_NAME`` naming the slice and
``TPU_LOAD_LIBRARY=0`` (the chips belong to ``tpu-runtime``). In it ``main`` runs the command the step wrote
and reports its exit status and the end of its error output, once per attempt: a rebooted worker 0 whose
trainer already reported does not train again.

A rehearsal (``pipeline.tpu_rehearsal``) runs the same script on local processes with this machine's Docker:
``EFFNET_TPU_WORKER`` gives the worker number, ``EFFNET_TPU_HOME`` its disk (a directory),
``EFFNET_TPU_DOCKER_ARGS`` what ``docker run`` needs here (local directories, the rehearsed APIs' addresses),
``EFFNET_TPU_STAND_IN`` the replicas that logical CPUs stand in for (``pipeline.tpu_stand_in``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shlex
import socket
import subprocess
import sys

from components import slice_files

# Set by a rehearsal only: the slice's replicas, which the CPU stands in for (pipeline.tpu_stand_in).
STAND_IN_VARIABLE = "EFFNET_TPU_STAND_IN"
IMAGE_VARIABLE = "EFFNET_TPU_IMAGE"
# How much of the end of the trainer's error output is kept beside its report (``slice_files``).
TAIL_LINES = 200


def container_name(node_id: str) -> str:
    """Worker 0's trainer container on a slice (a rehearsal stops it by this name)."""
    return f"effnet-trainer-{node_id}"


def startup_script(image: str) -> str:
    """The script every worker runs at boot; ``components.tpu_vm`` fills in its ``{attempt_dir}``."""
    q = shlex.quote
    worker_status = slice_files.WORKER_STATUS.format(n="$WORKER")
    trainer_status = slice_files.TRAINER_STATUS
    return f"""#!/bin/bash
# effnet-pipeline: report this worker of the slice; worker 0 runs the trainer in its image.
set -uo pipefail
ATTEMPT_DIR='{{attempt_dir}}'
IMAGE={q(image)}
METADATA=http://metadata.google.internal/computeMetadata/v1/instance/attributes
WORKER="${{EFFNET_TPU_WORKER:-$(curl -sf -H 'Metadata-Flavor: Google' "$METADATA/agent-worker-number")}}"
NODE=$(basename "$ATTEMPT_DIR")
put() {{ case "$1" in gs://*) gcloud storage cp -q - "$1" ;; \\
  *) mkdir -p "$(dirname "$1")" && cat >"$1" ;; esac; }}
exists() {{ case "$1" in gs://*) gcloud storage ls "$1" >/dev/null 2>&1 ;; *) [ -f "$1" ] ;; esac; }}
if [ "$WORKER" != 0 ]; then
  printf '{{"worker": %s, "setup": "done", "host": "%s"}}\\n' "$WORKER" "$(hostname)" \\
    | put "$ATTEMPT_DIR/{worker_status}"
  exit
fi
# The worker's disk (a rehearsed host's directory), for the end of the trainer's error output.
ERRORS="${{EFFNET_TPU_HOME:-/var/tmp/effnet-pipeline}}/worker-0.err"
mkdir -p "$(dirname "$ERRORS")" && : >"$ERRORS"
if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  case "$IMAGE" in *-docker.pkg.dev/* | *gcr.io/*) \\
    gcloud auth configure-docker "${{IMAGE%%/*}}" --quiet ;; esac
  docker pull "$IMAGE" 2> >(tee "$ERRORS" >&2)
fi
# No --privileged: with TPU_LOAD_LIBRARY=0 the trainer drives the chips through tpu-runtime, not /dev.
# shellcheck disable=SC2086
docker run --rm --name "{container_name("$NODE")}" --net=host \\
  -e TPU_NAME="$NODE" -e TPU_LOAD_LIBRARY=0 -e {IMAGE_VARIABLE}="$IMAGE" \\
  -e {STAND_IN_VARIABLE}="${{{STAND_IN_VARIABLE}:-}}" ${{EFFNET_TPU_DOCKER_ARGS:-}} \\
  "$IMAGE" python -m components.tpu_worker --attempt-dir "$ATTEMPT_DIR" 2> >(tee -a "$ERRORS" >&2)
CODE=$?
# A trainer that could not start (no image, a refused container) or died unreported
# ends the step all the same.
if [ "$CODE" != 0 ] && ! exists "$ATTEMPT_DIR/{trainer_status}"; then
  LAST=$(grep -v '^\\s*$' "$ERRORS" | tail -n 1 | tr -d '"\\\\')
  printf '{{"exit_code": %s, "last_line": "worker 0 could not run %s: %s"}}\\n' "$CODE" "$IMAGE" "$LAST" \\
    | put "$ATTEMPT_DIR/{trainer_status}"
fi

exit "$CODE"
"""


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _run(command: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Runs ``command``, its error output passed on to this program's (the worker's log) and its end kept;
    returns (its exit status, that end)."""
    tail: collections.deque[bytes] = collections.deque(maxlen=TAIL_LINES)
    with subprocess.Popen(command, env=env, stderr=subprocess.PIPE) as process:
        for line in process.stderr:
            sys.stderr.buffer.write(line)
            sys.stderr.flush()
            tail.append(line)
    return process.returncode, b"".join(tail).decode(errors="replace")


def run_trainer(attempt_dir: str) -> int:
    """Worker 0: runs the step's command to its end and reports it (once per attempt); returns its status."""
    from effnet_common import storage
    from trainer_module import files

    status = slice_files.trainer_status_path(attempt_dir)
    if files.exists(status):
        return 0  # a reboot after the trainer ended: nothing to do
    spec = slice_files.read_command(attempt_dir)
    node = attempt_dir.rstrip("/").rsplit("/", 1)[1]
    env = {**os.environ, **spec["env"], "TPU_NAME": node, "TPU_LOAD_LIBRARY": "0"}
    command = list(spec["command"])
    replicas = os.environ.get(STAND_IN_VARIABLE)
    if replicas:
        command = [sys.executable, "-m", "pipeline.tpu_stand_in", "--replicas", replicas, "--", *command]
    code, tail = _run(command, env)
    # The end of its error output beside the report: the slice, and its disks, go when the step ends.
    storage.write_text(files.join(attempt_dir, slice_files.TRAINER_ERRORS), tail)
    storage.write_text(status, json.dumps({"exit_code": code, "last_line": last_line(tail)}, sort_keys=True))
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m components.tpu_worker", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--attempt-dir", required=True)
    args = parser.parse_args(argv)
    from importlib import metadata

    from effnet_common import storage

    report = {
        "worker": 0,
        "setup": "done",
        "host": socket.gethostname(),
        "image": os.environ.get(IMAGE_VARIABLE, ""),
        "tensorflow": sorted(
            f"{d.metadata['Name']}=={d.version}"
            for d in metadata.distributions()
            if d.metadata["Name"].lower() in ("tensorflow", "tensorflow-tpu", "libtpu")
        ),
    }
    storage.write_text(
        storage.join(args.attempt_dir, slice_files.WORKER_STATUS.format(n=0)),
        json.dumps(report, sort_keys=True),
    )
    return run_trainer(args.attempt_dir)


if __name__ == "__main__":
    from effnet_common import quick_exit

    quick_exit.exit_with(main())
