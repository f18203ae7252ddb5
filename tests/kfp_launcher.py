"""A minimal KFP v2 launcher: runs one container task of a compiled Vertex PipelineJob, or of a bare PipelineSpec
as Kubeflow Pipelines runs it, on this machine.

What the launcher of Vertex AI Pipelines (and of Kubeflow Pipelines v2) does for a container task, this does
too, from the compiled job (or spec) alone:

- finds the task in the root DAG or in a DAG under it (a pipeline with an exit handler has its steps in the DAG
  the exit handler follows);
- resolves the task's input parameters (PipelineSpec schema 2.1): constants compiled into the task
  (``runtimeValue.constant``) and the job's runtime parameters (``componentInputParameter``, followed up
  through the enclosing DAGs' bindings to the root: the ``runtimeConfig.parameterValues`` defaults merged with
  the run's values), typed by the root's input definitions (``parameterType``), as ``inputs.parameterValues``,
  the only form the 2.1 launchers write;
- resolves the input artifacts to the upstream tasks' outputs as their ``executor_output.json`` describes them
  (name, URI and metadata; the type from the consuming component's input definitions);
- names its output artifacts and places them at ``{root}/{task}/{output_key}/{execution}`` with the type of the
  component's output definitions; for a bare PipelineSpec (Kubeflow), as Kubeflow's driver has since 2024: at
  ``{root}/{pipeline name}/{run id}/{task}/{random UUID}/{output_key}``, unnamed (as the driver's
  ``provisionOutputs`` gives them);
- puts the run's id in place of an input parameter constant that is exactly ``{{$.pipeline_job_uuid}}`` (Vertex's
  driver does, and Kubeflow's from 2.5.0 on: ``backend_version`` models an older Kubeflow backend, whose task gets
  the literal text, ``fake_kfp_server.FakeKfpServer.fills_run_id_placeholder``), and writes it all as the ``ExecutorInput`` JSON in place of the ``{{$}}`` placeholder of
  the container's args; in the args, the run's id replaces ``{{$.pipeline_job_uuid}}`` for a Vertex job (as
  Vertex's launcher does) and stays as it is for Kubeflow (whose driver fills no placeholder there); runs the
  container's command as a subprocess of this interpreter (``.venv/bin/python`` standing for the image's
  ``python``), and returns the ``ExecutorOutput`` the executor wrote.

Deviations, each because the real thing cannot run here:

- Beam: the compiled args say ``--runner=DataflowRunner``; it becomes ``--runner=DirectRunner
  --direct_num_workers=1``, unless the task is given ``dataflow`` options (a fake Dataflow service's endpoint):
  then the runner stays and the options are added. The other compiled Beam args (project, region,
  ``--temp_location``, ``--sdk_container_image``...) stay: the DirectRunner ignores the Dataflow-only ones, and the SDK image is what
  tells TFX not to package itself for the workers.
- Resolver tasks (the latest blessed model) are not run: they resolve to no artifact, the first run's "no
  baseline", so the Evaluator gets an empty ``baseline_model`` list.
- A run on a root other than the compiled one (``runtimeConfig.gcsOutputDirectory``): TensorFlow's gs:// cannot
  reach a local GCS emulator, so a step that runs TensorFlow runs on a local root. The compile-time root also
  sits inside constants (the Pusher's ``push_destination``) and Beam args (``--temp_location``); they are
  pointed at the run's root too, where Vertex would keep them as compiled.
- ``outputs.outputFile`` is a local file under ``scratch_dir``, as in the open-source KFP launcher's container
  (Vertex gives a path under the pipeline root); the executor's ``.temp`` directory sits beside it.

A task's compiled ``retryPolicy`` is honoured by ``run_task_retried``: a failed attempt is started again, up to
``maxRetryCount`` more times, after the policy's backoff, with the same ``ExecutorInput`` (Kubeflow's Argo retry
re-runs the executor pod of the same pod spec, so the same output URIs; Vertex does not document what a retried
task's URIs are).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence

PLACEHOLDER = "{{$}}"
DATAFLOW_RUNNER = "--runner=DataflowRunner"
LOCAL_BEAM_ARGS = ("--runner=DirectRunner", "--direct_num_workers=1")
# Output artifacts are named as Vertex ML Metadata names them; TFX's entry point maps the names to ids.
ARTIFACT_NAME = "projects/0/locations/local/metadataStores/default/artifacts/{task}-{key}-{execution}"
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(TESTS_DIR)
# Lines of a failed task's log quoted in the error.
LOG_TAIL_LINES = 60

# Vertex's run-id placeholder in a task's args, and the run id it stands for when a test gives none.
RUN_ID_PLACEHOLDER = "{{$.pipeline_job_uuid}}"
DEFAULT_RUN_ID = "effnet-local-run"
# PipelineSpec 2.1 parameter types and the Python type a value of each takes.
PARAMETER_TYPES = {"STRING": str, "NUMBER_INTEGER": int, "NUMBER_DOUBLE": float, "BOOLEAN": bool}


@dataclasses.dataclass(frozen=True)
class TaskResult:
    """One executed task: the ``ExecutorInput`` it was given and the ``ExecutorOutput`` it wrote (as dicts)."""

    task: str
    executor_input: dict
    executor_output: dict
    log_path: str
    argv: tuple[str, ...] = ()  # what was run

    def artifacts(self, key: str) -> list[dict]:
        """The output artifacts ``key`` (each with ``name``, ``uri`` and ``metadata``)."""
        return self.executor_output.get("artifacts", {}).get(key, {}).get("artifacts", [])

    def artifact(self, key: str) -> dict:
        (artifact,) = self.artifacts(key)
        return artifact


def is_kubeflow(job: dict) -> bool:
    """A bare PipelineSpec (what Kubeflow Pipelines runs), not a Vertex PipelineJob."""
    return "pipelineSpec" not in job


def pipeline_spec(job: dict) -> dict:
    return job if is_kubeflow(job) else job["pipelineSpec"]


def compiled_root(job: dict) -> str:
    if is_kubeflow(job):
        return job["defaultPipelineRoot"].rstrip("/")
    return job["runtimeConfig"]["gcsOutputDirectory"].rstrip("/")


def _compiled_values(job: dict) -> dict:
    """The parameter values a run takes unless given others: the PipelineJob's ``runtimeConfig``, or a bare
    spec's defaults."""
    if not is_kubeflow(job):
        return job["runtimeConfig"].get("parameterValues", {})
    declared = job["root"].get("inputDefinitions", {}).get("parameters", {})
    return {name: p["defaultValue"] for name, p in declared.items() if "defaultValue" in p}


