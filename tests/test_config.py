"""Trainer config: derived values, presets against the paper's Table 2, JSON round trip, overrides, errors."""

import ast
import dataclasses
import pathlib
import subprocess
import sys

import pytest

from trainer_module.config import (
    DataConfig,
    LoopConfig,
    ModelConfig,
    OptimizerConfig,
    ScheduleConfig,
    TrainerConfig,
    with_overrides,
)
from trainer_module.presets import PRESETS, get_preset, preset_names

# The paper's Table 2, one row per preset, with the derived values worked out by hand as the reference does:
# steps/epoch = 1,281,167 / batch (a float), warmup steps = int(warmup epochs * steps/epoch), total steps =
# int(350 * steps/epoch), peak = lr/256 * batch/256, batch-norm group = 128 // (batch / cores) for LARS rows and
# the reference's slice rule max(8, cores // 8) for RMSProp rows.
# name, variant, optimizer, schedule, cores, batch, lr/256, warmup epochs, target,
#   warmup steps, total steps, peak LR, BN group
TABLE2 = [
    (
        "b2-rmsprop-128x4096",
        "b2",
        "rmsprop",
        "exponential",
        128,
        4096,
        0.016,
        5,
        0.801,
        1563,
        109474,
        0.256,
        16,
    ),
    (
        "b2-rmsprop-256x8192",
        "b2",
        "rmsprop",
        "exponential",
        256,
        8192,
        0.016,
        5,
        0.800,
        781,
        54737,
        0.512,
        32,
    ),
    (
        "b2-rmsprop-512x16384",
        "b2",
        "rmsprop",
        "exponential",
        512,
        16384,
        0.016,
        5,
        0.799,
        390,
        27368,
        1.024,
        64,
    ),
    ("b2-lars-512x16384", "b2", "lars", "polynomial", 512, 16384, 0.236, 50, 0.795, 3909, 27368, 15.104, 4),
    ("b2-lars-1024x32768", "b2", "lars", "polynomial", 1024, 32768, 0.118, 50, 0.797, 1954, 13684, 15.104, 4),
    (
        "b5-rmsprop-128x4096",
        "b5",
        "rmsprop",
        "exponential",
        128,
        4096,
        0.016,
        5,
        0.835,
        1563,
        109474,
        0.256,
        16,
    ),
    (
        "b5-rmsprop-256x8192",
        "b5",
        "rmsprop",
        "exponential",
        256,
        8192,
        0.016,
        5,
        0.834,
        781,
        54737,
        0.512,
        32,
    ),
    (
        "b5-rmsprop-512x16384",
        "b5",
        "rmsprop",
        "exponential",
        512,
        16384,
        0.016,
        5,
        0.834,
        390,
        27368,
        1.024,
        64,
    ),
    ("b5-lars-512x16384", "b5", "lars", "polynomial", 512, 16384, 0.236, 50, 0.833, 3909, 27368, 15.104, 4),
    ("b5-lars-1024x32768", "b5", "lars", "polynomial", 1024, 32768, 0.118, 50, 0.832, 1954, 13684, 15.104, 4),
    # 64 examples per core on this row, hence groups of 2; 350 epochs are 6,842 steps, not 350 * 19.
    ("b5-lars-1024x65536", "b5", "lars", "polynomial", 1024, 65536, 0.081, 43, 0.830, 840, 6842, 20.736, 2),
]


