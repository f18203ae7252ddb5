"""Ctrl-C: a command stops in one line, within about a second, wherever it is, leaving nothing temporary behind.

The programs run as real processes in a process group of their own, and SIGINT goes to the group, as a
terminal's Ctrl-C does. The pipeline's own stop (a training resumed by the next run) is in test_pipeline.py,
sharding's in test_beam_pipeline.py.
"""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import suite_env

from effnet_common import console, stopping

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A command that registers a clean-up, starts a child process, holds a file half-written and then sits in a
# native call that never returns to Python for many seconds (as a TensorFlow training call or a Beam bundle does).
BUSY_COMMAND = """
import hashlib, os, shutil, subprocess, sys
from effnet_common import console, stopping, whole

root = sys.argv[1]
with console.session() as session:
    session.keep_log(os.path.join(root, "run.log"))
    partial = os.path.join(root, "partial")
    os.makedirs(partial)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(os.path.join(root, "child.pid"), "w") as f:
        f.write(str(child.pid))
    backend = whole.Backend(
        create=lambda path: open(path, "wb"), rename=os.replace, exists=os.path.exists, delete=os.remove
    )
    with stopping.describe(lambda: f"the partial directory was removed; run it again"):
        with stopping.cleanup(lambda: shutil.rmtree(partial)), whole.write(os.path.join(root, "out.bin"), backend) as f:
            f.write(b"half")
            f.flush()
            console.say("busy")
            hashlib.pbkdf2_hmac("sha256", b"password", b"salt", 400_000_000)  # minutes in C, the GIL released
    console.say("never reached")
"""