def _typed(value, parameter_type: str):
    """A parameter value as its declared type (JSON numbers of ``parameterValues`` are doubles)."""
    kind = PARAMETER_TYPES[parameter_type]
    if kind is int and float(value) != int(float(value)):
        raise ValueError(f"{value!r} is not an integer")
    return kind(float(value)) if kind is int else kind(value)


def runtime_parameters(job: dict, overrides: Mapping[str, object] | None = None) -> dict:
    """The run's parameter values: ``runtimeConfig`` defaults, replaced by ``overrides`` (typed as declared).

    Raises:
      ValueError: an override names no declared parameter.
    """
    declared = pipeline_spec(job)["root"].get("inputDefinitions", {}).get("parameters", {})
    values = {
        name: _typed(value, declared[name]["parameterType"]) for name, value in _compiled_values(job).items()
    }
    for name, value in (overrides or {}).items():
        if name not in declared:
            raise ValueError(f"{name} is not a runtime parameter; declared: {', '.join(sorted(declared))}")
        values[name] = _typed(value, declared[name]["parameterType"])
    return values


def _relocate(text: str, job: dict, root: str) -> str:
    return text.replace(compiled_root(job), root.rstrip("/"))


def task_path(job: dict, task: str) -> list[dict]:
    """The DAG tasks from the root down to ``task`` (the last): the DAGs enclosing it, then the task.

    Raises:
      KeyError: no DAG has the task.
    """
    spec = pipeline_spec(job)

    def search(component: dict, path: list[dict]) -> list[dict] | None:
        for name, candidate in component.get("dag", {}).get("tasks", {}).items():
            if name == task:
                return [*path, candidate]
            found = search(spec["components"].get(candidate["componentRef"]["name"], {}), [*path, candidate])
            if found:
                return found
        return None

    path = search(spec["root"], [])
    if path is None:
        raise KeyError(f"no task {task} in the compiled pipeline")
    return path