@pytest.mark.parametrize("row", TABLE2, ids=[row[0] for row in TABLE2])
def test_table2_preset(row):
    (name, variant, optimizer, kind, cores, batch, lr_per_256, warmup_epochs, target) = row[:9]
    warmup_steps, total_steps, peak, bn_group = row[9:]
    config = get_preset(name)
    plan = config.plan

    assert config.name == name
    assert config.model.variant == variant
    assert config.optimizer.name == optimizer
    assert config.schedule.kind == kind
    assert (config.data.num_cores, config.data.global_batch_size) == (cores, batch)
    assert config.schedule.lr_per_256 == lr_per_256
    assert config.schedule.warmup_epochs == warmup_epochs
    assert config.loop.target_top1 == target

    assert plan.steps_per_epoch == pytest.approx(1_281_167 / batch, rel=1e-12)
    assert (plan.warmup_steps, plan.total_steps) == (warmup_steps, total_steps)
    assert plan.peak_learning_rate == pytest.approx(peak, rel=1e-12)
    assert plan.bn_group_replicas == bn_group
    assert (plan.replicas, plan.hosts, plan.per_replica_batch_size) == (cores, cores // 8, batch // cores)

    # Shared by every row: the reference's settings, including its exact-reproduction switches.
    assert config.loop.train_epochs == 350
    assert config.optimizer.weight_decay == 1e-5
    assert config.optimizer.label_smoothing == 0.1
    assert config.optimizer.momentum == 0.9
    assert config.optimizer.ema_decay == 0.9999
    assert config.model.precision == "bfloat16"
    assert config.augment.policy == "autoaugment"
    assert config.data.num_train_examples == 1_281_167
    assert config.data.num_eval_examples == 50_000
    assert plan.eval_crop_padding_pixels == 32  # the paper-era crop; today's would be 65 at 456 px
    # Both optimizers carry L2 in the loss: RMSProp as its only decay, LARS on top of its own (the reference).
    assert plan.l2_loss_weight == 1e-5
    if optimizer == "rmsprop":
        assert (config.schedule.decay_epochs, config.schedule.decay_rate) == (2.4, 0.97)
        assert config.model.bn_group_rule == "reference_tpu"
        assert config.optimizer.rmsprop_form == "tf1"  # tf.compat.v1's RMSProp: accumulator from 1
    else:
        assert config.optimizer.lars_l2_in_loss is True
        assert config.schedule.end_lr == 0.1
        assert plan.per_replica_batch_size * bn_group == 128


def test_preset_registry_holds_table2_demo_and_smoke():
    assert preset_names() == [row[0] for row in TABLE2] + ["b0-rmsprop-8x2048", "demo", "smoke"]
    with pytest.raises(ValueError, match="unknown preset 'b9-adam'.*b2-rmsprop-128x4096"):
        get_preset("b9-adam")


def test_single_host_b0_preset_is_the_reference_default():
    """The EfficientNet reference's B0 default on one 8-core slice or 8-GPU machine, by Table 2's rules."""
    config = get_preset("b0-rmsprop-8x2048")
    plan = config.plan
    assert (config.model.variant, plan.input_size, config.optimizer.name) == ("b0", 224, "rmsprop")
    assert (plan.replicas, plan.hosts, plan.per_replica_batch_size, plan.bn_group_replicas) == (8, 1, 256, 1)
    assert plan.peak_learning_rate == pytest.approx(0.016 * 2048 / 256)
    assert plan.warmup_steps == int(5 * 1_281_167 / 2048)
    assert config.loop.target_top1 == 0.763


def test_demo_preset():
    config = get_preset("demo")
    assert (config.model.variant, config.plan.input_size, config.model.num_classes) == ("tiny", 32, 1000)
    assert config.model.bn_momentum == 0.9
    assert config.model.precision == "float32"
    assert (config.optimizer.name, config.schedule.kind) == ("lars", "polynomial")
    # The embedded digits: 1,797 images, 20% of each class in validation.
    assert (config.data.num_train_examples, config.data.num_eval_examples) == (1438, 359)
    assert (config.data.num_cores, config.loop.strategy, config.plan.bn_group_replicas) == (
        1,
        "one_device",
        1,
    )
    assert (config.data.min_crop_area, config.data.random_flip, config.loop.target_top1) == (0.5, False, 0.95)
    assert config.plan.steps_per_epoch == pytest.approx(1438 / 64)
    assert config.plan.total_steps == int(30 * 1438 / 64) == 674
    assert (config.augment.policy, config.plan.l2_loss_weight) == ("none", 0.0)


def test_smoke_preset_runs_two_steps():
    config = get_preset("smoke")
    assert (config.model.variant, config.loop.strategy) == ("micro", "one_device")
    plan = config.plan
    assert (plan.steps_per_epoch, plan.warmup_steps, plan.total_steps) == (2.0, 1, 2)
    assert plan.eval_steps == 2


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_round_trips_through_json(name):
    config = get_preset(name)
    restored = TrainerConfig.from_json(config.to_json())
    assert restored == config
    assert restored.to_json() == config.to_json()
    assert restored.plan == config.plan


def test_json_round_trip_keeps_optional_and_float_types():
    config = with_overrides(get_preset("demo"), ["model.dropout_rate=0.25", "loop.target_top1=0.9"])
    restored = TrainerConfig.from_json(config.to_json())
    assert restored == config
    assert isinstance(restored.schedule.warmup_epochs, float)  # written as 3.0, not 3
    assert TrainerConfig.from_json(get_preset("smoke").to_json()).model.dropout_rate is None


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"optimizer": {"weight_decy": 1e-4}}', "unknown config key 'optimizer.weight_decy'"),
        ('{"epochs": 3}', "unknown config key 'epochs'"),
        ('{"loop": {"train_epochs": 3.5}}', r"loop.train_epochs=3.5 must be int"),
        ('{"loop": [1, 2]}', "config section loop must be a JSON object"),
        ("{not json", "not valid JSON"),
    ],
)
def test_from_json_errors_name_the_key(text, message):
    with pytest.raises((ValueError, TypeError), match=message):
        TrainerConfig.from_json(text)


