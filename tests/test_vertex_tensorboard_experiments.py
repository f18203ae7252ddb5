"""``--tensorboard`` and ``--experiment`` of a run submitted to Vertex AI Pipelines, against the fakes.

The PipelineJob, the TensorBoard instances and the metadata store (where Vertex AI Experiments live) are faked at
their GAPIC clients (``fake_vertex.FakePipelineService``, ``fake_vertex_metadata``); everything up to the network
call is the SDK's and this project's. What the training and tuning jobs are sent (the TensorBoard, their logs'
directory) is checked where the Trainer and Tuner steps run against the fake job service
(``test_vertex_training.py``).
"""

import json
import types

import faults
import pytest
from fake_vertex_metadata import FakeMetadataService, FakeTensorboardService
from test_vertex import SERVICE_ACCOUNT, _compile, vertex_pipelines  # noqa: F401 - a fixture of the submissions

from pipeline import kubeflow_v2_runner, vertex_submission
from pipeline.template import Template, pipeline_tasks

TENSORBOARD = "projects/my-project/locations/us-central1/tensorboards/1234"
EXPERIMENT = "effnet-b0"
STORE = "projects/my-project/locations/us-central1/metadataStores/default"
EXPERIMENT_CONTEXT = f"{STORE}/contexts/{EXPERIMENT}"


@pytest.fixture(scope="module")
def tensorboard_template(tmp_path_factory):
    """A PipelineJob whose training jobs stream to ``TENSORBOARD`` (read only)."""
    compiled = ["--service-account", SERVICE_ACCOUNT, "--tensorboard", TENSORBOARD]
    code, output = _compile(tmp_path_factory.mktemp("tensorboard"), *compiled)
    assert code == 0
    return str(output)


@pytest.fixture
def vertex(vertex_pipelines, monkeypatch):  # noqa: F811 - the fixture imported above
    """Vertex AI Pipelines, its TensorBoard instances (``TENSORBOARD``) and its metadata store, faked."""
    metadata = FakeMetadataService().install(monkeypatch)
    vertex_pipelines.metadata = metadata
    monkeypatch.setattr(vertex_submission, "RUN_CONTEXT_POLL_SECONDS", 0.0)
    return types.SimpleNamespace(
        pipelines=vertex_pipelines,
        metadata=metadata,
        tensorboards=FakeTensorboardService(instances=[TENSORBOARD]).install(monkeypatch),
    )


def _submit(template: str, *extra) -> int:
    return kubeflow_v2_runner.main(["--template", template, "--submit", *extra])


def _trainer_job_spec(pipeline_job) -> dict:
    """The training job's spec compiled into a created PipelineJob's Trainer task."""
    spec = type(pipeline_job).to_dict(pipeline_job)["pipeline_spec"]
    parameters = pipeline_tasks(spec)["Trainer"]["inputs"]["parameters"]
    custom_config = json.loads(parameters["custom_config"]["runtimeValue"]["constant"])
    return custom_config["ai_platform_training_args"]["job_spec"]


def test_the_run_is_checked_against_its_tensorboard_and_goes_into_the_experiment_with_its_parameters(
    tensorboard_template, vertex, capsys
):
    """The instance is read on its region's endpoint, the experiment made (with the store it lives in), the run
    created once; Vertex makes the run's context as it starts (here at the second read), which becomes a child
    of the experiment's, holding the run's parameters as Vertex records them. ``--wait`` follows it on."""
    vertex.pipelines.run_context_after = 2
    vertex.pipelines.states = ["PIPELINE_STATE_RUNNING"] * 3 + ["PIPELINE_STATE_SUCCEEDED"]
    code = _submit(tensorboard_template, "--param", "train_epochs=30", "--experiment", EXPERIMENT, "--wait")
    assert code == 0
    out = capsys.readouterr().out.splitlines()

    assert vertex.tensorboards.gets == [("us-central1-aiplatform.googleapis.com", TENSORBOARD)]
    ((_, job, job_id),) = vertex.pipelines.created
    spec = _trainer_job_spec(job)
    assert (spec["tensorboard"], spec["service_account"]) == (TENSORBOARD, SERVICE_ACCOUNT)
    assert spec["base_output_directory"] == {
        "output_uri_prefix": "gs://my-bucket/pipelines/tensorboard/effnet-b0-rmsprop-8x2048/trainer"
    }
    experiment = vertex.metadata.contexts[EXPERIMENT_CONTEXT]
    assert (experiment.schema_title, experiment.display_name) == ("system.Experiment", EXPERIMENT)
    assert STORE in vertex.metadata.stores
    runs = vertex.metadata.experiment_runs(EXPERIMENT_CONTEXT)
    assert list(runs) == [f"{STORE}/contexts/{job_id}"]
    (parameters,) = runs.values()
    assert parameters["input:train_epochs"] == 30
    assert parameters["input:target_top1"] == Template.read(tensorboard_template).defaults["target_top1"]
    assert out[2] == (
        "in experiment effnet-b0: https://console.cloud.google.com/vertex-ai/experiments/locations/us-central1/"
        "experiments/effnet-b0?project=my-project"
    )
    assert out[-2:] == ["run state: PIPELINE_STATE_RUNNING", "run state: PIPELINE_STATE_SUCCEEDED"]