def _dag_task(job: dict, task: str) -> dict:
    return task_path(job, task)[-1]


def _executor_label(job: dict, task: str) -> str:
    spec = pipeline_spec(job)
    return spec["components"][_dag_task(job, task)["componentRef"]["name"]]["executorLabel"]


def _is_resolver(job: dict, task: str) -> bool:
    return "resolver" in pipeline_spec(job)["deploymentSpec"]["executors"][_executor_label(job, task)]


def _root_parameter(job: dict, task: str, source: str) -> str:
    """The root parameter a ``componentInputParameter`` of ``task`` comes from, through its enclosing DAGs."""
    for enclosing in reversed(task_path(job, task)[:-1]):
        binding = enclosing.get("inputs", {}).get("parameters", {}).get(source, {})
        if "componentInputParameter" not in binding:
            raise ValueError(f"{task}: {source} is not passed into its DAG from the root")
        source = binding["componentInputParameter"]
    return source


def build_executor_input(
    job: dict,
    task: str,
    pipeline_root: str,
    parameters: Mapping[str, object],
    upstream: Mapping[str, TaskResult],
    output_file: str,
    execution: int = 1,
    run_id: str = DEFAULT_RUN_ID,
    backend_version: tuple[int, ...] = (2, 5, 0),
) -> dict:
    """The ``ExecutorInput`` (as a dict) the launcher hands task ``task`` in place of ``{{$}}``.

    Args:
      parameters: the run's parameter values (``runtime_parameters``).
      upstream: the results of the tasks this one reads artifacts of, by task name.
      execution: numbers this task's output URIs (Vertex layout), so a task can run more than once on one root.
      run_id: the run's id, for the run-id placeholder and (Kubeflow) the output URIs.
      backend_version: the Kubeflow backend modelled (a bare spec only): before 2.5.0 the run-id placeholder of
        an input parameter is left as it is.

    Raises:
      ValueError: an input artifact's producer has not run (and is not a resolver) or a binding this launcher
        does not implement.
    """
    spec = pipeline_spec(job)
    dag_task = _dag_task(job, task)
    component = spec["components"][dag_task["componentRef"]["name"]]
    root = pipeline_root.rstrip("/")
    declared = spec["root"].get("inputDefinitions", {}).get("parameters", {})

    values = {}
    for name, binding in dag_task.get("inputs", {}).get("parameters", {}).items():
        if "runtimeValue" in binding:
            value = binding["runtimeValue"]["constant"]
            if value == RUN_ID_PLACEHOLDER and (not is_kubeflow(job) or tuple(backend_version) >= (2, 5, 0)):
                value = run_id
            elif isinstance(value, str):
                value = _relocate(value, job, root)
        elif "componentInputParameter" in binding:
            source = _root_parameter(job, task, binding["componentInputParameter"])
            value = _typed(parameters[source], declared[source]["parameterType"])
        else:
            raise ValueError(f"{task}.{name}: unsupported parameter binding {binding}")
        values[name] = value

    schemas = component.get("inputDefinitions", {}).get("artifacts", {})
    inputs = {}
    for name, binding in dag_task.get("inputs", {}).get("artifacts", {}).items():
        source = binding.get("taskOutputArtifact")
        if source is None:
            raise ValueError(f"{task}.{name}: unsupported artifact binding {binding}")
        producer = source["producerTask"]
        if producer in upstream:
            found = upstream[producer].artifacts(source["outputArtifactKey"])
        elif _is_resolver(job, producer):
            found = []  # the latest blessed model: none yet
        else:
            raise ValueError(f"{task}.{name} reads {producer}, which has not run")
        schema = schemas[name]["artifactType"]
        inputs[name] = {"artifacts": [{**artifact, "type": schema} for artifact in found]}

    salt = str(uuid.uuid4())

    def output(key: str, definition: dict) -> dict:
        if is_kubeflow(job):  # Kubeflow's driver: the run's root is {root}/{pipeline name}/{run id}; no name
            run_root = f"{root}/{spec['pipelineInfo']['name']}/{run_id}"
            uri = f"{run_root}/{task}/{salt}/{key}"  # the salt: one random UUID per execution
            return {"uri": uri, "type": definition["artifactType"], "metadata": {}}
        return {
            "name": ARTIFACT_NAME.format(task=task, key=key, execution=execution),
            "uri": f"{root}/{task}/{key}/{execution}",
            "type": definition["artifactType"],
            "metadata": {},
        }

    outputs = {
        key: {"artifacts": [output(key, definition)]}
        for key, definition in component.get("outputDefinitions", {}).get("artifacts", {}).items()
    }
    return {
        "inputs": {"parameterValues": values, "artifacts": inputs},
        "outputs": {"artifacts": outputs, "outputFile": output_file},
    }


