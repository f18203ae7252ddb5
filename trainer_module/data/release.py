"""Letting go of a finished tf.data iterator without waiting for it.

An iterator of an autotuned pipeline (``tf.data.AUTOTUNE`` anywhere in it) runs a model thread that re-tunes the
pipeline at growing intervals: 10 ms at first, doubling up to a minute. Deleting the iterator waits for that
thread to end, and on TensorFlow 2.16 the thread often sleeps out its current interval instead of ending when
told to: the deletion of the demo's training stream, after 30 s of training, stalled the run for 19-22 s in half
of the runs (caught with gdb: the main thread in ``RootDataset::Iterator``'s destructor, the model thread in
``Model::OptimizeLoop``'s timed wait), and a long run's evaluation streams can stall for up to a minute each.
TensorFlow lets go of Python's lock while it deletes a tensor, so the deletion can wait on a thread of its own
while the run goes on (to the export, the next training interval). A process that ends before the wait is over
loses nothing: the iterator holds no state that outlives it.
"""

from __future__ import annotations

import threading

THREAD_NAME = "effnet-iterator-release"


def release_in_background(holder: list) -> threading.Thread:
    """Empties ``holder`` on a daemon thread and returns the thread.

    ``holder`` must hold the only references to what it holds (an iterator made into it, ``holder = [iter(d)]``,
    and only ever passed on as ``holder[0]`` to calls that have returned), so that the last reference goes,
    and the wait with it, on that thread.
    """
    thread = threading.Thread(target=holder.clear, name=THREAD_NAME, daemon=True)
    thread.start()
    return thread