def test_from_json_takes_defaults_for_missing_keys():
    assert TrainerConfig.from_json("{}") == TrainerConfig()


def test_with_overrides_parses_by_field_type():
    base = get_preset("b2-lars-512x16384")
    config = with_overrides(
        base,
        [
            "optimizer.weight_decay=1e-4",
            "loop.train_epochs=3",
            "optimizer.lars_nesterov=true",
            "loop.target_top1=none",
            "model.image_size=224",
            "loop.strategy=mirrored",
            "data.global_batch_size=8192",
            "schedule.warmup_epochs=1",
            "name=my-run",
        ],
    )
    assert config.optimizer.weight_decay == 1e-4
    assert config.loop.train_epochs == 3
    assert config.optimizer.lars_nesterov is True
    assert config.loop.target_top1 is None
    assert config.model.image_size == config.plan.input_size == 224
    assert config.loop.strategy == "mirrored"
    assert config.schedule.warmup_epochs == 1.0
    assert config.name == "my-run"
    # Derived values follow the overrides.
    plan = config.plan
    assert plan.peak_learning_rate == pytest.approx(0.236 * 8192 / 256)
    assert plan.per_replica_batch_size == 16
    assert plan.bn_group_replicas == 8
    # 1,281,167 / 8192 = 156.39 steps per epoch: 1 warmup epoch is 156 steps, 3 epochs 469.
    assert (plan.warmup_steps, plan.total_steps) == (156, 469)
    # The original is untouched (frozen).
    assert base.optimizer.weight_decay == 1e-5
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.loop.train_epochs = 1


@pytest.mark.parametrize(
    "override, message",
    [
        ("optimizer.weight_decy=1e-4", "override 'optimizer.weight_decy': unknown config field"),
        ("optimiser.weight_decay=1e-4", "unknown config section 'optimiser'"),
        ("epochs=3", "override 'epochs': unknown config field"),
        ("model=b5", "override 'model': unknown config field"),
        ("loop.train_epochs=three", r"override loop.train_epochs='three': expected int"),
        ("optimizer.weight_decay=tiny", r"override optimizer.weight_decay='tiny': expected float"),
        ("optimizer.lars_nesterov=maybe", "expected a bool"),
        ("loop.train_epochs", "not of the form section.field=value"),
        ("optimizer.name=adam", "optimizer.name='adam' is not one of 'lars', 'rmsprop', 'sgd'"),
        ("model.variant=b8", "model.variant='b8' is not one of"),
        ("model.bn_group_layout=ring", "model.bn_group_layout='ring' is not one of 'consecutive', 'torus2d'"),
        (
            "model.bn_group_rule=half",
            "model.bn_group_rule='half' is not one of 'examples128', 'reference_lars', 'reference_tpu'",
        ),
        ("schedule.kind=cosine", "schedule.kind='cosine' is not one of 'polynomial', 'exponential'"),
        ("augment.policy=mixup", "augment.policy='mixup' is not one of 'none', 'autoaugment', 'randaugment'"),
        (
            "loop.strategy=gpu",
            "loop.strategy='gpu' is not one of 'tpu', 'multi_worker', 'mirrored', 'one_device'",
        ),
    ],
)
def test_with_overrides_errors(override, message):
    with pytest.raises(ValueError, match=message):
        with_overrides(get_preset("demo"), [override])


def _config(**sections):
    base = {
        "data": DataConfig(global_batch_size=256, num_cores=8),
        "loop": LoopConfig(train_epochs=10),
    }
    base.update(sections)
    return TrainerConfig(**base)


