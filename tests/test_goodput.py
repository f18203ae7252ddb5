"""The time account's rules (effnet_common.goodput): every second of the wall time in one part, steps as the gaps
between their starts, the first step's excess as trace and compile, a disruption's redone steps and recovery."""

import pytest

from effnet_common import goodput
from effnet_common.goodput import Span
from pipeline import run_account


def _steps(first: int, starts: list[float]) -> list[dict]:
    return [{goodput.STEP_COUNT: first + i, goodput.STEP_START: t} for i, t in enumerate(starts)]


def _span(kind: str, start: float, end: float, part: str = "") -> list[dict]:
    """A span's two records, its start and its end (a custom event's carry its type)."""
    start_key, end_key = goodput.SPAN_KEYS[kind]
    typed = {goodput.CUSTOM_EVENT: part} if kind == "custom" else {}
    return [{start_key: start, **typed}, {end_key: end, **typed}]


def _custom(part: str, start: float, end: float) -> list[dict]:
    return _span("custom", start, end, part)


def test_each_second_goes_to_the_most_specific_part_and_the_parts_add_up_to_the_wall_time():
    spans = [
        Span(0, 100, "OTHER"),
        Span(10, 50, goodput.GOODPUT),
        Span(20, 25, "EVAL"),  # inside the steps: taken out of them
        Span(40, 70, "WAITING_FOR_CAPACITY"),  # outranks the steps it overlaps
        Span(110, 120, "PROVISIONING"),  # beyond the window: clipped away
    ]
    account = goodput.TimeAccount.of(spans, -5, 105)
    assert account.parts == {
        "OTHER": 40.0,  # 0-10 and 70-100; -5-0 and 100-105 unaccounted
        "WAITING_FOR_CAPACITY": 30.0,
        goodput.GOODPUT: 25.0,
        goodput.UNACCOUNTED: 10.0,
        "EVAL": 5.0,
    }
    assert sum(account.parts.values()) == pytest.approx(account.wall_seconds) == 110
    assert [s.part for s in account.spans] == [
        goodput.UNACCOUNTED, "OTHER", goodput.GOODPUT, "EVAL", goodput.GOODPUT,
        "WAITING_FOR_CAPACITY", "OTHER", goodput.UNACCOUNTED,
    ]  # fmt: skip
    assert account.goodput == pytest.approx(25 / 110)


def _attempt(*records) -> goodput.Attempt:
    return goodput.Attempt.of_records(list(records))


def test_a_training_is_split_by_the_goodput_librarys_definitions():
    """One attempt: device set-up, preparation, a first step 5 s longer than the others (trace and compile), an
    evaluation and a checkpoint between two calls (a pause: step 4 recorded twice), the end of the job."""
    attempt = _attempt(
        {goodput.JOB_START: 100.0},
        *_span("tpu_init", 101.0, 103.0),
        *_span("training_prep", 103.0, 106.0),
        *_steps(0, [106.0, 112.0, 113.0, 114.0, 115.0]),  # the first call: steps 0-3 and the end of step 3
        *_custom("EVAL", 115.5, 117.5),
        *_custom("CHECKPOINT_SAVE", 117.5, 118.0),
        *_steps(4, [118.5, 119.5, 120.5]),  # the second call: steps 4-5 and the end of step 5
        *_custom("EXPORT", 121.0, 123.0),
        *_custom("EVAL", 130.0, 130.0)[:1],  # a start without its end (the process died in it): left out
        {goodput.JOB_END: 123.0},
    )
    account = goodput.training_account([attempt])
    parts = account.parts
    assert (account.start, account.end) == (100.0, 123.0)
    # Six steps: 6 + 1 + 1 + 1 (first call) + 1 + 1; the first one's excess over the mean of the others (1 s).
    assert parts["PROGRAM_STARTUP"] == pytest.approx(5.0)
    assert parts[goodput.GOODPUT] == pytest.approx(6 + 3 + 2 - 5)
    assert parts["TPU_INITIALIZATION"] == 2.0 and parts["TRAINING_PREP"] == 3.0
    assert (parts["EVAL"], parts["CHECKPOINT_SAVE"], parts["EXPORT"]) == (2.0, 0.5, 2.0)
    # What no record covers inside the job: 100-101, the host between calls (115-115.5, 118-118.5), 120.5-121.
    assert parts["OTHER"] == pytest.approx(2.5)
    assert goodput.UNACCOUNTED not in parts and account.disruptions == 0
    assert sum(parts.values()) == pytest.approx(23.0)


