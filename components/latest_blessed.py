"""The Evaluator's baseline on this machine: the latest blessed model other than the one being evaluated.

TFX's ``LatestBlessedModelStrategy`` returns the latest blessed model whatever it is. When a pipeline runs
again with nothing changed, its Trainer is cached and hands the Evaluator the very model the last run blessed,
which is also the latest blessed one: the Evaluator's inputs differ from the last run's (which had no
baseline), so it evaluates the model against itself again and the Pusher pushes a second, identical version.
Leaving the candidate out of the lookup gives the Evaluator the same inputs as the run that first evaluated
it, so TFX reuses both steps; a model trained anew is still compared with the latest model blessed before it.

The compiled Vertex pipeline keeps TFX's strategy: Vertex runs that lookup as a metadata query
(``pipeline.spec_patches``), which a custom strategy cannot compile to.
"""

from __future__ import annotations

from components import tfx_api as tfx

MODEL_KEY = "model"
BLESSING_KEY = "model_blessing"
CANDIDATE_KEY = "candidate"


class LatestBlessedOtherModelStrategy(tfx.dsl.experimental.LatestBlessedModelStrategy):
    """``LatestBlessedModelStrategy`` over the models but the ``candidate`` channel's (the Trainer's
    output)."""

    def resolve_artifacts(self, store, input_dict):
        candidates = {artifact.id for artifact in input_dict.get(CANDIDATE_KEY, [])}
        others = {
            MODEL_KEY: [model for model in input_dict[MODEL_KEY] if model.id not in candidates],
            BLESSING_KEY: list(input_dict[BLESSING_KEY]),
        }
        return super().resolve_artifacts(store, others)


def resolver(candidate_model) -> tfx.dsl.Resolver:
    """The resolver node whose ``model`` output is the latest blessed model that is not
    ``candidate_model``'s."""
    return tfx.dsl.Resolver(
        strategy_class=LatestBlessedOtherModelStrategy,
        model=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Model),
        model_blessing=tfx.dsl.Channel(type=tfx.types.standard_artifacts.ModelBlessing),
        candidate=candidate_model,
    ).with_id("latest_blessed_model_resolver")