@pytest.mark.parametrize(
    "case,message",
    [
        ("another region", "error: --tensorboard projects/my-project/locations/us-central1/tensorboards/1234: Vertex AI "
         "has no such TensorBoard in us-central1 (404 Tensorboard projects/my-project/locations/us-central1/"
         "tensorboards/1234 not found); the training jobs stream only to one of their region: create it there or "
         "name another"),
        ("denied", "error: --tensorboard projects/my-project/locations/us-central1/tensorboards/1234: permission denied "
         "(403 Permission 'aiplatform.tensorboards.get' denied on resource '//aiplatform.googleapis.com/projects/"
         "my-project/locations/us-central1/tensorboards/1234' (or it may not exist).); the training jobs stream to "
         f"it as {SERVICE_ACCOUNT}, which needs roles/aiplatform.user in project my-project (as does the account "
         "submitting, to look it up)"),
    ],
)  # fmt: skip
def test_a_tensorboard_the_run_cannot_stream_to_is_refused_in_one_line_before_the_run_is_created(
    tensorboard_template, vertex, capsys, case, message
):
    if case == "another region":  # the instance's id exists, in another region than the jobs'
        vertex.tensorboards.instances = {TENSORBOARD.replace("us-central1", "europe-west4")}
    else:
        vertex.tensorboards.denied = True
    assert _submit(tensorboard_template, "--experiment", EXPERIMENT) == 2
    assert capsys.readouterr().err.strip().splitlines() == [message]
    assert vertex.pipelines.created == [] and vertex.metadata.contexts == {}


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--service-account", SERVICE_ACCOUNT, "--tensorboard", TENSORBOARD.replace("us-central1", "europe-west4")],
         "error: --tensorboard projects/my-project/locations/europe-west4/tensorboards/1234 is in europe-west4: Vertex "
         "AI takes a training job's logs only into a TensorBoard of the job's region (--region us-central1); name one "
         "in us-central1"),
        (["--tensorboard", TENSORBOARD], "error: --tensorboard needs --service-account: Vertex AI runs a job that "
         "writes to a TensorBoard only as a service account given to it"),
        (["--service-account", SERVICE_ACCOUNT, "--tensorboard", "1234"],
         "error: --tensorboard '1234' must be projects/PROJECT/locations/REGION/tensorboards/ID"),
        (["--service-account", SERVICE_ACCOUNT, "--tensorboard", TENSORBOARD, "--accelerator", "tpu-v4-32",
          "--preset", "demo"], "error: --tensorboard attaches Vertex AI training jobs; --accelerator tpu-v4-32 trains "
         "on a TPU VM slice, outside Vertex AI"),
        (["--experiment", "EffNet_B0"], "error: --experiment 'EffNet_B0': a Vertex AI experiment's name is 4 to 128 "
         "lowercase letters, digits and '-'"),
        (["--experiment", "b0"], "error: --experiment 'b0': a Vertex AI experiment's name is 4 to 128"),
    ],
)  # fmt: skip
def test_what_the_run_cannot_stream_to_or_go_into_is_refused_in_one_line_before_anything_is_written(
    tmp_path, vertex, capsys, extra, message
):
    experiment = [] if "--experiment" in extra else ["--experiment", EXPERIMENT]
    code, _ = _compile(tmp_path, *extra, "--submit", *experiment)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(message), err
    assert list(tmp_path.iterdir()) == []
    assert vertex.pipelines.created == [] and vertex.tensorboards.gets == [] and vertex.metadata.calls == []


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--experiment", EXPERIMENT], "error: --experiment puts a submitted run into a Vertex AI experiment: add --submit"),
        (["--experiment", EXPERIMENT, "--submit", "--kfp-host", "http://127.0.0.1:1"], "error: --experiment is a "
         "Vertex AI experiment; a Kubeflow Pipelines run goes into the experiment named after the pipeline"),
        (["--tensorboard", TENSORBOARD.replace("1234", "99"), "--submit"], "error: --tensorboard "
         "projects/my-project/locations/us-central1/tensorboards/99: the template was compiled for tensorboard "
         f"{TENSORBOARD}, which its training jobs stream their logs to; compile it again with --tensorboard "),
    ],
)  # fmt: skip
def test_a_submission_that_cannot_go_where_asked_is_refused_in_one_line(
    tensorboard_template, vertex, capsys, extra, message
):
    assert kubeflow_v2_runner.main(["--template", tensorboard_template, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message), err
    assert vertex.pipelines.created == [] and vertex.tensorboards.gets == [] and vertex.metadata.calls == []


def test_transient_faults_of_the_lookups_are_waited_out(tensorboard_template, vertex):
    """503 and a dropped connection reading the TensorBoard, 503 creating the experiment (before the service made
    it: the retry finds none and creates it), 503 adding the run to it."""
    vertex.tensorboards.faults = faults.FaultSchedule({"get_tensorboard": ["503", "drop"]})
    vertex.metadata.faults = faults.FaultSchedule(
        {"create_context": ["503"], "add_context_children": ["503"]}
    )
    assert _submit(tensorboard_template, "--experiment", EXPERIMENT) == 0
    assert len(vertex.tensorboards.gets) == 1 and len(vertex.pipelines.created) == 1
    assert len(vertex.metadata.experiment_runs(EXPERIMENT_CONTEXT)) == 1
    assert sorted(vertex.tensorboards.faults.injected + vertex.metadata.faults.injected) == [
        ("add_context_children", "503"),
        ("create_context", "503"),
        ("get_tensorboard", "503"),
        ("get_tensorboard", "drop"),
    ]


def test_an_experiment_another_submission_creates_meanwhile_is_taken(tensorboard_template, vertex):
    """Between the SDK's get of the experiment (not found) and its create, another submission creates it: the
    create is refused ALREADY_EXISTS (the SDK does not take that for the experiment), and the experiment is got."""
    vertex.metadata.racing = {EXPERIMENT_CONTEXT}
    assert _submit(tensorboard_template, "--experiment", EXPERIMENT) == 0
    assert [call for call, _ in vertex.metadata.calls].count("create_context") == 1
    assert (
        len(vertex.pipelines.created) == 1 and len(vertex.metadata.experiment_runs(EXPERIMENT_CONTEXT)) == 1
    )


def test_a_name_taken_by_another_kind_of_context_is_refused_in_one_line_before_the_run_is_created(
    tensorboard_template, vertex, capsys
):
    vertex.metadata.add_context(EXPERIMENT_CONTEXT, "system.PipelineRun")
    assert _submit(tensorboard_template, "--experiment", EXPERIMENT) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --experiment effnet-b0: Experiment name effnet-b0 is of type (system.PipelineRun) in this "
        "MetadataStore. It must of type system.Experiment; choose another name"
    ]
    assert vertex.pipelines.created == []