def test_a_preempted_attempt_costs_its_redone_steps_and_the_recovery_until_the_next_start():
    first = _attempt({goodput.JOB_START: 0.0}, *_steps(0, [1.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]))
    # Killed after step 6 began, no end recorded; the next attempt restores the checkpoint of step 3.
    second = _attempt(
        {goodput.JOB_START: 20.0}, *_steps(3, [22.0, 25.0, 26.0, 27.0]), {goodput.JOB_END: 27.0}
    )
    account = goodput.training_account([second, first])  # in any order
    parts = account.parts
    assert account.disruptions == 1 and account.redone_steps == 3  # steps 3, 4 and 5 of the first attempt
    assert account.disrupted == ((20.0, 3),)
    assert parts["WASTED_PROGRESS_FROM_DISRUPTION"] == pytest.approx(3.0)
    assert parts["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] == pytest.approx(20.0 - 8.0)
    # Goodput: the first attempt's steps 0-2 (2 + 1 + 1) and the second's 3-5 (3 + 1 + 1), less each first
    # step's excess over its attempt's mean: 1 s in the first (2 against 1), 2 s in the second (3 against 1).
    assert parts["PROGRAM_STARTUP"] == pytest.approx(3.0)
    assert parts[goodput.GOODPUT] == pytest.approx(4 + 5 - 3)
    assert sum(parts.values()) == pytest.approx(27.0)


def test_a_training_that_ended_and_was_continued_later_starts_a_new_account():
    """A training stopped by its target, continued later with another target from its last checkpoint: the
    continuation's account is its own; an attempt that died before training (no step) does not hide the
    steps a preemption cost."""
    first = _attempt({goodput.JOB_START: 0.0}, *_steps(0, [1.0, 2.0, 3.0]), {goodput.JOB_END: 4.0})
    second = _attempt({goodput.JOB_START: 50.0}, *_steps(2, [51.0, 52.0, 53.0, 54.0]))  # preempted
    died = _attempt({goodput.JOB_START: 60.0})  # lost while it prepared
    third = _attempt({goodput.JOB_START: 70.0}, *_steps(3, [71.0, 72.0, 73.0]), {goodput.JOB_END: 74.0})
    assert goodput.current([first, second, died, third]) == [second, died, third]
    account = goodput.training_account([third, died, second, first])
    assert (account.start, account.end) == (50.0, 74.0) and account.attempts == ((50, 54), (60, 60), (70, 74))
    assert account.disrupted == ((70.0, 2),)  # steps 3 and 4 of the second attempt, trained again
    # The recovery: from the preempted attempt's last step to the start of the one that trained again.
    assert account.parts["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] == pytest.approx(70.0 - 54.0)
    assert goodput.UNACCOUNTED not in account.parts


def test_the_one_line_account_names_the_largest_parts_and_sums_a_disruptions_parts():
    spans = [
        Span(0, 40, goodput.GOODPUT),
        Span(40, 70, "PROVISIONING"),
        Span(70, 80, "WASTED_PROGRESS_FROM_DISRUPTION"),
        Span(80, 95, "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"),
        Span(95, 100, "Evaluator"),
    ]
    account = goodput.TimeAccount.of(spans, 0, 100, disrupted=[(80.0, 7), (500.0, 2)])  # one outside
    assert account.disruptions == 1 and account.redone_steps == 7
    assert account.one_line() == (
        "goodput 40% of 1m40s: 30.0s provisioning, 25.0s lost to 1 disruption, 5.0s Evaluator"
    )
    again = goodput.TimeAccount.from_dict(account.to_dict())
    assert again == account and again.to_dict()["parts"] == account.to_dict()["parts"]


def test_a_stopped_command_and_the_one_that_resumes_it_make_one_run(tmp_path):
    """The local runner's record: the commands since the last that did not stop are one run, the time between
    them a part of its own; a finished command ends a run."""
    root = str(tmp_path)
    step = run_account.Step
    commands = [
        run_account.Command(0.0, 10.0, run_account.FINISHED, (step("Trainer", 2.0, 9.0),)),
        run_account.Command(20.0, 30.0, run_account.STOPPED, (step("ImageNetShardGen", 23.0, 25.0), step("Trainer", 25.0, 30.0))),
        run_account.Command(40.0, 50.0, run_account.FINISHED, (step("Trainer", 44.0, 47.0, True), step("Pusher", 47.5, 48.0))),
    ]  # fmt: skip
    for command in commands:
        run_account.append(root, "effnet-demo", command)
    found = run_account.run_commands(root, "effnet-demo")
    assert found == commands[1:]
    account = run_account.account(found, training=None)
    assert (account.start, account.end) == (20.0, 50.0)
    assert account.parts == {
        "STOPPED": 10.0,
        "TRAINER_STEP": 8.0,
        "COMMAND_STARTUP": 7.0,
        "ImageNetShardGen": 2.0,
        "REPORT": 2.0,
        "ORCHESTRATION": 0.5,
        "Pusher": 0.5,
    }