@dataclasses.dataclass(frozen=True)
class Images:
    """Runs each task in the image its spec names, with a real Docker daemon (``docker run``), instead of in
    this interpreter.

    The container gets what the orchestrator gives a task's pod: the spec's command as its entry point (which
    replaces the image's, as Kubernetes' ``command`` does) and the args filled in; here also the host's
    network (the fakes listen on 127.0.0.1), the run's local directories at the same paths (``shared``), this
    directory read-only on its PYTHONPATH (a fake's wrapper runs in the image too), the suite's environment
    (``suite_env.PINNED``) and the task's ``env``.
    """

    docker: str
    shared: tuple[str, ...]

    def argv(self, image: str, inner: list[str], env: Mapping[str, str]) -> list[str]:
        import suite_env

        environment = {k: os.environ[k] for k in suite_env.PINNED if k in os.environ}
        environment.update(env)
        environment["PYTHONPATH"] = TESTS_DIR
        mounts = [arg for path in (*self.shared, TESTS_DIR) for arg in ("-v", f"{path}:{path}")]
        mounts[-1] += ":ro"
        variables = [arg for item in environment.items() for arg in ("-e", "=".join(item))]
        return [
            self.docker, "run", "--rm", "--network", "host", *mounts, *variables,
            "--entrypoint", inner[0], image, *inner[1:],
        ]  # fmt: skip


def task_image(job: dict, task: str) -> str:
    """The image the compiled spec runs ``task`` in."""
    return pipeline_spec(job)["deploymentSpec"]["executors"][_executor_label(job, task)]["container"]["image"]


