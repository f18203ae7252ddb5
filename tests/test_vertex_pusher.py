"""The Vertex push: a registry version per blessed model, served alone, idempotent on retry (the gapic clients
faked in tests/fake_vertex_registry.py, which returns names as the service does: the project number, deployed
models with their @version; everything up to the clients is the real code and the real messages)."""

import os

import pytest
from fake_vertex_registry import PROJECTS, FakeModelRegistry
from google.api_core import exceptions
from google.cloud import aiplatform_v1
from tfx.types import standard_artifacts, standard_component_specs
from tfx.utils import json_utils

from components import vertex_pusher

PARENT = "projects/p/locations/us-central1"  # as the caller names it: the project ID
NUMBERED = f"projects/{PROJECTS['p']}/locations/us-central1"  # as the service names it
SERVING_IMAGE = "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest"
LABELS = {"effnet-pipeline": "effnet-b0", "effnet-preset": "b0"}


def _target(endpoint="serving", **changes):
    values = dict(
        project="p",
        region="us-central1",
        pipeline="effnet-b0",
        endpoint=endpoint,
        serving_image=SERVING_IMAGE,
        labels=LABELS,
    )
    return vertex_pusher.PushTarget(**{**values, **changes})


@pytest.fixture
def registry(monkeypatch):
    return FakeModelRegistry().install(monkeypatch)


def _served(registry, endpoint_name):
    endpoint = registry.endpoints[endpoint_name]
    served = {}
    for d in endpoint.deployed_models:
        model, _, version = d.model.partition("@")
        assert version == d.model_version_id  # the service writes the version into the deployed model's name
        served[(model, version)] = endpoint.traffic_split.get(d.id, 0)
    return served


def test_each_blessed_model_is_a_version_served_alone_and_other_pipelines_stay(registry):
    first = vertex_pusher.push(_target(), "gs://b/push/1", "run-1")
    assert first.version_id == "1" and first.uploaded and registry.calls.count("create_endpoint") == 1
    assert first.model.startswith(NUMBERED + "/models/") and first.endpoint.startswith(
        NUMBERED + "/endpoints/"
    )
    endpoint = registry.endpoints[first.endpoint]
    assert endpoint.display_name == "serving" and dict(endpoint.labels) == LABELS
    (version,) = registry.models[first.model]
    assert version.artifact_uri == "gs://b/push/1" and version.labels["effnet-push"] == "run-1"
    assert version.container_spec.image_uri == SERVING_IMAGE
    assert _served(registry, first.endpoint) == {(first.model, "1"): 100}

    foreign = registry.deploy_foreign(first.endpoint, aiplatform_v1.Model(display_name="someone-else"))
    second = vertex_pusher.push(_target(), "gs://b/push/2", "run-2")
    assert (second.model, second.version_id, second.endpoint) == (first.model, "2", first.endpoint)
    assert second.undeployed == (first.deployed_model_id,)
    served = _served(registry, first.endpoint)
    assert served[(first.model, "2")] == 100 and (first.model, "1") not in served
    assert [d.id for d in registry.endpoints[first.endpoint].deployed_models].count(foreign) == 1
    assert len(registry.models[first.model]) == 2  # the registry keeps every version
    # The served version is the model's default one (what a request naming no version gets), not the first.
    assert registry.default_version(first.model).version_id == "2"


def test_a_push_outlasts_the_services_transient_faults_and_makes_nothing_twice(registry, monkeypatch):
    """Every call meets a transient fault; the upload, the endpoint's creation and the deployment are made but
    their answers lost: each is found before it would be sent again. One version, one endpoint, one deployment."""
    import fake_vertex
    import faults

    fake_vertex.fast_retries(monkeypatch.setattr)
    vertex_pusher.push(_target(), "gs://b/push/1", "run-1")  # an earlier version, served
    registry.faults = faults.FaultSchedule(
        {
            "list_models": ["503", "429"],
            "list_model_versions": ["drop"],
            "upload_model": ["lost"],
            "list_endpoints": ["500"],
            "get_endpoint": ["504"],
            "deploy_model": ["lost"],
            "undeploy_model": ["503"],
        }
    )
    pushed = vertex_pusher.push(_target(), "gs://b/push/2", "run-2")
    assert not any(registry.faults.plan.values())  # every fault met
    assert pushed.version_id == "2" and len(registry.models[pushed.model]) == 2
    assert registry.calls.count("upload_model") == 2 and registry.calls.count("create_endpoint") == 1
    assert _served(registry, pushed.endpoint) == {(pushed.model, "2"): 100}  # deployed once, the old one gone
    assert len(registry.endpoints[pushed.endpoint].deployed_models) == 1


