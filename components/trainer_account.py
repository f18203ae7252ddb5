"""The Trainer step's time account on a cloud backend, and its plan beside it.

A Vertex AI custom job or a TPU VM slice trains in processes of their own; the step that created and followed
it knows what they cannot: the job's queue and start-up (a custom job's ``create_time`` and ``start_time``,
a slice's states), and what ``--plan`` estimated for the run. After the training, the step puts into the run's
metrics.json (``trainer_module.recorder``) the account of its own time, from its process's start (or the
resource's creation, by an earlier attempt of the task) to now: the training's parts (the trainer's
``training_time_account``), the resource's spans around them, and the step's own time around the resource
(``TRAINER_STEP``); and the plan, with the hours the accelerators were held. The run page's metrics
(``components.run_page``) and the report show both.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from effnet_common import goodput


def add_step_account(
    model_run_uri: str,
    entered: float,
    around: Callable[[goodput.TimeAccount], list[goodput.Span]],
    planned: dict | None = None,
    held_hours: float | None = None,
) -> goodput.TimeAccount | None:
    """Writes the step's account (``recorder.RUN_ACCOUNT``) and ``planned`` with ``held_hours``
    (``recorder.PLANNED``) into the run's metrics.json; returns the account. Nothing when the training wrote
    no account (it did not run).

    Args:
      model_run_uri: the run's directory (local or on an object store).
      entered: when the step's executor was called.
      around: the resource's spans (its queue, provisioning, start-up, end) given the training's account.
      planned: ``components.accelerators.planned`` of the run on its accelerator, or None.
      held_hours: the hours the accelerators were held (billed).
    """
    from trainer_module import recorder

    training = recorder.read_time_account(model_run_uri, recorder.TRAINING_ACCOUNT)
    if training is None:
        return None
    resource = around(training)
    now = time.time()
    started = min([goodput.process_started(os.getpid()) or entered, *(span.start for span in resource)])
    spans = [goodput.Span(started, now, "TRAINER_STEP"), *training.spans, *resource]
    account = goodput.TimeAccount.of(spans, started, now, training.disrupted)
    values = {recorder.RUN_ACCOUNT: account.to_dict()}
    if planned is not None:
        values[recorder.PLANNED] = {**planned, "held_hours": held_hours}
    recorder.add_to_metrics(model_run_uri, values)
    return account


def after_vertex_job(
    model_run_uri: str, entered: float, job, input_dict, exec_properties, custom_config
) -> None:
    """The account of a Trainer step that ran a Vertex AI custom job (``vertex_training.run_job``'s job), and
    the plan on its compiled machines (``vertex_training.TimeoutRule``); a job that never ran has none."""
    from components import runtime_gate, vertex_training

    with goodput.best_effort("the Trainer step's time account"):
        held = vertex_training.held_hours(job)
        if held is None:
            return
        rule = vertex_training.TimeoutRule.from_config(custom_config)
        planned = rule.planned(runtime_gate.run_config(input_dict, exec_properties)) if rule else None
        around = lambda training: vertex_training.job_spans(job, training)  # noqa: E731
        add_step_account(model_run_uri, entered, around, planned, held)


def after_slice(model_run_uri: str, entered: float, settings, input_dict, exec_properties) -> None:
    """The account of a Trainer step that ran a TPU VM slice (``tpu_vm.SliceSettings``), with the slices'
    states around the training, and the plan on the slice (a reserved slice priced as on demand)."""
    from components import accelerators, runtime_gate, tpu_vm

    with goodput.best_effort("the Trainer step's time account"):
        config = runtime_gate.run_config(input_dict, exec_properties)
        machine = accelerators.get(settings.accelerator)
        planned = accelerators.planned(config, machine, spot=settings.tier == "spot")
        around = lambda training: tpu_vm.time_spans(model_run_uri, training)  # noqa: E731
        add_step_account(model_run_uri, entered, around, planned, tpu_vm.held_hours(model_run_uri))
