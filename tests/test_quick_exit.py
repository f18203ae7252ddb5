"""How a process of this project ends (``effnet_common.quick_exit``), each case a fresh interpreter.

A tracked thread stands for a tf.data iterator deletion still under way (``trainer_module.data.release``): it
sleeps in a native call (``time.sleep`` lets go of the GIL as TensorFlow's deletion does), then writes a line.
Neither may happen once the interpreter finalizes: ``exit_with`` leaves without finalizing, any other end waits.
"""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from effnet_common import quick_exit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAM = """
import atexit, sys, threading, time
from effnet_common import quick_exit

log = open(sys.argv[1], "a", buffering=1)
atexit.register(lambda: log.write("atexit handler ran\\n"))  # registered first: runs after quick_exit's wait
thread = threading.Thread(target=lambda: (time.sleep(float(sys.argv[2])), log.write("thread came back\\n")),
                          daemon=True)
quick_exit.track(thread)
thread.start()
print("the program's last line", end="")  # unflushed: the exit flushes it
"""


def run(tmp_path, ending: str, sleep: float) -> tuple[subprocess.CompletedProcess, list[str], float]:
    log = tmp_path / "log.txt"
    program = PROGRAM + textwrap.dedent(ending)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", program, str(log), str(sleep)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, log.read_text().splitlines(), time.monotonic() - started


def test_exit_with_leaves_at_once_with_its_status_handlers_run_and_output_flushed(tmp_path):
    done, log, seconds = run(tmp_path, "quick_exit.exit_with(3)", sleep=30)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "the program's last line"
    assert log == ["atexit handler ran"]  # the deletion never came back into the interpreter
    assert seconds < 20


def test_exit_with_a_message_exits_1_and_prints_it_as_sys_exit_does(tmp_path):
    done, log, _ = run(tmp_path, "quick_exit.exit_with('a message')", sleep=30)
    assert done.returncode == 1
    assert done.stderr.strip().endswith("a message")


def test_any_other_end_waits_for_the_tracked_thread_before_finalizing(tmp_path):
    done, log, seconds = run(tmp_path, "", sleep=2)
    assert done.returncode == 0, done.stderr
    assert log == ["thread came back", "atexit handler ran"]
    assert seconds >= 2


def test_exit_with_and_nothing_tracked_under_way_is_sys_exit(tmp_path):
    done, log, _ = run(tmp_path, "thread.join(); quick_exit.exit_with(0)", sleep=0)
    assert done.returncode == 0, done.stderr
    assert log == ["thread came back", "atexit handler ran"]


def test_a_running_thread_that_is_no_daemon_is_waited_for_as_python_does(tmp_path):
    ending = """
    other = threading.Thread(target=lambda: (time.sleep(1), log.write("other thread ended\\n")))
    other.start()
    quick_exit.exit_with(0)
    """
    done, log, _ = run(tmp_path, ending, sleep=2)
    assert done.returncode == 0, done.stderr
    assert log == ["other thread ended", "thread came back", "atexit handler ran"]


@pytest.mark.parametrize("status, code", [(None, 0), (0, 0), (2, 2), (130, 130), (256 + 5, 5)])
def test_status_codes_are_those_of_sys_exit(status, code):
    assert quick_exit._status_code(status) == code