def _start(tmp_path, env=None, command=BUSY_COMMAND):
    return subprocess.Popen(
        [sys.executable, "-c", command, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        start_new_session=True,  # its own process group, which the signal goes to as a terminal's does
        env=suite_env.child(env),
    )


def _wait_for_line(process, expected: str, timeout: float = 120) -> list[str]:
    lines = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        lines.append(line)
        if line.strip() == expected:
            return lines
    raise AssertionError(f"no {expected!r} line: {lines}")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_ctrl_c_in_a_long_native_call_stops_at_once_in_one_line(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    process = _start(tmp_path, {"TMPDIR": str(tmp)})
    try:
        _wait_for_line(process, "busy")
        os.killpg(process.pid, signal.SIGINT)
        sent = time.monotonic()
        status = process.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    out, err = process.stdout.read(), process.stderr.read()
    assert status == console.STOPPED_EXIT, err
    assert took < 5, took  # the C call would have gone on for minutes
    assert err == "stopped by the user: the partial directory was removed; run it again\n"
    assert "never reached" not in out and "Traceback" not in out + err
    # Its clean-ups ran, the half-written file is gone, its child process was stopped, the log is complete.
    assert sorted(os.listdir(tmp_path)) == ["child.pid", "run.log", "tmp"]
    assert not _alive(int((tmp_path / "child.pid").read_text()))
    assert "stopped by the user" in (tmp_path / "run.log").read_text()
    assert not os.listdir(tmp)


# A command whose worker thread writes file after file under a directory the main thread removes on a stop (as
# Beam's multi-threading workers write spill files under the sharding run's temporary directory).
WRITING_THREAD_COMMAND = """
import os, shutil, sys, threading
from effnet_common import console, stopping, whole

root = sys.argv[1]
spill = os.path.join(root, "spill")
backend = whole.Backend(
    create=lambda path: (os.makedirs(os.path.dirname(path), exist_ok=True), open(path, "wb"))[1],
    rename=os.replace, exists=os.path.exists, delete=os.remove,
)

def worker():
    for index in range(10**9):
        with whole.write(os.path.join(spill, f"{index}.bin"), backend) as f:
            f.write(b"x" * 1000)

with console.session() as session:
    with stopping.cleanup(lambda: shutil.rmtree(spill, ignore_errors=True)):
        threading.Thread(target=worker, daemon=True).start()
        console.say("writing")
        threading.Event().wait()
"""


def test_a_thread_writing_file_after_file_leaves_nothing_after_a_stop(tmp_path):
    """The stop's clean-ups run while the program's threads still run: a thread that enters its next file's block
    after the stop began waits there, so nothing is made after the clean-ups removed the directory."""
    process = _start(tmp_path, command=WRITING_THREAD_COMMAND)
    try:
        _wait_for_line(process, "writing")
        time.sleep(0.5)
        os.killpg(process.pid, signal.SIGINT)
        status = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert status == console.STOPPED_EXIT, process.stderr.read()
    assert sorted(os.listdir(tmp_path)) == []


# A command whose worker process ends on the same Ctrl-C and so fails the main thread's call while the stop is
# still stopping children (Beam's worker processes: "Channel closed prematurely"). The child ignores SIGINT, so
# the stop spends its grace second on it; the main thread's error comes in that second.
FAILING_MAIN_COMMAND = """
import signal, subprocess, sys, time
from effnet_common import console, stopping

holder = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"
with console.session():
    child = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    child.stdout.readline()
    with stopping.describe("the worker's output was removed; run it again"):
        console.say("working")
        while not stopping._armed.started.is_set():
            time.sleep(0.01)
        raise RuntimeError("Channel closed prematurely.")
"""


def test_a_main_thread_failing_because_of_the_ctrl_c_does_not_end_the_process_before_the_stop():
    process = _start(tmp_path=None, command=FAILING_MAIN_COMMAND)
    try:
        _wait_for_line(process, "working")
        os.killpg(process.pid, signal.SIGINT)
        status = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    err = process.stderr.read()
    assert status == console.STOPPED_EXIT, err
    assert err == "stopped by the user: the worker's output was removed; run it again\n"


def test_the_stop_line_is_the_innermost_description_and_falls_back_on_failure():
    with stopping.describe("outer"):
        assert stopping.stop_line() == "stopped by the user: outer"
        with stopping.describe(lambda: 1 / 0):  # a description that fails gives way
            assert stopping.stop_line() == "stopped by the user: outer"
        with stopping.describe(lambda: "inner"):
            assert stopping.stop_line() == "stopped by the user: inner"
    assert stopping.stop_line() == "stopped by the user: run the same command again"


def test_clean_ups_run_latest_first_and_only_inside_their_block():
    ran = []
    with stopping.cleanup(lambda: ran.append("outer")), stopping.cleanup(lambda: ran.append("inner")):
        with stopping.cleanup(lambda: ran.append("failing") or 1 / 0):
            stopping.run_cleanups()
    stopping.run_cleanups()  # nothing registered any more
    assert ran == ["failing", "inner", "outer"]


def test_a_session_under_a_test_leaves_ctrl_c_alone():
    """A test calling a command's main in its own process must never be ended by a stop."""
    before = signal.getsignal(signal.SIGINT)
    with console.session():
        assert signal.getsignal(signal.SIGINT) is before
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--num_hosts", "4"], "error: unrecognized arguments: --num_hosts 4 (did you mean --num-hosts?)"),
        (["--overwirte"], "error: unrecognized arguments: --overwirte (did you mean --overwrite?)"),
        (
            ["--num_hosts", "4", "--shards-mb", "1", "--zzz"],
            "error: unrecognized arguments: --num_hosts 4 --shards-mb 1 --zzz (did you mean --num-hosts for "
            "--num_hosts, --shard-mb for --shards-mb?)",
        ),
    ],
)
def test_a_misspelt_option_is_one_line_naming_the_option_it_resembles(capsys, argv, line):
    parser = console.ArgumentParser(prog="prog")
    for option in ("--num-hosts", "--shard-mb"):
        parser.add_argument(option)
    parser.add_argument("--overwrite", action="store_true")
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(argv)
    assert exited.value.code == console.USAGE_EXIT
    assert capsys.readouterr().err == f"{line}; see prog --help\n"


def test_plurals():
    assert [console.plural(n, "host") for n in (0, 1, 2, 1000)] == [
        "0 hosts",
        "1 host",
        "2 hosts",
        "1,000 hosts",
    ]


def test_a_program_is_printed_as_it_runs(monkeypatch, tmp_path):
    """The TensorBoard command a run prints runs as printed: bare when the shell finds this environment's,
    else by the path of this environment's (a virtualenv that is not activated)."""
    bin_dir = os.path.dirname(sys.executable)
    if not os.path.exists(os.path.join(bin_dir, "tensorboard")):
        pytest.skip("this environment has no tensorboard script")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert console.program_command("tensorboard") == os.path.join(bin_dir, "tensorboard")
    monkeypatch.setenv("PATH", bin_dir)
    assert console.program_command("tensorboard") == "tensorboard"
    assert re.fullmatch(r"\S+", console.program_command("no-such-program"))