@pytest.mark.parametrize(
    "batch, cores, rule, explicit, expected",
    [
        (256, 8, "examples128", None, 4),  # 32 per replica -> 128 // 32
        (512, 8, "examples128", None, 2),  # 64 per replica
        (1024, 8, "examples128", None, 1),  # 128 per replica
        (4096, 8, "examples128", None, 1),  # 512 per replica: never below 1
        (64, 4, "examples128", None, 4),  # 16 per replica would give 8, capped at the 4 replicas
        (256, 8, "examples128", 8, 8),  # explicit
        (256, 8, "reference_tpu", None, 1),  # up to 8 replicas: per-replica statistics
        (4096, 128, "reference_tpu", None, 16),  # max(8, 128 // 8), whatever the batch
        (2048, 64, "reference_tpu", None, 8),  # max(8, 64 // 8 = 8)
        (4096, 16, "reference_tpu", None, 8),  # max(8, 16 // 8 = 2)
        (256, 8, "reference_tpu", 2, 2),  # explicit wins over the rule
    ],
)
def test_bn_group_replicas(batch, cores, rule, explicit, expected):
    config = _config(
        data=DataConfig(global_batch_size=batch, num_cores=cores),
        model=ModelConfig(bn_group_size=explicit, bn_group_rule=rule),
    )
    assert config.plan.bn_group_replicas == expected
    assert config.model.bn_group_size == explicit  # the setting keeps its own value


@pytest.mark.parametrize(
    "build, error, message",
    [
        (
            lambda: _config(data=DataConfig(global_batch_size=1000, num_cores=3)),
            ValueError,
            "data.global_batch_size=1000 is not divisible by data.num_cores=3",
        ),
        (
            lambda: _config(data=DataConfig(global_batch_size=192, num_cores=6)),
            ValueError,
            "derived by model.bn_group_rule='examples128'=4 does not divide data.num_cores=6",
        ),
        (
            lambda: _config(model=ModelConfig(bn_group_size=3)),
            ValueError,
            "model.bn_group_size=3 does not divide data.num_cores=8",
        ),
        (
            lambda: _config(model=ModelConfig(bn_group_size=1, bn_virtual_batch=24)),
            ValueError,
            r"model.bn_virtual_batch=24 must divide the per-replica batch \(32\) in batch-norm groups of one replica",
        ),
        (
            lambda: _config(model=ModelConfig(bn_group_size=2, bn_virtual_batch=16)),
            ValueError,
            r"model.bn_virtual_batch=16 .* \(here 2; set model.bn_group_size=1\)",
        ),
        (
            lambda: _config(model=ModelConfig(bn_virtual_batch=0)),
            ValueError,
            "model.bn_virtual_batch=0 must be >= 1",
        ),
        (
            lambda: _config(data=DataConfig(global_batch_size=256, eval_batch_size=100, num_cores=8)),
            ValueError,
            "data.eval_batch_size=100 is not divisible by data.num_cores=8",
        ),
        (
            lambda: _config(data=DataConfig(num_train_examples=100, global_batch_size=256, num_cores=8)),
            ValueError,
            "exceeds data.num_train_examples=100",
        ),
        (
            lambda: _config(schedule=ScheduleConfig(kind="polynomial", warmup_epochs=10)),
            ValueError,
            "schedule.warmup_epochs=10.0 leaves no steps to decay",
        ),
        (
            lambda: _config(schedule=ScheduleConfig(kind="polynomial", lr_per_256=0.05, warmup_epochs=1)),
            ValueError,
            r"schedule.end_lr=0.1 exceeds the peak learning rate 0.05 \(schedule.lr_per_256=0.05 at batch 256\)",
        ),
        (
            lambda: _config(data=DataConfig(global_batch_size=192, num_cores=12, replicas_per_host=8)),
            ValueError,
            "data.num_cores=12 is not a multiple of data.replicas_per_host=8",
        ),
        (lambda: ModelConfig(bn_group_size=0), ValueError, r"model.bn_group_size=0 must be >= 1 \(or none"),
        (lambda: DataConfig(eval_crop_padding=-1), ValueError, "data.eval_crop_padding=-1 must be >= 0"),
        (
            lambda: _config(loop=LoopConfig(train_epochs=2, eval_every_epochs=3)),
            ValueError,
            "loop.eval_every_epochs=3 exceeds loop.train_epochs=2",
        ),
        (lambda: ModelConfig(num_classes=True), TypeError, "model.num_classes=True must be int, not a bool"),
        (lambda: ModelConfig(bn_momentum=1.0), ValueError, r"model.bn_momentum=1.0 is outside \[0.0, 1.0\)"),
        (
            lambda: OptimizerConfig(weight_decay=-1e-5),
            ValueError,
            "optimizer.weight_decay=-1e-05 must be >= 0",
        ),
        (
            lambda: OptimizerConfig(rmsprop_form="tf2"),
            ValueError,
            "optimizer.rmsprop_form='tf2' is not one of 'keras', 'tf1'",
        ),
        (lambda: ScheduleConfig(lr_per_256=0.0), ValueError, "schedule.lr_per_256=0.0 must be positive"),
        (lambda: DataConfig(num_cores=0), ValueError, "data.num_cores=0 must be at least 1"),
        (lambda: LoopConfig(target_top1=1.5), ValueError, "loop.target_top1=1.5 is outside"),
        (
            lambda: LoopConfig(cpu_threads=-1),
            ValueError,
            r"loop.cpu_threads=-1 must be >= 0 \(0 = every core\)",
        ),
        (lambda: TrainerConfig(model="b0"), TypeError, "model='b0' must be ModelConfig"),
    ],
)
def test_validation_errors_name_the_setting(build, error, message):
    with pytest.raises(error, match=message):
        build()