def test_a_retried_push_uploads_and_deploys_nothing_again(registry):
    pushed = vertex_pusher.push(_target(), "gs://b/push/1", "run-1")
    before = list(registry.calls)
    again = vertex_pusher.push(_target(), "gs://b/push/1", "run-1")
    retried = registry.calls[len(before) :]
    assert "upload_model" not in retried and "deploy_model" not in retried and "undeploy_model" not in retried
    assert (again.model, again.version_id, again.deployed_model_id) == (
        pushed.model,
        pushed.version_id,
        pushed.deployed_model_id,
    )
    assert not again.uploaded


def test_the_evaluation_is_imported_once_through_faults_a_lost_answer_and_a_retried_push(
    registry, monkeypatch
):
    """The pushed version's model evaluation: its listing meets a transient fault and its import is made but its
    answer lost: the import is found by its name before it would be sent again; a retried push imports
    nothing again; the next push's version carries its own."""
    import fake_vertex
    import faults

    fake_vertex.fast_retries(monkeypatch.setattr)
    evaluation = vertex_pusher.Evaluation({"top1": 0.75, "top5": 0.9}, run="run-1")
    registry.faults = faults.FaultSchedule(
        {"list_model_evaluations": ["503"], "import_model_evaluation": ["lost"]}
    )
    pushed = vertex_pusher.push(_target(), "gs://b/push/1", "push-1", evaluation)
    assert not any(registry.faults.plan.values())  # every fault met
    (imported,) = registry.evaluations[f"{pushed.model}@1"]
    assert pushed.evaluation == imported.name and imported.metadata["pipeline_job_id"] == "run-1"
    assert registry.calls.count("import_model_evaluation") == 1
    again = vertex_pusher.push(_target(), "gs://b/push/1", "push-1", evaluation)
    assert again.evaluation == imported.name and registry.calls.count("import_model_evaluation") == 1
    second = vertex_pusher.push(_target(), "gs://b/push/2", "push-2", vertex_pusher.Evaluation({"top1": 0.8}))
    (other,) = registry.evaluations[f"{pushed.model}@2"]
    assert second.evaluation == other.name != imported.name
    assert other.metrics["confidenceMetrics"][0]["recallAt1"] == 0.8


def test_a_push_cut_off_after_its_upload_deploys_the_uploaded_version(registry, monkeypatch):
    class Cut(Exception):
        pass

    real = aiplatform_v1.EndpointServiceClient.deploy_model

    def fail_once(self, **kwargs):
        monkeypatch.setattr(aiplatform_v1.EndpointServiceClient, "deploy_model", real)
        raise Cut()

    monkeypatch.setattr(aiplatform_v1.EndpointServiceClient, "deploy_model", fail_once)
    with pytest.raises(Cut):
        vertex_pusher.push(_target(), "gs://b/push/1", "run-1")
    pushed = vertex_pusher.push(_target(), "gs://b/push/1", "run-1")
    assert registry.calls.count("upload_model") == 1 and len(registry.models[pushed.model]) == 1
    assert _served(registry, pushed.endpoint) == {(pushed.model, "1"): 100}


def test_a_retried_push_makes_its_version_the_default_again(registry, monkeypatch):
    pushed = vertex_pusher.push(_target(), "gs://b/push/1", "run-1")
    vertex_pusher.push(_target(), "gs://b/push/2", "run-2")
    assert registry.default_version(pushed.model).version_id == "2"
    again = vertex_pusher.push(_target(), "gs://b/push/1", "run-1")  # the first model pushed again
    assert not again.uploaded and again.version_id == "1"
    assert registry.default_version(pushed.model).version_id == "1"
    assert _served(registry, pushed.endpoint) == {(pushed.model, "1"): 100}


