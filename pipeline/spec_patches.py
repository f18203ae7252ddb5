"""The edits a compiled pipeline needs that TFX's Kubeflow V2 compiler does not make (``patch``).

Each works on the PipelineJob TFX compiles (a dict: ``pipelineSpec``, ``runtimeConfig``, ``labels``), in
place; ``pipeline.compiler`` applies them before writing the file.
"""

from __future__ import annotations


def patch(
    job: dict,
    *,
    name: str,
    defaults: dict,
    pipeline_root: str,
    labels: dict[str, str],
    enable_cache: bool = True,
) -> None:
    """Patches the compiled PipelineJob ``job`` of pipeline ``name``.

    The latest-blessed-model lookup is scoped to this pipeline (``scope_baseline_query``); the runtime
    parameters' ``defaults`` go into the root's input definitions (``set_parameter_defaults``), and the DAG
    the exit handler follows gets the root's parameters (``bind_exit_dag_parameters``). The
    pipeline root goes into ``defaultPipelineRoot`` (the serving directory and Dataflow's temp location are
    compiled under it, so a run must use it); ``labels`` onto the PipelineJob. Each task's caching is written
    (``set_caching``: the exit task never cached), and the steps that start cloud jobs get a retry policy
    (``set_retry_policy``). The Trainer and the Evaluator get the outputs a run page shows
    (``add_run_page_outputs``).
    """
    spec = job["pipelineSpec"]
    scope_baseline_query(spec, name)
    set_parameter_defaults(spec, defaults)
    bind_exit_dag_parameters(spec)
    set_caching(spec, enable_cache)
    set_retry_policy(spec)
    add_run_page_outputs(spec)
    spec["defaultPipelineRoot"] = pipeline_root
    job["labels"] = {**job.get("labels", {}), **labels}


def add_run_page_outputs(spec: dict) -> list[str]:
    """Declares the ``system.Metrics`` and ``system.HTML`` outputs of ``components.run_page.OUTPUTS`` on the
    Trainer and the Evaluator, and has their containers run ``components.run_page``, which makes them beside
    the TFX outputs. Returns the components changed.

    Only the components declare them (as the KFP SDK's own compiler does, with ``schemaTitle``); the
    ``system.Metrics`` outputs are not lifted to the DAG's outputs, which no view needs (Vertex AI Experiments
    reads every metrics artifact of the run).
    """
    from components import run_page

    changed = []
    for name, outputs in run_page.OUTPUTS.items():
        component = spec["components"].get(name)
        if component is None:
            continue
        declared = component.setdefault("outputDefinitions", {}).setdefault("artifacts", {})
        for output, type_name in outputs.items():
            declared[output] = {"artifactType": run_page.artifact_type(type_name)}
        container = spec["deploymentSpec"]["executors"][component["executorLabel"]]["container"]
        if container["command"][-1] != run_page.TFX_ENTRY_POINT:
            raise ValueError(f"{name}: its container runs {container['command']}, not TFX's entry point")
        container["command"] = [*container["command"][:-1], run_page.ENTRY_POINT]
        changed.append(name)
    return changed


def scope_baseline_query(spec: dict, name: str) -> int:
    """Restricts the compiled latest-blessed-model lookup to blessings of pipeline ``name``.

    TFX compiles the lookup to a query over every ModelBlessing of the project's metadata store, whatever
    pipeline or preset wrote it; the Evaluator writes its pipeline's name on each blessing
    (``runtime_gate.BASELINE_SCOPE_PROPERTY``), and this adds that condition to the query. Returns the number
    of queries changed.
    """
    from components import runtime_gate

    condition = f'metadata.{runtime_gate.BASELINE_SCOPE_PROPERTY}.string_value="{name}"'
    changed = 0
    for executor in spec["deploymentSpec"]["executors"].values():
        for query in executor.get("resolver", {}).get("outputArtifactQueries", {}).values():
            if 'schema_title="tfx.ModelBlessing"' in query["filter"]:
                query["filter"] = f"{query['filter']} AND {condition}"
                changed += 1
    return changed


def set_parameter_defaults(spec: dict, defaults: dict) -> None:
    """Writes each root parameter's default value (``defaultValue``, which TFX leaves out: it puts them in the
    PipelineJob's ``runtimeConfig`` only, which a bare PipelineSpec does not carry)."""
    for name, parameter in spec["root"].get("inputDefinitions", {}).get("parameters", {}).items():
        parameter["defaultValue"] = defaults[name]


