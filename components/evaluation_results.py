"""What the Evaluator's outputs say, read back from their URIs: the overall metrics of its evaluation, whether
it blessed the model, and, when it did not, each blessing condition that failed, in words.

The local runner's verdict (``pipeline.outcome``) and a compiled Evaluator's run-page metrics
(``components.run_page``) both read them here.
"""

from __future__ import annotations

from components import parameters

TOP1 = parameters.TOP1_KEY
TOP5 = "top5_accuracy"  # the name of the top-5 metric the pipeline's eval config asks TFMA for
BLESSED_FILE = "BLESSED"  # what TFX's Evaluator writes into a blessing it gives
EXAMPLE_COUNT = "example_count"  # TFMA's count of the examples it evaluated
# What a blessing carries of the evaluation it was given on (float custom properties: property -> metric), so
# that the Pusher can hand it on (the Model Registry's evaluation of the version it pushes).
BLESSING_METRICS = {"top1": TOP1, "top5": TOP5, "evaluated_examples": EXAMPLE_COUNT}


def overall_metrics(evaluation_uri: str) -> dict[str, float]:
    """The evaluation's metrics of the whole validation split (no slice), by name; the change against the
    baseline model, a separate key, is left out."""
    import tensorflow_model_analysis as tfma

    values = {}
    for metrics_for_slice in tfma.load_metrics(evaluation_uri):
        if metrics_for_slice.slice_key.single_slice_keys:
            continue  # only the overall slice
        for key_and_value in metrics_for_slice.metric_keys_and_values:
            if not key_and_value.key.is_diff:
                values.setdefault(key_and_value.key.name, key_and_value.value.double_value.value)
    return values


def blessing_metrics(evaluation_uri: str) -> dict[str, float]:
    """The ``BLESSING_METRICS`` of the evaluation at ``evaluation_uri`` (those it has)."""
    metrics = overall_metrics(evaluation_uri)
    return {name: metrics[metric] for name, metric in BLESSING_METRICS.items() if metric in metrics}


def evaluated(blessing) -> dict[str, float]:
    """The ``BLESSING_METRICS`` a blessing artifact (TFX's) carries."""
    return {
        name: blessing.get_float_custom_property(name)
        for name in BLESSING_METRICS
        if blessing.has_custom_property(name)
    }


def is_blessed(blessing_uri: str) -> bool:
    from trainer_module import files

    return files.exists(files.join(blessing_uri, BLESSED_FILE))


def refusals(validation) -> tuple[str, ...]:
    """Each blessing condition a TFMA ``ValidationResult`` says failed, in words: the top-1 below the target
    (a value threshold), or worse than the last blessed model's (a change threshold against the baseline,
    whose metric value is the difference)."""
    reasons = []
    for per_slice in validation.metric_validations_per_slice:
        for failure in per_slice.failures:
            if failure.metric_key.name != TOP1:
                reasons.append(failure.message or f"{failure.metric_key.name} failed its threshold")
                continue
            value = failure.metric_value.double_value.value
            threshold = failure.metric_threshold
            if failure.metric_key.is_diff:
                reasons.append(f"its top-1 is {-value:.4f} below the last blessed model's")
            else:
                bound = threshold.value_threshold.lower_bound.value
                reasons.append(f"top-1 {value:.4f} is below the target {bound:.4f}")
    return tuple(reasons)


def evaluation_refusals(evaluation_uri: str) -> tuple[str, ...]:
    """``refusals`` of the evaluation at ``evaluation_uri``."""
    import tensorflow_model_analysis as tfma

    return refusals(tfma.load_validation_result(evaluation_uri))