def test_the_endpoint_by_resource_name_and_an_ambiguous_display_name(registry):
    named = registry.add_endpoint(PARENT, "shared")
    by_project_id = named.name.replace(NUMBERED, PARENT)  # the name as a user writes it
    pushed = vertex_pusher.push(_target(endpoint=by_project_id), "gs://b/push/1", "run-1")
    assert pushed.endpoint == named.name and "create_endpoint" not in registry.calls
    registry.add_endpoint(PARENT, "shared")
    with pytest.raises(ValueError, match="2 endpoints are named shared .*give the resource name"):
        vertex_pusher.push(_target(endpoint="shared"), "gs://b/push/2", "run-2")


def _executor_inputs(tmp_path, blessed: bool):
    model = standard_artifacts.Model()
    model.uri = str(tmp_path / "Trainer" / "model" / "7")
    serving = os.path.join(model.uri, "Format-Serving")
    os.makedirs(os.path.join(serving, "variables"))
    with open(os.path.join(serving, "saved_model.pb"), "wb") as f:
        f.write(b"a saved model")
    blessing = standard_artifacts.ModelBlessing()
    blessing.uri = str(tmp_path / "Evaluator" / "blessing" / "8")
    blessing.set_int_custom_property("blessed", int(blessed))
    for name, value in {"top1": 0.9412, "top5": 0.9977, "evaluated_examples": 1000.0}.items():
        blessing.set_float_custom_property(name, value)  # as the Evaluator leaves them
    pushed = standard_artifacts.PushedModel()
    pushed.uri = str(tmp_path / "VertexPusher" / "pushed_model" / "9")
    inputs = {
        standard_component_specs.MODEL_KEY: [model],
        standard_component_specs.MODEL_BLESSING_KEY: [blessing],
    }
    outputs = {standard_component_specs.PUSHED_MODEL_KEY: [pushed]}
    config = {vertex_pusher.CONFIG_KEY: _target().to_config()}
    properties = {
        standard_component_specs.CUSTOM_CONFIG_KEY: json_utils.dumps(config),
        standard_component_specs.PUSH_DESTINATION_KEY: None,
    }
    return inputs, outputs, properties, model, pushed


def test_the_executor_pushes_a_blessed_model_and_nothing_else(registry, tmp_path):
    inputs, outputs, properties, _, pushed = _executor_inputs(tmp_path / "no", blessed=False)
    vertex_pusher.VertexPusherExecutor().Do(inputs, outputs, properties)
    assert pushed.get_int_custom_property("pushed") == 0 and registry.calls == []

    inputs, outputs, properties, model, pushed = _executor_inputs(tmp_path / "yes", blessed=True)
    vertex_pusher.VertexPusherExecutor().Do(inputs, outputs, properties)
    assert pushed.get_int_custom_property("pushed") == 1
    (name,) = registry.models
    assert pushed.get_string_custom_property("vertex_model") == f"{name}@1"
    assert pushed.get_string_custom_property("pushed_destination").startswith(NUMBERED + "/endpoints/")
    (version,) = registry.models[name]
    assert version.artifact_uri == pushed.uri and version.labels["effnet-push"] == vertex_pusher.push_id(
        model.uri
    )
    with open(os.path.join(pushed.uri, "saved_model.pb"), "rb") as f:
        assert f.read() == b"a saved model"
    # The version carries the Evaluator's result as its model evaluation.
    (evaluation,) = registry.evaluations[f"{name}@1"]
    assert pushed.get_string_custom_property("vertex_model_evaluation") == evaluation.name
    assert evaluation.name.startswith(f"{name}/evaluations/")
    assert evaluation.metrics_schema_uri == vertex_pusher.EVALUATION_SCHEMA
    top1, top5 = evaluation.metrics["confidenceMetrics"]
    assert (top1["maxPredictions"], top1["recallAt1"], top5["maxPredictions"], top5["recall"]) == (
        1, 0.9412, 5, 0.9977
    )  # fmt: skip
    assert (
        evaluation.metadata["evaluated_examples"] == 1000 and evaluation.metadata["pipeline"] == "effnet-b0"
    )


def test_the_executor_names_a_missing_push_config(tmp_path):
    inputs, outputs, properties, _, _ = _executor_inputs(tmp_path, blessed=True)
    properties[standard_component_specs.CUSTOM_CONFIG_KEY] = json_utils.dumps({})
    with pytest.raises(ValueError, match="the Vertex push needs custom_config"):
        vertex_pusher.VertexPusherExecutor().Do(inputs, outputs, properties)