def bind_exit_dag_parameters(spec: dict) -> None:
    """Passes the root's runtime parameters into the DAG the exit handler follows (TFX's ``tfx-dag``).

    With an exit handler, TFX compiles the pipeline's steps into that DAG but leaves their parameters bound to
    the root's inputs (``componentInputParameter``), which a task resolves against its parent DAG's inputs
    only (Kubeflow's driver: "parent DAG does not have input parameter"). The DAG declares each root
    parameter under the same name, and the root's task of the DAG passes it in.
    """
    from tfx.orchestration.kubeflow import utils

    declared = spec["root"].get("inputDefinitions", {}).get("parameters", {})
    spec["components"][utils.TFX_DAG_NAME]["inputDefinitions"] = {
        "parameters": {
            name: {"parameterType": parameter["parameterType"]} for name, parameter in declared.items()
        }
    }
    spec["root"]["dag"]["tasks"][utils.TFX_DAG_NAME]["inputs"] = {
        "parameters": {name: {"componentInputParameter": name} for name in declared}
    }


# The trigger strategy of an exit task (one that runs once its upstream tasks have ended, in any state).
EXIT_TRIGGER = "ALL_UPSTREAM_TASKS_COMPLETED"


def _all_tasks(spec: dict):
    """Every task of the spec, in the root DAG and in every DAG component (TFX's ``tfx-dag``)."""
    yield from spec["root"].get("dag", {}).get("tasks", {}).values()
    for component in spec.get("components", {}).values():
        yield from component.get("dag", {}).get("tasks", {}).values()


def set_caching(spec: dict, enable_cache: bool) -> None:
    """Writes each task's caching into the spec: the steps' as ``enable_cache`` says, the exit task's off.

    A cached exit task does nothing: its inputs are the same every run (on Vertex its run id is an argument,
    not an input), so from the second run on it would be skipped as cached and cancel nothing. And the
    submitting clients cannot say it: the Vertex SDK's ``enable_caching`` sets every task alike, the exit task
    included, and ``kfp.Client``'s reaches the root's tasks only (not the steps inside ``tfx-dag``). So the
    runner submits with the clients' caching unset, which keeps these per-task settings (both clients
    document it). The DAG tasks themselves are left without one: a DAG is not cached, its container tasks
    are.
    """
    for task in _all_tasks(spec):
        component = spec["components"].get(task.get("componentRef", {}).get("name", ""), {})
        if "dag" in component:
            continue
        exit_task = task.get("triggerPolicy", {}).get("strategy") == EXIT_TRIGGER
        task["cachingOptions"] = {"enableCache": enable_cache and not exit_task}


# The steps that start cloud jobs (``components.run_label``): an orchestrator retries their task when it
# fails, so a launcher lost with its pod (eviction, out of memory, its node gone) is started again and
# re-attaches to its job (the training step finds it by its labels; a Beam step's retry submits again under
# the same job name).
RETRIED_STEPS = ("ImageNetShardGen", "Tuner", "Trainer", "Evaluator")
# Two retries, the first at once (a lost pod, not an overloaded service: the steps wait out the services'
# faults themselves), then after 60 s. A step that failed for good (a failed training job) is tried again too:
# at most two more jobs, the price of surviving two evictions in a run of days.
RETRY_POLICY = {
    "maxRetryCount": 2,
    "backoffDuration": "0s",
    "backoffFactor": 2.0,
    "backoffMaxDuration": "60s",
}


def set_retry_policy(spec: dict, steps=RETRIED_STEPS) -> list[str]:
    """Gives the tasks of ``steps`` (where they are, in any DAG) the ``RETRY_POLICY``; returns their names.

    Vertex AI Pipelines honours a task's ``retryPolicy`` in any DAG; Kubeflow Pipelines from 2.14.0 (before,
    2.5.0 to 2.13, only in the root DAG's tasks: ``backend/src/v2/compiler/argocompiler/container.go``), and a
    retry there reuses the pod's spec, so the retried launcher gets the same output URIs.
    """
    named = []
    for dag in [spec["root"], *spec.get("components", {}).values()]:
        for name, task in dag.get("dag", {}).get("tasks", {}).items():
            if name in steps:
                task["retryPolicy"] = dict(RETRY_POLICY)
                named.append(name)
    return sorted(named)
