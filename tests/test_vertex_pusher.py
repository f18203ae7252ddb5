"""The Vertex push: a registry version per blessed model, served alone, idempotent on retry (the gapic clients
faked in tests/fake_vertex_registry.py; everything up to them is the real code and the real messages)."""

import os

import pytest
from fake_vertex_registry import FakeModelRegistry
from google.cloud import aiplatform_v1
from tfx.types import standard_artifacts, standard_component_specs
from tfx.utils import json_utils

from components import vertex_pusher

PARENT = "projects/p/locations/us-central1"
LABELS = {"effnet-pipeline": "effnet-b0", "effnet-preset": "b0"}


def _target(endpoint="serving", **changes):
    values = dict(
        project="p",
        region="us-central1",
        pipeline="effnet-b0",
        endpoint=endpoint,
        serving_image="us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-16:latest",
        labels=LABELS,
    )
    return vertex_pusher.PushTarget(**{**values, **changes})


@pytest.fixture
def registry(monkeypatch):
    return FakeModelRegistry().install(monkeypatch)


def _served(registry, endpoint_name):
    endpoint = registry.endpoints[endpoint_name]
    return {
        (d.model, d.model_version_id): endpoint.traffic_split.get(d.id, 0) for d in endpoint.deployed_models
    }


def test_each_blessed_model_is_a_version_served_alone_and_other_pipelines_stay(registry):
    first = vertex_pusher.push(_target(), "gs://b/push/1", "run-1")
    assert first.version_id == "1" and first.uploaded and registry.calls.count("create_endpoint") == 1
    endpoint = registry.endpoints[first.endpoint]
    assert endpoint.display_name == "serving" and dict(endpoint.labels) == LABELS
    (version,) = registry.models[first.model]
    assert version.artifact_uri == "gs://b/push/1" and version.labels["effnet-push"] == "run-1"
    assert version.container_spec.image_uri.endswith("tf2-cpu.2-16:latest")
    assert _served(registry, first.endpoint) == {(first.model, "1"): 100}

    foreign = registry.deploy_foreign(first.endpoint, aiplatform_v1.Model(display_name="someone-else"))
    second = vertex_pusher.push(_target(), "gs://b/push/2", "run-2")
    assert (second.model, second.version_id, second.endpoint) == (first.model, "2", first.endpoint)
    assert second.undeployed == (first.deployed_model_id,)
    served = _served(registry, first.endpoint)
    assert served[(first.model, "2")] == 100 and (first.model, "1") not in served
    assert [d.id for d in registry.endpoints[first.endpoint].deployed_models].count(foreign) == 1
    assert len(registry.models[first.model]) == 2  # the registry keeps every version


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


def test_the_endpoint_by_resource_name_and_an_ambiguous_display_name(registry):
    named = registry.add_endpoint(PARENT, "shared")
    pushed = vertex_pusher.push(_target(endpoint=named.name), "gs://b/push/1", "run-1")
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
    assert pushed.get_string_custom_property("pushed_destination").startswith(PARENT + "/endpoints/")
    (version,) = registry.models[name]
    assert version.artifact_uri == pushed.uri and version.labels["effnet-push"] == vertex_pusher.push_id(
        model.uri
    )
    with open(os.path.join(pushed.uri, "saved_model.pb"), "rb") as f:
        assert f.read() == b"a saved model"


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
