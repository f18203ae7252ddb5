"""What a run's time account costs at the paper's size (goal: under 1% of the time it accounts for).

The paper's headline run trains about 6,800 steps of a 65,536 batch in about an hour (0.53 s a step). This
script records a training of that shape as the trainer does (``trainer_module.goodput_log``: every step's start,
an evaluation and a checkpoint every 195 steps, the file rewritten after each call of 195 steps), and a
training ten times longer in steps (109,000 steps, the 4,096 batch's), with one preemption each, then computes
their accounts (``effnet_common.goodput``). It prints, best of ``--repeats``:

- the recording's cost per training call (building the records and rewriting the attempt's file, largest at
  the end of the run) against the call's own time at 0.53 s a step;
- the account's computation against the hour it accounts for.

    .venv/bin/python benchmarks/goodput_account.py [--repeats 3] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import numpy as np

GOAL_SHARE = 0.01
STEP_SECONDS = 0.53  # the paper's hour over its steps
CALL_STEPS = 195  # an evaluation interval of the headline run, one compiled call (loop.steps_per_loop 0)


def record(directory: str, steps: int) -> tuple[float, float]:
    """Records a training of ``steps`` steps preempted at 60% and resumed from its last checkpoint; returns
    (the slowest call's recording seconds, the account's seconds)."""
    from effnet_common import goodput
    from trainer_module import goodput_log
    from trainer_module.recorder import TrainingCall

    clock = 1_800_000_000.0
    slowest = 0.0
    preempt = int(steps * 0.6) // CALL_STEPS * CALL_STEPS + CALL_STEPS // 2
    for first, last in ((0, preempt), (preempt - preempt % CALL_STEPS, steps)):
        log = goodput_log.GoodputLog(directory, clock, clock + 5)
        clock += 20
        for start in range(first, last, CALL_STEPS):
            num = min(CALL_STEPS, last - start)
            times = np.arange(num) * STEP_SECONDS
            zeros = np.zeros(num)
            call = TrainingCall(start + num, num * STEP_SECONDS, zeros, zeros, zeros, zeros, times)
            began = time.perf_counter()
            log.training_call(call, clock)
            slowest = max(slowest, time.perf_counter() - began)
            clock += num * STEP_SECONDS
            log.span("EVAL", clock, clock + 4)
            log.span("CHECKPOINT_SAVE", clock + 4, clock + 5)
            clock += 5
        if last == steps:
            log.job_ended(clock)
        clock += 300  # the preempted slice replaced
    began = time.perf_counter()
    account = goodput_log.account(directory)
    took = time.perf_counter() - began
    assert account.disruptions == 1 and account.parts[goodput.GOODPUT] > 0, account.parts
    return slowest, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default="")
    args = parser.parse_args()
    for steps in (6_800, 109_000):
        best_call = best_account = float("inf")
        for _ in range(args.repeats):
            directory = tempfile.mkdtemp(prefix="goodput-", dir=args.workdir or None)
            try:
                slowest, took = record(directory, steps)
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            best_call, best_account = min(best_call, slowest), min(best_account, took)
        call_share = best_call / (CALL_STEPS * STEP_SECONDS)
        account_share = best_account / 3600
        print(
            f"{steps:>7,} steps: recording {best_call * 1000:.1f} ms a call = {call_share:.2e} of the call "
            f"({call_share / GOAL_SHARE:.3f} of the {GOAL_SHARE:.0%} goal); account {best_account:.2f} s = "
            f"{account_share:.2e} of an hour ({account_share / GOAL_SHARE:.3f} of the goal)"
        )


if __name__ == "__main__":
    main()