@pytest.mark.parametrize(
    "image,expected",
    [
        ("us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-16:latest", (2, 16)),
        ("europe-docker.pkg.dev/vertex-ai/prediction/tf2-gpu.2-8:latest", (2, 8)),
        ("us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15@sha256:abc", (2, 15)),
        ("gcr.io/me/tf2-cpu.2-15:latest", None),
    ],
)
def test_serving_image_tensorflow_is_read_from_prebuilt_names(image, expected):
    assert vertex_pusher.serving_image_tensorflow(image) == expected


def test_the_registry_fake_holds_the_services_version_rules(registry, monkeypatch):
    """The rules the pusher must not rely on the opposite of: the default version is not the newest; a model
    is named with or without its @version; names come back with the project number."""
    models = aiplatform_v1.ModelServiceClient(
        client_options={"api_endpoint": "us-central1-aiplatform.googleapis.com"}
    )
    endpoints = aiplatform_v1.EndpointServiceClient(
        client_options={"api_endpoint": "us-central1-aiplatform.googleapis.com"}
    )

    def upload(parent_model="", aliases=()):
        model = {
            "display_name": "m",
            "artifact_uri": "gs://b/m",
            "container_spec": {"image_uri": SERVING_IMAGE},
        }
        request = {
            "parent": PARENT,
            "model": {**model, "version_aliases": list(aliases)},
            "parent_model": parent_model,
        }
        return models.upload_model(request=request).result()

    first = upload()
    assert first.model.startswith(NUMBERED + "/models/") and first.model_version_id == "1"
    second = upload(parent_model=first.model.replace(NUMBERED, PARENT))  # the default alias stays on 1
    assert second.model_version_id == "2"
    (listed,) = models.list_models(request={"parent": PARENT})
    assert (listed.name, listed.version_id) == (first.model, "1")  # the default version, not the newest
    assert models.get_model(name=first.model).version_id == "1"
    assert models.get_model(name=f"{first.model}@2").version_id == "2"
    assert models.get_model(name=f"{first.model}@default").version_id == "1"
    assert [v.name for v in models.list_model_versions(request={"name": first.model})] == [
        f"{first.model}@1",
        f"{first.model}@2",
    ]

    endpoint = endpoints.create_endpoint(parent=PARENT, endpoint={"display_name": "e"}).result()
    spec = {"dedicated_resources": {"machine_spec": {"machine_type": "n1-standard-4"}}}
    endpoints.deploy_model(
        endpoint=endpoint.name, deployed_model={"model": first.model, **spec}, traffic_split={"0": 100}
    ).result()
    (deployed,) = endpoints.get_endpoint(name=endpoint.name.replace(NUMBERED, PARENT)).deployed_models
    assert (deployed.model, deployed.model_version_id) == (f"{first.model}@1", "1")  # no @: the default

    upload(parent_model=first.model, aliases=["default"])  # version 3 takes the default alias
    assert models.get_model(name=first.model).version_id == "3"
    with pytest.raises(exceptions.FailedPrecondition):
        models.merge_version_aliases(name=f"{first.model}@3", version_aliases=["-default"])
    with pytest.raises(exceptions.InvalidArgument):
        models.merge_version_aliases(name=first.model, version_aliases=["golden"])
    with pytest.raises(exceptions.PermissionDenied):
        models.list_models(request={"parent": "projects/someone-else/locations/us-central1"})


@pytest.mark.parametrize("region", ["us-central1", "europe-west4", "asia-east1", "me-west1"])
def test_a_refused_serving_image_names_one_the_pinned_sdk_lists(region):
    from google.cloud.aiplatform.constants import prediction

    for image, reason in (
        (
            "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-16:latest",
            "lists no such prebuilt prediction image",
        ),
        (
            "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-12:latest",
            "serves with TensorFlow 2.12, older than 2.15",
        ),
    ):
        with pytest.raises(ValueError, match=reason) as refused:
            vertex_pusher.check_serving_image(image, region)
        suggested = str(refused.value).split("use ")[1].split(",")[0]
        assert suggested in prediction.TF_CONTAINER_URIS and suggested.endswith("/tf2-cpu.2-15:latest")
        assert suggested.startswith(
            region.split("-")[0] if region.startswith(("us", "europe", "asia")) else "us"
        )
    gpu = vertex_pusher.check_serving_image(
        "us-docker.pkg.dev/vertex-ai/prediction/tf2-gpu.2-15:latest", region
    )
    assert gpu is None