def container_argv(
    job: dict,
    task: str,
    executor_input: dict,
    pipeline_root: str,
    dataflow: Sequence[str] | None = None,
    run_id: str = DEFAULT_RUN_ID,
    in_image: bool = False,
) -> list[str]:
    """The task's container command and args, ``{{$}}`` and the run's id filled in, and the Beam runner made
    local (or, with ``dataflow`` options, kept, the options added). ``python`` is this interpreter unless the
    command runs ``in_image``."""
    spec = pipeline_spec(job)
    container = spec["deploymentSpec"]["executors"][_executor_label(job, task)]["container"]
    command = list(container["command"])
    if command[0] == "python" and not in_image:
        command[0] = sys.executable
    args = []
    for arg in container.get("args", []):
        if arg == PLACEHOLDER:
            args.append(json.dumps(executor_input))
        elif arg == DATAFLOW_RUNNER:
            args.extend([arg, *dataflow] if dataflow is not None else LOCAL_BEAM_ARGS)
        elif RUN_ID_PLACEHOLDER in arg:  # Vertex fills it in; Kubeflow passes it on as it is
            args.append(arg if is_kubeflow(job) else arg.replace(RUN_ID_PLACEHOLDER, run_id))
        elif "{{$" in arg:
            raise ValueError(f"{task}: placeholder this launcher does not implement: {arg}")
        else:
            args.append(_relocate(arg, job, pipeline_root))
    return [*command, *args]


@dataclasses.dataclass
class StartedTask:
    """A task's container process started by ``start_task``; ``finish`` waits for it and reads its output."""

    task: str
    process: subprocess.Popen
    executor_input: dict
    output_file: str
    log_path: str
    argv: tuple[str, ...] = ()

    def finish(self, timeout: float = 900) -> TaskResult:
        """Waits for the container to end and returns what its executor wrote.

        Raises:
          RuntimeError: the container exited non-zero (the message quotes the end of its log).
        """
        code = self.process.wait(timeout=timeout)
        if code:
            with open(self.log_path, errors="replace") as log:
                tail = "".join(log.readlines()[-LOG_TAIL_LINES:])
            raise RuntimeError(f"task {self.task} exited with {code}; end of {self.log_path}:\n{tail}")
        with open(self.output_file) as f:
            executor_output = json.load(f)
        return TaskResult(self.task, self.executor_input, executor_output, self.log_path, self.argv)


def start_task(
    job: dict,
    task: str,
    pipeline_root: str,
    scratch_dir: str,
    parameters: Mapping[str, object],
    upstream: Mapping[str, TaskResult] | None = None,
    execution: int = 1,
    wrapper: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    run_id: str = DEFAULT_RUN_ID,
    dataflow: Sequence[str] | None = None,
    executor_input: dict | None = None,
    images: Images | None = None,
) -> StartedTask:
    """Starts ``task`` of the compiled ``job`` as its container would (see ``run_task``), without waiting; with
    ``executor_input``, that of an earlier attempt (a retry)."""
    task_dir = os.path.join(scratch_dir, f"{task}-{execution}")
    os.makedirs(task_dir, exist_ok=True)
    output_file = os.path.join(task_dir, "executor_output.json")
    if executor_input is None:
        executor_input = build_executor_input(
            job, task, pipeline_root, parameters, upstream or {}, output_file, execution, run_id
        )
    output_file = executor_input["outputs"]["outputFile"]
    command = container_argv(job, task, executor_input, pipeline_root, dataflow, run_id, images is not None)
    if images is not None:  # the wrapper runs in the image too, with the image's python
        wrapper = ["python" if arg == sys.executable else arg for arg in wrapper]
        argv = images.argv(task_image(job, task), [*wrapper, *command], env or {})
    else:
        argv = [*wrapper, *command]
    child_env = {**os.environ, **(env or {})}
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS_DIR, child_env.get("PYTHONPATH")) if p)
    log_path = os.path.join(task_dir, "log.txt")
    while os.path.exists(log_path):  # a retried attempt logs beside the earlier one's
        log_path = log_path.replace(".txt", "-retry.txt")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, cwd=REPO_DIR, env=child_env, stdout=log, stderr=subprocess.STDOUT)
    return StartedTask(task, process, executor_input, output_file, log_path, tuple(argv))


