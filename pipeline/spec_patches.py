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
) -> None:
    """Patches the compiled PipelineJob ``job`` of pipeline ``name``.

    The latest-blessed-model lookup is scoped to this pipeline (``scope_baseline_query``); the runtime
    parameters' ``defaults`` go into the root's input definitions (``set_parameter_defaults``), and the DAG the
    exit handler follows gets the root's parameters (``bind_exit_dag_parameters``). The
    pipeline root goes into ``defaultPipelineRoot`` (the serving directory and Dataflow's temp location are
    compiled under it, so a run must use it); ``labels`` onto the PipelineJob.
    """
    spec = job["pipelineSpec"]
    scope_baseline_query(spec, name)
    set_parameter_defaults(spec, defaults)
    bind_exit_dag_parameters(spec)
    spec["defaultPipelineRoot"] = pipeline_root
    job["labels"] = {**job.get("labels", {}), **labels}


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
    the root's inputs (``componentInputParameter``), which a task resolves against its parent DAG's inputs only
    (Kubeflow's driver: "parent DAG does not have input parameter"). The DAG declares each root parameter under
    the same name, and the root's task of the DAG passes it in.
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
