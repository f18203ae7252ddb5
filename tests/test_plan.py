"""The dry run: ``python -m trainer_module --preset NAME --plan`` prints the resolved run, trains nothing."""

import json

import pytest

from trainer_module.__main__ import main
from trainer_module.config import with_overrides
from trainer_module.presets import get_preset


def _plan(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_of_the_paper_headline_row(capsys):
    report = _plan(capsys, "--preset", "b5-lars-1024x65536", "--plan", "--lr-steps", "0,420,840,6842,6843")
    derived = report["derived"]
    assert report["preset"] == "b5-lars-1024x65536"
    assert report["config"]["optimizer"]["name"] == "lars"
    assert (derived["replicas"], derived["hosts"], derived["per_replica_batch_size"]) == (1024, 128, 64)
    assert derived["steps_per_epoch"] == pytest.approx(1_281_167 / 65536)
    assert (derived["warmup_steps"], derived["total_steps"]) == (840, 6842)
    assert derived["peak_learning_rate"] == pytest.approx(20.736)
    assert (derived["bn_group_replicas"], derived["bn_group_examples"], derived["input_size"]) == (
        2,
        128,
        456,
    )
    lr = report["learning_rate"]
    assert lr["0"] == 0.0
    assert lr["420"] == pytest.approx(20.736 / 2, rel=1e-6)
    # D = 6842 - 840 + 1 = 6003 decay steps, counted from max(1, step - 840).
    assert lr["840"] == pytest.approx((20.736 - 0.1) * (1 - 1 / 6003) ** 2 + 0.1, rel=1e-6)
    assert lr["6842"] == pytest.approx((20.736 - 0.1) * (1 / 6003) ** 2 + 0.1, rel=1e-5)
    assert lr["6843"] == pytest.approx(0.1, rel=1e-6)


def test_plan_follows_overrides(capsys):
    report = _plan(
        capsys, "--preset", "b2-rmsprop-128x4096", "--plan", "--set", "data.num_cores=8", "--set",
        "data.global_batch_size=2048", "--lr-steps", "5003",
    )  # fmt: skip
    derived = report["derived"]
    assert (derived["replicas"], derived["hosts"], derived["per_replica_batch_size"]) == (8, 1, 256)
    assert derived["bn_group_replicas"] == 1  # the reference's rule: per-replica statistics up to 8 replicas
    assert derived["bn_group_examples"] == 256
    ghost = _plan(capsys, "--preset", "b2-rmsprop-128x4096", "--plan", "--set", "data.num_cores=8", "--set",
                  "data.global_batch_size=2048", "--set", "model.bn_virtual_batch=128")  # fmt: skip
    assert (ghost["derived"]["bn_group_replicas"], ghost["derived"]["bn_group_examples"]) == (1, 128)
    assert derived["warmup_steps"] == int(5 * 1_281_167 / 2048) == 3127
    # 5003 / (2.4 * 625.57) = 3.33: three decays of 0.97 from the peak 0.128.
    assert report["learning_rate"]["5003"] == pytest.approx(0.128 * 0.97**3, rel=1e-6)


def test_plan_reports_a_bad_override_in_one_line(capsys):
    assert main(["--preset", "demo", "--plan", "--set", "schedule.kind=cosine"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: schedule.kind='cosine' is not one of 'polynomial', 'exponential'"


def test_a_training_run_still_needs_its_files(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--preset", "demo"])
    assert exit_info.value.code == 2
    assert "a training run needs --train-files, --eval-files, --model-dir" in capsys.readouterr().err


@pytest.mark.parametrize(
    "steps_per_epoch_examples, batch, epochs, every, expected",
    [
        (400, 32, 2, 1, [12, 25]),  # 12.5 steps per epoch: evaluations on the truncated epoch boundaries
        (16, 8, 3, 1, [2, 4, 6]),
        (1438, 64, 30, 5, [112, 224, 337, 449, 561, 674]),  # the demo: every 5 epochs of 22.47 steps
    ],
)
def test_evaluations_fall_on_epoch_boundaries(steps_per_epoch_examples, batch, epochs, every, expected):
    config = with_overrides(
        get_preset("smoke"),
        [
            f"data.num_train_examples={steps_per_epoch_examples}",
            f"data.global_batch_size={batch}",
            f"loop.train_epochs={epochs}",
            f"loop.eval_every_epochs={every}",
        ],
    )
    step, evaluations = 0, []
    while step < config.plan.total_steps:
        step = config.plan.next_eval_step(step)
        evaluations.append(step)
    assert evaluations == expected