def run_task(
    job: dict,
    task: str,
    pipeline_root: str,
    scratch_dir: str,
    parameters: Mapping[str, object],
    upstream: Mapping[str, TaskResult] | None = None,
    execution: int = 1,
    wrapper: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 900,
    run_id: str = DEFAULT_RUN_ID,
    dataflow: Sequence[str] | None = None,
    images: Images | None = None,
) -> TaskResult:
    """Runs ``task`` of the compiled ``job`` as its container would, and returns what its executor wrote.

    Args:
      pipeline_root: the run's root (local or gs://) for the output artifacts.
      scratch_dir: a local directory for the executor output file, the executor's temp dir and the task's log.
      parameters: the run's parameter values (``runtime_parameters``).
      upstream: results of the tasks this one depends on, by task name.
      execution: numbers the output URIs (run a task twice on one root with 1, 2...).
      wrapper: a command put in front of the container's (e.g. ``fake_vertex.wrapper(...)``).
      env: variables added to this process's environment for the container; ``tests/`` is on its PYTHONPATH.
      run_id: the run's id, in place of the run-id placeholder of the task's args.
      dataflow: Beam options that keep a Beam task on the DataflowRunner, pointed at a fake Dataflow service
        (``fake_dataflow.FakeDataflow.beam_args``); None runs it on the DirectRunner.
      images: run the task in its image with Docker (``Images``) rather than in this interpreter.

    Raises:
      RuntimeError: the container exited non-zero (the message quotes the end of its log).
    """
    started = start_task(
        job, task, pipeline_root, scratch_dir, parameters, upstream, execution, wrapper, env, run_id, dataflow,
        images=images,
    )  # fmt: skip
    try:
        return started.finish(timeout)
    except subprocess.TimeoutExpired:
        started.process.kill()
        raise


def retry_policy(job: dict, task: str) -> dict:
    """The task's compiled ``retryPolicy`` ({} without one)."""
    return _dag_task(job, task).get("retryPolicy", {})


def _seconds(duration: str) -> float:
    return float(duration.rstrip("s") or 0)


def run_task_retried(
    job: dict,
    task: str,
    pipeline_root: str,
    scratch_dir: str,
    parameters: Mapping[str, object],
    upstream: Mapping[str, TaskResult] | None = None,
    kill_first_when=None,
    backoff_scale: float = 1.0,
    timeout: float = 900,
    **kwargs,
) -> tuple[TaskResult, int]:
    """Runs ``task`` as an orchestrator honouring its compiled ``retryPolicy`` does: a failed attempt is started
    again (the same ``ExecutorInput``) up to ``maxRetryCount`` more times, after ``backoffDuration`` times
    ``backoffFactor`` per retry (at most ``backoffMaxDuration``), scaled by ``backoff_scale``. Returns the result
    and the attempts made.

    ``kill_first_when``: a predicate of the first attempt (a ``StartedTask``), polled while it runs; once it
    holds, the attempt is SIGKILLed (its pod evicted, its node lost).

    Raises:
      RuntimeError: the last attempt failed too.
    """
    import time

    policy = retry_policy(job, task)
    started = start_task(job, task, pipeline_root, scratch_dir, parameters, upstream, **kwargs)
    if kill_first_when is not None:
        deadline = time.monotonic() + timeout
        while started.process.poll() is None and not kill_first_when(started):
            if time.monotonic() > deadline:
                started.process.kill()
                raise RuntimeError(f"task {task}: what the test waited for never happened")
            time.sleep(0.2)
        started.process.kill()
    retries, backoff = 0, _seconds(policy.get("backoffDuration", "0s"))
    while True:
        try:
            return started.finish(timeout), retries + 1
        except RuntimeError:
            if retries >= int(policy.get("maxRetryCount", 0)):
                raise
        wait = min(backoff * float(policy.get("backoffFactor", 2.0)) ** retries,
                   _seconds(policy.get("backoffMaxDuration", "3600s")))  # fmt: skip
        time.sleep(wait * backoff_scale)
        retries += 1
        started = start_task(
            job, task, pipeline_root, scratch_dir, parameters, upstream, executor_input=started.executor_input,
            **kwargs,
        )  # fmt: skip
