"""A run resolved once (trainer_module.resolve): which source wins, how a search's epochs carry over, the
shards' sizes checked with everything applied, and the file a trial or a tuned run is handed."""

import json

import pytest

from trainer_module import presets
from trainer_module.config import replace
from trainer_module.resolve import (
    SCHEDULE_EPOCHS,
    UNSET,
    DataSizes,
    ResolvedRun,
    resolve_run,
    search_values,
)

DEMO = presets.get_preset("demo")


def test_sources_apply_in_order_search_then_person_then_target_then_data():
    found = {"schedule.lr_per_256": 0.5, "optimizer.weight_decay": 1e-4, "tuner/epochs": 4}
    run = resolve_run(
        DEMO,
        {"optimizer.weight_decay": 2e-4, "loop.target_top1": 0.5},
        hyperparameters=found,
        target_top1=0.9,
        data=DataSizes(60000, 10000, num_classes=10),
    )
    config = run.config
    assert config.schedule.lr_per_256 == 0.5  # the search's
    assert config.optimizer.weight_decay == 2e-4  # the person's setting wins over the search's
    assert run.target_top1 == 0.9  # a given target wins over a --set one
    assert (run.epoch_size, config.data.num_eval_examples, config.model.num_classes) == (60000, 10000, 10)
    assert dict(run.tuned) == {"schedule.lr_per_256": 0.5}  # what stayed from the search, bookkeeping dropped


def test_the_target_is_the_configs_unless_given():
    assert resolve_run(DEMO).target_top1 == DEMO.loop.target_top1
    assert resolve_run(DEMO, target_top1=UNSET).target_top1 == DEMO.loop.target_top1
    assert resolve_run(DEMO, target_top1=None).target_top1 is None


def test_a_searchs_epoch_settings_are_shares_of_the_runs_schedule():
    values = {"schedule.warmup_epochs": 1.0, SCHEDULE_EPOCHS: 4}
    assert search_values(values, train_epochs=20) == {"schedule.warmup_epochs": 5.0}
    assert search_values(values, train_epochs=4) == {"schedule.warmup_epochs": 1.0}
    # The run's epochs are the person's when they set them.
    run = resolve_run(DEMO, {"loop.train_epochs": 40}, hyperparameters=values)
    assert run.config.schedule.warmup_epochs == 10.0
    # KerasTuner's HyperParameters config, as TFX's Tuner writes it, is read the same way.
    assert search_values({"space": [], "values": {"optimizer.lars_eeta": 0.002}}) == {
        "optimizer.lars_eeta": 0.002
    }
    with pytest.raises(ValueError, match="JSON object"):
        search_values([1, 2])


def test_the_shards_sizes_are_checked_with_everything_else_applied():
    """Batch 4096 of the demo preset exceeds its own 1,438 images but not 60,000 sharded ones: one check
    with the data applied, not one before it."""
    with pytest.raises(ValueError, match="global_batch_size=4096 exceeds"):
        resolve_run(DEMO, {"data.global_batch_size": 4096})
    run = resolve_run(DEMO, {"data.global_batch_size": 4096}, data=DataSizes(60000, 10000))
    assert run.config.data.global_batch_size == 4096 and run.epoch_size == 60000
    # An explicit count loses to the manifest's: the run trains on the shards' epoch.
    run = resolve_run(DEMO, {"data.num_train_examples": 16}, data=DataSizes(500, 100))
    assert run.epoch_size == 500


def test_resolving_against_the_same_data_again_changes_nothing():
    run = resolve_run(DEMO, hyperparameters={"schedule.lr_per_256": 0.5}, data=DataSizes(5000, 1000, 10))
    assert run.with_data(DataSizes(5000, 1000, 10)) == run
    assert run.with_data(None) is run
    moved = run.with_data(DataSizes(6000, 1000, 10))
    assert moved.epoch_size == 6000 and moved.tuned == run.tuned


def test_the_file_a_trial_is_handed_round_trips_and_reads_a_runs_config_json():
    run = resolve_run(DEMO, {"loop.train_epochs": 70}, hyperparameters={"schedule.lr_per_256": 0.25})
    again = ResolvedRun.from_json(run.to_json())
    assert again.config == run.config and dict(again.tuned) == dict(run.tuned)
    # A run's config.json ({"config", "plan", "tuned"}) and a bare config are read too.
    saved = json.dumps({"config": run.config.to_dict(), "plan": {}, "tuned": {"schedule.lr_per_256": 0.25}})
    assert ResolvedRun.from_json(saved).config == run.config
    assert ResolvedRun.from_json(run.config.to_json()).config == run.config
    with pytest.raises(ValueError, match="not valid JSON"):
        ResolvedRun.from_json("{")
    with pytest.raises(ValueError):
        ResolvedRun.from_json(json.dumps({"config": {"loop": {"nope": 1}}}))


def test_a_refused_value_names_its_key():
    with pytest.raises(TypeError, match="loop.train_epochs"):
        resolve_run(DEMO, {"loop.train_epochs": "3"})
    with pytest.raises(ValueError, match="optimizer.nope"):
        resolve_run(DEMO, hyperparameters={"optimizer.nope": 1.0})
    assert replace(DEMO, {}) == DEMO