def test_default_config_is_valid_and_derives_from_the_variant():
    config = TrainerConfig()
    assert (config.plan.input_size, config.plan.classifier_dropout) == (224, 0.2)
    assert config.plan.eval_crop_padding_pixels == 32  # 224 / (224 + 32) = 0.875
    b7 = with_overrides(config, ["model.variant=b7"])
    assert (b7.plan.input_size, b7.plan.classifier_dropout) == (600, 0.5)
    assert b7.plan.eval_crop_padding_pixels == 86  # round(600 / 0.875 - 600)


# ---- the config is a leaf -------------------------------------------------------------------------------


def test_importing_the_config_loads_no_tensorflow_keras_or_beam():
    code = (
        "import sys; import trainer_module.config, trainer_module.choices; "
        "print(sorted(m for m in ('tensorflow', 'keras', 'apache_beam') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_every_declared_choice_has_its_builder_and_nothing_else_registers():
    import importlib

    from trainer_module import choices

    for module in choices.BUILDER_MODULES:
        importlib.import_module(module)
    assert {r.setting: r.unbuilt() for r in choices.ALL if r.unbuilt()} == {}
    with pytest.raises(ValueError, match="optimizer.name: 'adam' is not declared"):
        choices.OPTIMIZERS.register("adam")(lambda: None)


def _module_imports(path: pathlib.Path) -> set[str]:
    """The project modules a module imports at load time (module level, TYPE_CHECKING blocks aside)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for inner in ast.walk(node) if not isinstance(node, ast.FunctionDef | ast.ClassDef) else ():
            if isinstance(inner, ast.ImportFrom) and inner.module and inner.level == 0:
                names = [inner.module] + [f"{inner.module}.{a.name}" for a in inner.names]
                found.update(n for n in names if n.split(".")[0] in PROJECT_PACKAGES)
            elif isinstance(inner, ast.Import):
                found.update(a.name for a in inner.names if a.name.split(".")[0] in PROJECT_PACKAGES)
    return found


PROJECT_PACKAGES = ("trainer_module", "effnet_common", "beam_preprocess", "pipeline", "components")


def test_no_import_circle_among_the_project_modules_and_the_trainer_takes_nothing_from_beam_preprocess():
    root = pathlib.Path(__file__).resolve().parent.parent
    modules = {}
    for package in PROJECT_PACKAGES:
        for path in (root / package).rglob("*.py"):
            name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            modules[name] = path
    graph = {
        name: {m for m in _module_imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }
    assert not [
        (name, m)
        for name in graph
        if name.startswith("trainer_module")
        for m in graph[name]
        if m.startswith("beam_preprocess")
    ]
    state: dict[str, int] = {}

    def visit(name, stack):
        state[name] = 1
        for other in graph[name]:
            if state.get(other) == 1:
                raise AssertionError("import circle: " + " -> ".join([*stack[stack.index(other) :], other]))
            if other not in state:
                visit(other, [*stack, other])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


# The sub-packages the loop is built from, and all that they may take from trainer_module's top level: the
# config and its declared names, and the run's file helpers (never the loop, an entry point or tuning/).
LOWER_PACKAGES = ("data", "optim", "distribute", "models")
TOP_MODULES_BELOW_THEM = ("config", "choices", "files")


def _imports_from_above(source: str) -> list[str]:
    """The trainer_module modules that ``source`` imports (at any depth) and a lower sub-package may not."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "trainer_module" else []
            targets = names or [node.module]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            if parts[0] != "trainer_module" or len(parts) == 1:
                continue
            if parts[1] not in LOWER_PACKAGES and parts[1] not in TOP_MODULES_BELOW_THEM:
                found.append(target)
    return found


def test_the_check_of_the_sub_packages_finds_an_import_of_the_loop():
    assert _imports_from_above("from trainer_module import files, train") == ["trainer_module.train"]
    assert _imports_from_above("def f():\n    from trainer_module.tuning import search") == [
        "trainer_module.tuning"
    ]
    assert _imports_from_above("import trainer_module.run") == ["trainer_module.run"]
    assert (
        _imports_from_above("from trainer_module.config import X\nfrom trainer_module.optim import a") == []
    )


@pytest.mark.parametrize("package", LOWER_PACKAGES)
def test_the_sub_packages_the_loop_is_built_from_import_nothing_above_them(package):
    root = pathlib.Path(__file__).resolve().parent.parent / "trainer_module"
    found = {
        str(path.relative_to(root)): _imports_from_above(path.read_text())
        for path in sorted((root / package).rglob("*.py"))
    }
    assert {path: names for path, names in found.items() if names} == {}


def test_replace_takes_typed_values_at_dotted_keys():
    from trainer_module.config import replace, setting

    base = get_preset("demo")
    config = replace(base, {"loop.train_epochs": 12, "optimizer.weight_decay": 1e-4, "name": "typed"})
    assert (config.loop.train_epochs, config.optimizer.weight_decay, config.name) == (12, 1e-4, "typed")
    assert setting(config, "loop.train_epochs") == 12 and setting(config, "name") == "typed"
    assert replace(base, {"schedule.warmup_epochs": 2}).schedule.warmup_epochs == 2.0  # int to a float field
    assert config == with_overrides(
        base, ["loop.train_epochs=12", "optimizer.weight_decay=1e-4", "name=typed"]
    )


@pytest.mark.parametrize(
    ("changes", "error", "names"),
    [
        ({"loop.train_epochs": "3"}, TypeError, "loop.train_epochs"),  # text is for --set, not for code
        ({"loop.train_epochs": True}, TypeError, "loop.train_epochs"),
        ({"optimizer.nope": 1.0}, ValueError, "optimizer.nope"),
        ({"nosection.x": 1}, ValueError, "nosection"),
        ({"optimizer.weight_decay": -1.0}, ValueError, "optimizer.weight_decay"),
    ],
)
def test_replace_checks_each_value_as_set_does(changes, error, names):
    from trainer_module.config import replace

    with pytest.raises(error, match=names.replace(".", r"\.")):
        replace(get_preset("demo"), changes)


def test_replace_checks_the_config_once_with_every_change_applied():
    """Two changes that are only valid together: the cross-check sees both (the eval interval within the
    budget), not a half-changed config."""
    from trainer_module.config import replace

    base = replace(
        get_preset("demo"), {"loop.train_epochs": 2, "loop.eval_every_epochs": 1, "schedule.warmup_epochs": 0}
    )
    config = replace(base, {"loop.eval_every_epochs": 5, "loop.train_epochs": 10})
    assert (config.loop.eval_every_epochs, config.loop.train_epochs) == (5, 10)
    with pytest.raises(ValueError, match="eval_every_epochs"):
        replace(base, {"loop.eval_every_epochs": 5})


# ---- configs change as values ------------------------------------------------------------------------------


def _formats_text(node: ast.AST) -> bool:
    """An f-string, a ``.format`` call or a ``%`` formatting anywhere in ``node``."""
    for inner in ast.walk(node):
        if isinstance(inner, ast.JoinedStr):
            return True
        if (
            isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Attribute)
            and inner.func.attr == "format"
        ):
            return True
        if (
            isinstance(inner, ast.BinOp)
            and isinstance(inner.op, ast.Mod)
            and isinstance(inner.left, ast.Constant)
        ):
            return isinstance(inner.left.value, str)
    return False


