"""A pipeline task's stop (effnet_common.task_signals): SIGTERM / SIGINT raised where the step waits, never lost in
a library's code. The signals are real, sent to this process."""

import os
import signal
import threading
import time

import pytest
from google.api_core import exceptions

from effnet_common import cloud_retry, task_signals
from effnet_common.task_signals import StopSignals, TaskStopped


def _signal_soon(sig=signal.SIGTERM, seconds: float = 0.2) -> threading.Timer:
    timer = threading.Timer(seconds, os.kill, (os.getpid(), sig))
    timer.start()
    return timer


def test_a_signal_arriving_in_code_that_swallows_exceptions_is_raised_at_the_next_wait():
    """What broke a TPU step: SIGTERM came while TensorFlow was being imported, whose code catches ``Exception``
    around an import; a handler that raised there lost the stop, and the step followed its slice on."""
    stop = StopSignals()
    with stop.installed():
        swallowed = False
        try:  # a library's broad except
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler runs in here
        except Exception:
            swallowed = True
        assert not swallowed and stop.received == signal.SIGTERM
        started = time.monotonic()
        with pytest.raises(TaskStopped, match="^the pipeline task received SIGTERM$"):
            stop.wait(60)
        assert time.monotonic() - started < 1


def test_a_signal_ends_a_wait_at_once_and_the_handlers_are_restored_after():
    before = signal.getsignal(signal.SIGINT)
    stop = StopSignals()
    with stop.installed():
        timer = _signal_soon(signal.SIGINT)
        started = time.monotonic()
        with pytest.raises(TaskStopped, match="received SIGINT$"):
            stop.wait(60)
        timer.join()
        assert time.monotonic() - started < 5
    assert signal.getsignal(signal.SIGINT) is before


def test_a_held_call_is_not_interrupted_and_the_stop_is_raised_when_it_has_answered():
    stop = StopSignals()
    answered = []
    with stop.installed():
        with pytest.raises(TaskStopped):
            with stop.held():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)
                answered.append("the job's name")
        assert answered == ["the job's name"]
        stop.ignore()  # the clean-up: neither the first signal raised again nor a second one felt
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        stop.check()
        stop.wait(0.01)


def test_a_stopped_step_does_not_wait_out_an_outage(monkeypatch):
    monkeypatch.setattr(cloud_retry, "FOLLOW_INITIAL_SECONDS", 0.01)
    monkeypatch.setattr(cloud_retry, "FOLLOW_MAXIMUM_SECONDS", 0.05)
    reads = []

    def down():
        reads.append(time.monotonic())
        raise exceptions.ServiceUnavailable("down")

    stop = StopSignals()
    with stop.installed():
        timer = _signal_soon()
        with pytest.raises(TaskStopped):
            cloud_retry.Patience(outage_seconds=3600).read(down, "reading job 1")
        timer.join()
    assert reads[-1] - reads[0] < 5
    task_signals.check_stop()  # nothing installed any more: nothing to raise


def test_anywhere_raises_inside_a_librarys_own_loop_of_sleeps():
    stop = StopSignals(anywhere=True)
    with stop.installed():
        timer = _signal_soon()
        with pytest.raises(TaskStopped):
            for _ in range(600):  # Beam's wait_until_finish, say
                time.sleep(0.1)
        timer.join()
