"""Our goodput calculator (effnet_common.goodput) against the library it follows, ml-goodput-measurement 0.2.3: on
one scripted two-attempt training record with a preemption, written by the library's own recorder and read as it
is, both give the same elapsed time, goodput, seconds in every badput bucket the library reports and disruption
count.

The library records to Cloud Logging only; its calculator reads through the private ``cloud_logger=`` seam (the
one its own tests use) from an in-memory stand-in here, with a fresh cache directory, and nothing reaches the
network (every connection and name lookup fails while the test runs).
"""

import datetime
import socket

import pytest
from ml_goodput_measurement import goodput as library

from effnet_common import goodput

JOB = "effnet-goodput-check"
T0 = 1_700_000_000.0  # the scripted times are offsets from it, whole seconds: exact in floating point
# An evaluation inside the step gap 8 -> 9 of the second attempt (191-195 s).
EVAL = (192.0, 194.0)


class CloudLoggerStandIn:
    """What ``GoodputRecorder`` and ``GoodputCalculator`` use of the library's ``_CloudLogger``, in memory: the
    payloads in the order written, each with an insert id (its index); a read returns those after
    ``last_entry_info`` and the (timestamp, id) of the last one, as Cloud Logging's ascending query does."""

    def __init__(self, job_name: str):
        self.job_name = job_name
        self.job_start_time = None
        self.payloads: list[dict] = []

    def write_cloud_logging_entry(self, entry) -> None:
        if entry is not None and entry[library._JOB_NAME] == self.job_name:
            self.payloads.append(dict(entry))

    def flush(self) -> None:
        pass

    def read_cloud_logging_entries(self, start_time=None, end_time=None, last_entry_info=None):
        first = int(last_entry_info[1]) + 1 if last_entry_info and last_entry_info[1] is not None else 0
        new = [dict(p) for p in self.payloads[first:]]
        if self.job_start_time is None:
            starts = [p[library._JOB_START_TIME] for p in new if library._JOB_START_TIME in p]
            if starts:
                self.job_start_time = datetime.datetime.fromtimestamp(starts[0], datetime.timezone.utc)
        if not new:
            return [], (None, None)
        last = len(self.payloads) - 1
        return new, (library.get_timestamp_from_log_entry(new[-1]), f"{last:08d}")


