"""Work on several threads of a worker, results in input order: checking a unit's images, and the reads of a
shard writer on an object store (``spill.RecordReader``).

Decoding (``images.check_and_fix``) is most of a worker's time, and PIL releases the GIL while libjpeg runs,
so a worker that decodes on a few threads keeps more than one core busy while its own thread reads the
archive, builds Examples and writes the spill. That matters whenever a runner hands work out in fixed
portions, as the DirectRunner does (each stage's input split once between its workers, no rebalancing): a
worker that finishes its portion early leaves its core to the other worker's decode threads instead of
idling (docs/performance.md, 'Sharding').

Results come back in input order whatever the threads' timing, so the spill and the shards stay
byte-identical; at most ``window`` items are in flight, so memory stays bounded.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import os
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def default_threads() -> int:
    """One decode thread per core of the machine the worker runs on."""
    return os.cpu_count() or 1


@functools.cache
def shared_pool(threads: int, purpose: str = "check") -> concurrent.futures.ThreadPoolExecutor:
    """One pool per process, purpose and size, shared by every DoFn instance and bundle thread of a worker."""
    return concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix=f"beam_preprocess-{purpose}")


def ordered_map(
    fn: Callable[[T], R], items: Iterable[T], threads: int, purpose: str = "check"
) -> Iterator[tuple[T, R]]:
    """(item, fn(item)) for every item, in input order; ``fn`` runs on ``threads`` threads (inline for 1).

    An exception of ``fn`` surfaces here, when its item's turn comes. Items are taken from ``items`` on the
    caller's thread, as results are consumed, so ``items`` may itself be an ``ordered_map`` of the same pool.
    """
    if threads <= 1:
        for item in items:
            yield item, fn(item)
        return
    pool = shared_pool(threads, purpose)
    window = 2 * threads
    pending: collections.deque = collections.deque()
    try:
        for item in items:
            pending.append((item, pool.submit(fn, item)))
            if len(pending) >= window:
                done, future = pending.popleft()
                yield done, future.result()
        while pending:
            done, future = pending.popleft()
            yield done, future.result()
    finally:  # the caller stopped early (an error, or it had what it needed): drop the work not started
        for _, future in pending:
            future.cancel()
