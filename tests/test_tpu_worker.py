"""The startup script every worker of a TPU VM slice runs (components.tpu_worker.startup_script), run by bash.

``docker`` and ``curl`` are commands of this test on the script's PATH that write down how they were called (the
slice's own docker and metadata server are not here); the image run for real, on a rehearsed slice, is
tests/test_pipeline.py's and tests/test_tpu_pods.py's.
"""

import json
import os
import re
import subprocess

import pytest

from components import tpu_worker

IMAGE = "us-docker.pkg.dev/p/effnet/trainer-tpu@sha256:" + "c" * 64
NODE = "effnet-0123456789abcdef0123-0"

# Writes its arguments, one call a line, and exits as $FAKE_DOCKER_EXIT for `run` (0 for the rest; `image
# inspect` fails unless $FAKE_DOCKER_HAS_IMAGE is set).
FAKE_DOCKER = """#!/bin/bash
printf '%s\\n' "$(printf '%q ' "$@")" >> "$CALLS"
case "$1 $2" in
  "image inspect") [ -n "${FAKE_DOCKER_HAS_IMAGE:-}" ] ;;
  "run "*) echo "docker: the error this test makes" >&2; exit "${FAKE_DOCKER_EXIT:-0}" ;;
  *) exit 0 ;;
esac
"""


def run_script(tmp_path, worker: int | None, **env) -> tuple[subprocess.CompletedProcess, list[str], str]:
    """Runs the script for one worker; returns it, the commands it called, and its attempt directory."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in {"docker": FAKE_DOCKER, "gcloud": FAKE_DOCKER, "curl": "#!/bin/bash\necho 3\n"}.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    attempt_dir = str(tmp_path / "slice" / NODE)
    script = tpu_worker.startup_script(IMAGE).replace("{attempt_dir}", attempt_dir)
    calls = tmp_path / "calls.txt"
    environment = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "CALLS": str(calls),
        "EFFNET_TPU_HOME": str(tmp_path / "home"),
        **({"EFFNET_TPU_WORKER": str(worker)} if worker is not None else {}),
        **env,
    }
    done = subprocess.run(["bash", "-c", script], env=environment, capture_output=True, text=True, timeout=60)
    return done, calls.read_text().splitlines() if calls.exists() else [], attempt_dir


@pytest.mark.parametrize("worker", [1, None])  # None: the number comes from the metadata server (3)
def test_the_other_workers_report_and_install_and_run_nothing(tmp_path, worker):
    done, calls, attempt_dir = run_script(tmp_path, worker)
    assert done.returncode == 0, done.stderr
    assert calls == []  # no docker, no gcloud
    number = worker if worker is not None else 3
    report = json.loads(open(os.path.join(attempt_dir, f"worker-{number}.json")).read())
    assert set(report) == {"worker", "setup", "host"} and report["worker"] == number
    assert not re.search(
        r"\b(pip|venv|python3)\b", tpu_worker.startup_script(IMAGE)
    )  # nothing installed at boot


def test_worker_0_pulls_the_trainer_image_and_runs_the_worker_program_in_it(tmp_path):
    done, calls, attempt_dir = run_script(tmp_path, 0, EFFNET_TPU_DOCKER_ARGS="-v /a:/a")
    assert done.returncode == 0, done.stderr
    inspect, configure, pull, run = calls
    assert inspect.split()[:3] == ["image", "inspect", IMAGE]
    assert configure.split() == ["auth", "configure-docker", "us-docker.pkg.dev", "--quiet"]  # gcloud
    assert pull.split() == ["pull", IMAGE]
    run = run.split()
    assert run[:2] == ["run", "--rm"] and "--privileged" not in run
    assert run[run.index("--name") + 1] == tpu_worker.container_name(NODE)
    assert {f"TPU_NAME={NODE}", "TPU_LOAD_LIBRARY=0", f"{tpu_worker.IMAGE_VARIABLE}={IMAGE}"} <= set(run)
    assert run[run.index("-v") + 1] == "/a:/a"  # what a rehearsal adds
    assert run[run.index(IMAGE) + 1 :] == [
        "python",
        "-m",
        "components.tpu_worker",
        "--attempt-dir",
        attempt_dir,
    ]


def test_a_worker_0_whose_trainer_could_not_start_reports_it_for_the_step(tmp_path):
    done, calls, attempt_dir = run_script(tmp_path, 0, FAKE_DOCKER_HAS_IMAGE="1", FAKE_DOCKER_EXIT="125")
    assert done.returncode == 125
    assert [call.split()[0] for call in calls] == ["image", "run"]  # the image was there: no pull
    report = json.loads(open(os.path.join(attempt_dir, "trainer.json")).read())
    assert report == {
        "exit_code": 125,
        "last_line": f"worker 0 could not run {IMAGE}: docker: the error this test makes",
    }