def _values_given_to_names(scope: ast.AST) -> dict[str, list[ast.AST]]:
    """What a scope assigns to each name, appends or extends it with (``x = ...``, ``x += ...``,
    ``x.append(...)``, ``x.extend(...)``)."""
    given: dict[str, list[ast.AST]] = {}
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        given.setdefault(name.id, []).append(node.value)
        elif (
            isinstance(node, ast.AugAssign | ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.value
        ):
            given.setdefault(node.target.id, []).append(node.value)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("append", "extend")
            and isinstance(node.func.value, ast.Name)
        ):
            given.setdefault(node.func.value.id, []).extend(node.args)
    return given


def _config_private_names() -> set[str]:
    """The private module-level names of ``trainer_module.config`` (its parser ``_parse_value`` among them)."""
    from trainer_module import config

    tree = ast.parse(pathlib.Path(config.__file__).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {name for name in names if name.startswith("_")}


def _text_config_changes(source: str, path: str, private: set[str]) -> list[str]:
    """Where the module ``path`` (its ``source``) hands ``with_overrides`` text formatted in code (directly, or
    through a name the same function builds), or reaches into the config module's private names."""
    tree = ast.parse(source)
    found = []
    config_modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "trainer_module.config":
            found += [f"{path}:{node.lineno} imports {a.name}" for a in node.names if a.name in private]
        elif isinstance(node, ast.ImportFrom) and node.module == "trainer_module":
            config_modules.update(a.asname or a.name for a in node.names if a.name == "config")
        elif isinstance(node, ast.Import):
            config_modules.update(
                a.asname for a in node.names if a.name == "trainer_module.config" and a.asname
            )
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in private
            and isinstance(node.value, ast.Name)
            and node.value.id in config_modules
        ):
            found.append(f"{path}:{node.lineno} uses config.{node.attr}")
    scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))]
    for scope in scopes:
        given = _values_given_to_names(scope)
        for call in ast.walk(scope):
            callee = getattr(call, "func", None)
            name = getattr(callee, "id", None) or getattr(callee, "attr", None)
            if not isinstance(call, ast.Call) or name != "with_overrides":
                continue
            for argument in [*call.args, *(k.value for k in call.keywords)]:
                sources = [argument]
                for inner in ast.walk(argument):
                    if isinstance(inner, ast.Name):
                        sources += given.get(inner.id, [])
                if any(_formats_text(source) for source in sources):
                    found.append(f"{path}:{call.lineno} formats the text it hands with_overrides")
    return sorted(set(found))