@pytest.mark.parametrize(
    "case,reason,code",
    [
        ("refused", "(PermissionDenied: 403 add_context_children: injected fault 403)", 0),
        (
            "no run context",
            "(RuntimeError: Vertex made no metadata context for the run (PIPELINE_STATE_FAILED))",
            1,
        ),
    ],
)
def test_a_run_that_cannot_be_put_into_the_experiment_is_said_in_one_line_and_goes_on_not_created_again(
    tensorboard_template, vertex, capsys, case, reason, code
):
    if case == "refused":
        vertex.metadata.faults = faults.FaultSchedule({"add_context_children": ["403*"]})
    else:  # the run failed before Vertex made its context
        vertex.pipelines.run_context_after = 1000
        vertex.pipelines.states = ["PIPELINE_STATE_FAILED"]
    assert _submit(tensorboard_template, "--experiment", EXPERIMENT, "--wait") == code
    captured = capsys.readouterr()
    ((parent, _, job_id),) = vertex.pipelines.created
    assert captured.err.strip().splitlines() == [
        f"warning: {parent}/pipelineJobs/{job_id} was created but not put into experiment effnet-b0 {reason}; the "
        "run goes on outside it"
    ]
    out = captured.out.splitlines()
    assert out[0] == f"submitted Vertex PipelineJob {parent}/pipelineJobs/{job_id}"
    assert out[-1] == "run state: " + ("PIPELINE_STATE_SUCCEEDED" if code == 0 else "PIPELINE_STATE_FAILED")
    assert vertex.metadata.experiment_runs(EXPERIMENT_CONTEXT) == {}
