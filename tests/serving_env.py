"""The TensorFlow of Vertex's prebuilt serving image, in an environment of its own, kept between test runs.

The pipeline pushes its export to Vertex's prebuilt ``tf2-cpu.2-15`` image (``components.vertex_pusher``), whose
TensorFlow Serving loads it with TensorFlow 2.15's C++ ``LoadSavedModel``; the project trains and exports with
TensorFlow 2.16. ``python(version)`` is the interpreter of a virtual environment holding only
``tensorflow-cpu==VERSION`` (from PyPI, with the dependencies it declares), in which ``tests/tf_serving.py`` loads
an export as that image's server would. The environment is built once per machine and user, under the user's cache
directory (``$XDG_CACHE_HOME``, else ``~/.cache``: ``effnet-pipeline/tensorflow-cpu-VERSION``), and reused while its
stamp says it was built whole; two test processes building it at once wait for each other (a file lock).

It is built with the project's installer, uv (``.venv/bin/uv``, installed by ``scripts/setup_env.sh``): 6 s here
(2 cores, 2026-11-27; 1.2 GB, with uv's cache empty) where pip took about 4 minutes on a machine also running
tests, which on CI's clean machine was a test module's worth of the suite's time. Reusing it costs nothing but the
check of its stamp.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys

STAMP = ".effnet-ready"


def cache_root() -> str:
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "effnet-pipeline")


def python(version: str = "2.15.1", timeout: float = 1800) -> str:
    """The interpreter of the environment holding ``tensorflow-cpu==version`` (built on first use).

    Raises:
      RuntimeError: the environment could not be built (the installer's last lines quoted).
    """
    home = os.path.join(cache_root(), f"tensorflow-cpu-{version}")
    interpreter = os.path.join(home, "bin", "python")
    os.makedirs(cache_root(), exist_ok=True)
    with open(f"{home}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = os.path.join(home, STAMP)
        if os.path.exists(stamp) and open(stamp).read() == version:
            return interpreter
        shutil.rmtree(home, ignore_errors=True)  # a build that did not end is started again
        # Only the test's own environment's variables that do not point the installer or Python at the project's venv.
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV", "UV_PYTHON")
        }
        # The project's installer, beside the interpreter (scripts/setup_env.sh installs it into .venv).
        uv = os.path.join(os.path.dirname(sys.executable), "uv")
        for command in (
            [uv, "venv", "-q", "--python", sys.executable, home],
            [uv, "pip", "install", "-q", "--python", interpreter, f"tensorflow-cpu=={version}"],
        ):
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
            if done.returncode:
                tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
                raise RuntimeError(f"could not build the TensorFlow {version} environment in {home}:\n{tail}")
        with open(stamp, "w") as f:
            f.write(version)
    return interpreter