# A parent that starts a child which asks to die with it, prints the child's pid and waits.
PARENT_COMMAND = """
import os, subprocess, sys, time
from effnet_common import stopping

child = subprocess.Popen(
    [sys.executable, "-c", "from effnet_common import stopping; stopping.die_with_parent(); "
     "import os, time; print(os.environ.get(stopping.PARENT_PID_VARIABLE), flush=True); time.sleep(120)"],
    env=stopping.child_environment(dict(os.environ)),
)
print(child.pid, flush=True)
time.sleep(120)
"""


def test_a_child_started_to_die_with_its_parent_dies_when_the_parent_is_killed():
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT_COMMAND],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=suite_env.child(None),
    )
    try:
        child = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == "None"  # the variable is the child's, not its children's
        assert _alive(child)
        parent.kill()  # SIGKILL: no handler of the parent's runs
        parent.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        parent.kill()
        parent.stdout.close()


def test_a_child_whose_parent_has_already_gone_ends_as_it_starts():
    not_the_parent = str(os.getpid() + 1_000_000)  # no process has it: the parent that set it has ended
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "from effnet_common import stopping; stopping.die_with_parent(); print('ran')",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=suite_env.child({stopping.PARENT_PID_VARIABLE: not_the_parent}),
        timeout=60,
    )
    assert (child.returncode, child.stdout) == (-signal.SIGKILL, "")


KILLED_CHILD = """
import subprocess, sys
from effnet_common import stopping

# A child that ignores SIGINT and holds 1.5 GB: the kernel takes a while to tear it down once it is killed.
holder = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); b = b'x' * 1_500_000_000; "
holder += "print('ready', flush=True); time.sleep(120)"
child = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline() == "ready\\n"
stopping.stop_children(grace=0.2)
try:
    with open(f"/proc/{child.pid}/stat") as f:
        print(f.read().rpartition(")")[2].split()[0])
except OSError:
    print("gone")
"""


def test_a_child_killed_after_its_grace_has_ended_when_the_stop_returns():
    """A child still running after the grace is killed, and the stop returns only once the kernel has torn it
    down (a zombie), so a stopped command leaves no process of its group running behind it."""
    done = subprocess.run(
        [sys.executable, "-c", KILLED_CHILD], capture_output=True, text=True, cwd=REPO, env=suite_env.child(None),
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "Z", done.stdout


SHELL_STARTED_WORKER = """
import os, subprocess, sys, time
from effnet_common import stopping

# As Beam starts a multi-process worker: through `sh -c`, which does not exec it, so the worker is a grandchild.
# It takes 1.5 s to end after SIGINT (as a worker tearing down its threads), so it outlives the shell.
worker = "import signal, time; signal.signal(signal.SIGINT, lambda *a: (time.sleep(1.5), exit(1))); "
worker += "print('ready', flush=True); time.sleep(120)"
shell = subprocess.Popen(f"{sys.executable} -c \\"{worker}\\"", shell=True, stdout=subprocess.PIPE, text=True)
assert shell.stdout.readline() == "ready\\n"
(grandchild,) = [pid for pid in stopping.descendant_processes() if pid != shell.pid]
stopping.stop_children(grace=5)
try:
    with open(f"/proc/{grandchild}/stat") as f:
        print(f.read().rpartition(")")[2].split()[0])
except OSError:
    print("gone")
"""


def test_a_stop_waits_for_grandchildren_its_children_left_behind():
    """The shell Beam starts its worker through ends at SIGINT at once; the worker (the shell's child) has ended
    too when the stop returns, not only the shell. Before, the stop waited for its children alone and the worker
    was still tearing down after the command had exited (the sharding command's Ctrl-C test, 1 run in 5)."""
    done = subprocess.run(
        [sys.executable, "-c", SHELL_STARTED_WORKER], capture_output=True, text=True, cwd=REPO,
        env=suite_env.child(None), timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() in ("Z", "gone"), done.stdout
