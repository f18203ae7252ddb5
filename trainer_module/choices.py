"""The names every choice of the config (and the search kind) accepts, declared once, with no heavy import.

Each registry here is the one the builders register against (``@OPTIMIZERS.register("lars")`` in
``trainer_module.optim.optimizers``, and so on): the config validates a name against the declared names
without importing TensorFlow, the builder's module refuses to register a name not declared here, and
``tests/test_config.py`` checks that every declared name has its builder once the modules are imported.
"""

from effnet_common.registry import Registry

OPTIMIZERS = Registry("optimizer.name", ("lars", "rmsprop", "sgd"))
RMSPROP_FORMS = Registry("optimizer.rmsprop_form", ("keras", "tf1"))
SCHEDULES = Registry("schedule.kind", ("polynomial", "exponential"))
AUGMENT_POLICIES = Registry("augment.policy", ("none", "autoaugment", "randaugment"))
STRATEGIES = Registry("loop.strategy", ("tpu", "multi_worker", "mirrored", "one_device"))
PRECISIONS = Registry("model.precision", ("float32", "bfloat16"))
BN_GROUP_RULES = Registry("model.bn_group_rule", ("examples128", "reference_lars", "reference_tpu"))
BN_LAYOUTS = Registry("model.bn_group_layout", ("consecutive", "torus2d"))
# Not a config field: the search of ``python -m trainer_module tune`` and of the runners' --tune.
SEARCHES = Registry("--search", ("hyperband", "bayesian", "random"))

# The modules whose import registers the builders of the registries above.
BUILDER_MODULES = (
    "trainer_module.config",
    "trainer_module.optim.optimizers",
    "trainer_module.optim.schedules",
    "trainer_module.data.augment",
    "trainer_module.distribute.strategies",
    "trainer_module.models.blocks",
    "trainer_module.distribute.replica_groups",
    "trainer_module.tuning.search",
)
ALL = (
    OPTIMIZERS,
    RMSPROP_FORMS,
    SCHEDULES,
    AUGMENT_POLICIES,
    STRATEGIES,
    PRECISIONS,
    BN_GROUP_RULES,
    BN_LAYOUTS,
    SEARCHES,
)
