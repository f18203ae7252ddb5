"""Letting go of a finished tf.data iterator without waiting for it.

Deleting the iterator of an autotuned pipeline (``tf.data.AUTOTUNE`` anywhere in it) waits for the
pipeline's autotuning thread to end, and on TensorFlow 2.16 that thread often sleeps out its current re-tuning
interval (10 ms at first, doubling up to a minute) instead of ending when told to. TensorFlow lets go of
Python's lock while it deletes a tensor, so the deletion can wait on a thread of its own while the run goes
on. The thread is tracked (``effnet_common.quick_exit.track``): a process does not finalize its interpreter
while a deletion is still under way. docs/performance.md ("the stall at the end of the demo's training") has
the measurements.
"""

from __future__ import annotations

import threading

from effnet_common import quick_exit

THREAD_NAME = "effnet-iterator-release"


def release_in_background(holder: list) -> threading.Thread:
    """Empties ``holder`` on a daemon thread and returns the thread.

    ``holder`` must hold the only references to what it holds (an iterator made into it,
    ``holder = [iter(d)]``, and only ever passed on as ``holder[0]`` to calls that have returned), so that the
    last reference goes, and the wait with it, on that thread.
    """
    thread = threading.Thread(target=holder.clear, name=THREAD_NAME, daemon=True)
    quick_exit.track(thread)
    thread.start()
    return thread