def test_the_text_check_finds_formatted_overrides_and_the_private_parser():
    """The check below finds what it looks for (and not what it should leave)."""
    private = _config_private_names()
    assert "_parse_value" in private and "replace" not in private
    cases = {
        "with_overrides(c, [f'loop.train_epochs={n}'])": 1,
        "with_overrides(c, ['loop.seed=%d' % n])": 1,
        "with_overrides(c, ['loop.seed={}'.format(n)])": 1,
        "def f(c, n):\n    o = list(args)\n    o.append(f'a.b={n}')\n    return with_overrides(c, o)": 1,
        "from trainer_module.config import _parse_value": 1,
        "from trainer_module import config as k\nk._parse_value('a', 'b', int)": 1,
        "with_overrides(c, args.overrides)\nreplace(c, {'loop.seed': n})": 0,
    }
    for source, expected in cases.items():
        assert len(_text_config_changes(source, "case.py", private)) == expected, source


@pytest.mark.parametrize("package", PROJECT_PACKAGES)
def test_no_package_module_formats_overrides_or_imports_the_configs_private_parser(package):
    """Code changes a config as typed values (``config.replace``); ``--set`` text is what a person typed."""
    root = pathlib.Path(__file__).resolve().parent.parent
    private = _config_private_names()
    found = []
    for path in sorted((root / package).rglob("*.py")):
        if path.name != "config.py" or package != "trainer_module":
            found += _text_config_changes(path.read_text(), str(path.relative_to(root)), private)
    assert found == []