def _at(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(T0 + seconds, datetime.timezone.utc)


def _record(recorder: library.GoodputRecorder) -> None:
    """The training, written by the library's own recorder (its payload format, backfilled times).

    Attempt 1 (0-75 s): device set-up 2-12, preparation 12-20, steps 0-7 starting at 25 (a 20 s first step, then
    5 s each); preempted after step 7 began, with no job end. Its last checkpoint is of step 5 (5 steps done).
    Attempt 2 (150-199 s): device set-up 151-159, preparation 159-165, step 5 again at 168 (the restart), a 15 s
    first step, then 4 s each to step 10, with an evaluation in the gap 8 -> 9; the job ends at step 10's record
    (the end of training: our record's last step start marks the end of the last step).
    """
    recorder.record_job_start_time(_at(0))
    recorder.record_tpu_init_start_time(_at(2))
    recorder.record_tpu_init_end_time(_at(12))
    recorder.record_training_preparation_start_time(_at(12))
    recorder.record_training_preparation_end_time(_at(20))
    for step, start in enumerate([25, 45, 50, 55, 60, 65, 70, 75]):
        recorder.record_step_start_time(step, _at(start))

    recorder.record_job_start_time(_at(150))
    recorder.record_tpu_init_start_time(_at(151))
    recorder.record_tpu_init_end_time(_at(159))
    recorder.record_training_preparation_start_time(_at(159))
    recorder.record_training_preparation_end_time(_at(165))
    for step, start in zip(range(5, 11), [168, 183, 187, 191, 195, 199], strict=True):
        if step == 9:
            recorder.record_custom_badput_event_start_time(_at(EVAL[0]), custom_badput_event_type="eval")
            recorder.record_custom_badput_event_end_time(_at(EVAL[1]), custom_badput_event_type="eval")
        recorder.record_step_start_time(step, _at(start))
    recorder.record_job_end_time(_at(199))
    recorder.flush()


def _attempts(payloads: list[dict]) -> list[goodput.Attempt]:
    """The library's payloads read by ``Attempt.of_records``, one attempt from each ``job_start_time`` on."""
    attempts: list[list[dict]] = []
    for payload in payloads:
        record = {key: value for key, value in payload.items() if key != library._JOB_NAME}
        if goodput.JOB_START in record:
            attempts.append([])
        attempts[-1].append(record)
    return [goodput.Attempt.of_records(records) for records in attempts]


@pytest.fixture
def no_network(monkeypatch):
    """Any connection or name lookup raises while the test runs."""

    def refused(*args, **kwargs):
        raise OSError("the goodput comparison must not reach the network")

    monkeypatch.setattr(socket, "getaddrinfo", refused)
    monkeypatch.setattr(socket, "create_connection", refused)
    monkeypatch.setattr(socket.socket, "connect", refused)
    monkeypatch.setattr(socket.socket, "connect_ex", refused)


def test_our_record_keys_are_the_librarys():
    assert (goodput.JOB_START, goodput.JOB_END) == (library._JOB_START_TIME, library._JOB_END_TIME)
    assert (goodput.STEP_COUNT, goodput.STEP_START) == (library._STEP_COUNT, library._STEP_START_TIME)
    assert goodput.CUSTOM_EVENT == library._CUSTOM_BADPUT_EVENT_TYPE
    assert goodput.SPAN_KEYS == {
        "tpu_init": (library._TPU_INIT_START_TIME, library._TPU_INIT_END_TIME),
        "training_prep": (library._TRAINING_PREPARATION_START_TIME, library._TRAINING_PREPARATION_END_TIME),
        "custom": (library._CUSTOM_BADPUT_EVENT_START_TIME, library._CUSTOM_BADPUT_EVENT_END_TIME),
    }


def test_our_account_matches_the_librarys_on_one_record(tmp_path, no_network):
    logger = CloudLoggerStandIn(JOB)
    _record(library.GoodputRecorder(JOB, "goodput", logging_enabled=True, cloud_logger=logger))

    calculator = library.GoodputCalculator(
        JOB, "goodput", cloud_logger=logger, cache_dir=str(tmp_path / "cache")
    )
    calculator.get_job_goodput(include_badput_breakdown=True)
    details = calculator.get_job_goodput_details()
    theirs = {
        bucket.name: seconds
        for bucket, seconds in details["badput_time"].items()
        if bucket != library.BadputType.CUSTOM_BADPUT_EVENTS
    }
    theirs.update(details["badput_time"][library.BadputType.CUSTOM_BADPUT_EVENTS])
    productive = details["goodput_time"][library.GoodputType.TOTAL]

    account = goodput.training_account(_attempts(logger.payloads))
    ours = account.parts

    # The library's figures, worked out by hand: the comparison below is between numbers that mean something.
    # Recovery: step 7's start (75) to the restart (150). Wasted: attempt 1's gaps 5 -> 6 and 6 -> 7. OTHER: 0-2,
    # 20-25 (before the first step), 150-151 and 165-168.
    expected = {
        "TPU_INITIALIZATION": 10.0 + 8.0,
        "TRAINING_PREP": 8.0 + 6.0,
        "WASTED_PROGRESS_FROM_DISRUPTION": 10.0,
        "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION": 75.0,
        "EVAL": 2.0,
        "OTHER": 2.0 + 5.0 + 1.0 + 3.0,
    }
    assert {bucket: theirs[bucket] for bucket in expected} == pytest.approx(expected, abs=1e-9)
    assert details["total_elapsed_time"] == pytest.approx(199.0, abs=1e-9)
    assert details["disruption_count"] == 1
    # What the scenario records nothing for, the library reports as nothing (so every bucket it reports is
    # compared), and our account has no part besides the ones compared.
    rest = set(theirs) - set(expected) - {"PROGRAM_STARTUP"}
    not_recorded = {
        "DATA_LOADING_SYNC",
        "DATA_LOADING_ASYNC",
        "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
        "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
    }
    assert rest <= not_recorded
    assert all(theirs[bucket] == 0.0 for bucket in rest)
    assert set(ours) == {*expected, "PROGRAM_STARTUP", goodput.GOODPUT}

    # Ours against theirs, to 1 us (the times are whole seconds, so both are in fact exact).
    assert account.wall_seconds == pytest.approx(details["total_elapsed_time"], abs=1e-6)
    for bucket in expected:
        assert ours[bucket] == pytest.approx(theirs[bucket], abs=1e-6), bucket
    assert account.disruptions == details["disruption_count"]
    # Goodput and PROGRAM_STARTUP: the first step's excess over the mean step, both taken without the evaluation
    # inside their gaps (attempt 2: (4 + 4 + 2 + 4) / 4 = 3.5 s, so PROGRAM_STARTUP 15 + 11.5 = 26.5 s).
    assert ours[goodput.GOODPUT] == pytest.approx(productive, abs=1e-6)
    assert ours["PROGRAM_STARTUP"] == pytest.approx(theirs["PROGRAM_STARTUP"], abs=1e-6)
    assert productive + theirs["PROGRAM_STARTUP"] == pytest.approx(20 + 4 * 5 + 15 + 4 * 4 - 2, abs=1e-9)
