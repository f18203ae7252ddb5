"""The dry run: a config resolved to its plan, without training (``python -m trainer_module --plan`` and the
cloud runner's ``--plan``)."""

from __future__ import annotations

import json


def plan_report(config, lr_steps: list[int]) -> dict:
    """The dry run's JSON: the resolved config, its plan and the learning rate at the given steps."""
    from trainer_module.optim import schedules

    plan = config.plan
    schedule = schedules.build_schedule(config.schedule, plan.peak_learning_rate, plan.schedule_steps)
    return {
        "preset": config.name,
        "config": json.loads(config.to_json()),
        "derived": plan.to_dict(),
        "learning_rate": {str(step): float(schedule(step)) for step in lr_steps},
    }
