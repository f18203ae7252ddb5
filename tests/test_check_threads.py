"""Images checked on several threads per worker (beam_preprocess.threads): same results, same bytes, in order."""

import hashlib
import os
import threading
import time

import pytest

from beam_preprocess import threads
from beam_preprocess.config import ShardingConfig
from beam_preprocess.run import run as shard
from effnet_common import schema


@pytest.mark.parametrize("count", [1, 3])
def test_results_come_back_in_input_order_whatever_the_threads_timing(count):
    def slow_for_small(n):
        time.sleep(0.002 * (10 - n % 10))  # later items finish first
        return n * n, threading.current_thread().name

    results = list(threads.ordered_map(slow_for_small, range(40), count))
    assert [item for item, _ in results] == list(range(40))
    assert [value for _, (value, _) in results] == [n * n for n in range(40)]
    names = {name for _, (_, name) in results}
    if count == 1:
        assert names == {threading.current_thread().name}  # inline, no pool
    else:
        assert all(name.startswith("beam_preprocess-check") for name in names) and len(names) > 1


def test_items_are_read_at_most_a_window_ahead_of_the_consumer():
    pulled = []

    def items():
        for n in range(100):
            pulled.append(n)
            yield n

    for consumed, (item, _) in enumerate(threads.ordered_map(lambda n: n, items(), 3)):
        assert item == consumed
        assert len(pulled) - consumed <= 2 * 3  # memory stays bounded by the window


def test_one_pool_per_process_and_size():
    assert threads.shared_pool(2) is threads.shared_pool(2)
    assert threads.shared_pool(2) is not threads.shared_pool(3)


def _digests(directory):
    found = {}
    for root, _, files in os.walk(directory):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                found[os.path.relpath(os.path.join(root, name), directory)] = hashlib.sha256(
                    f.read()
                ).hexdigest()
    return found


def test_shards_are_byte_identical_for_any_number_of_check_threads_or_worker_processes(
    quirky_archives, tmp_path
):
    """In the Beam worker on 1 or 3 check threads, or on 2 worker processes (beam_preprocess.processes): the same
    shards, failures and fixes."""
    outputs = []
    for count, worker_processes in ((1, 0), (3, 0), (0, 2)):
        out = tmp_path / f"threads-{count}-processes-{worker_processes}"
        result = shard(
            ShardingConfig(
                output_dir=str(out),
                train_archive=quirky_archives.train_archive,
                val_archive=quirky_archives.val_archive,
                train_shards=3,
                val_shards=2,
                members_per_unit=50,
                max_failures=100,
                check_threads=count,
                worker_processes=worker_processes,
            )
        )
        assert result.manifest.failures  # the quirky archives' bad images are found either way
        digests = _digests(out)
        digests.pop("manifest.json")  # records the options, check_threads and worker_processes included
        outputs.append((digests, result.manifest.failures, result.manifest.splits[schema.TRAIN].fixed))
    assert outputs[0] == outputs[1] == outputs[2] and len(outputs[0][0]) == 5


def test_a_negative_worker_process_count_is_refused_naming_the_setting(tmp_path):
    with pytest.raises(ValueError, match="worker_processes"):
        ShardingConfig(output_dir=str(tmp_path), train_archive="a.tar", worker_processes=-1)


def test_negative_thread_count_is_refused_naming_the_setting(tmp_path):
    with pytest.raises(ValueError, match="check_threads"):
        ShardingConfig(output_dir=str(tmp_path), train_archive="a.tar", check_threads=-1)
