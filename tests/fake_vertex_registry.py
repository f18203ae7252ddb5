"""Vertex AI's Model Registry and endpoints in this process, faked at the two gapic clients.

``FakeModelRegistry().install(monkeypatch)`` replaces ``google.cloud.aiplatform_v1.ModelServiceClient`` and
``EndpointServiceClient`` with clients over one in-memory state. Requests must be the API's own messages (or
dicts the messages accept: an unknown field fails as in the service), and the service's rules that a push can
break are applied:

- a model version's resource name is ``projects/P/locations/R/models/N@V``; ``upload_model`` with
  ``parent_model`` adds version V+1 to model N, without it creates a new model N with version 1;
- list filters take ``KEY="VALUE"`` terms joined by ``AND`` (``labels.K``, ``display_name``);
- ``deploy_model`` needs an existing version and a traffic split that sums to 100 (``"0"`` is the model being
  deployed); the endpoint's deployed model records ``model`` (without the version) and ``model_version_id``;
- ``undeploy_model`` refuses a deployed model that still has traffic unless the request moves it elsewhere
  (``FailedPrecondition``), as Vertex does;
- long-running calls return an operation whose ``result()`` is the response.

``calls`` records every call by name, so a test can tell that a retried push uploaded nothing.
"""

from __future__ import annotations

import re

from google.api_core import exceptions
from google.cloud import aiplatform_v1

_TERM = re.compile(r'^\s*([\w.-]+)\s*=\s*"((?:[^"\\]|\\.)*)"\s*$')


class _Done:
    """A finished long-running operation."""

    def __init__(self, response):
        self._response = response

    def result(self, timeout=None):
        return self._response


def _matches(message, text: str) -> bool:
    for term in filter(None, (t.strip() for t in (text or "").split(" AND "))):
        match = _TERM.match(term)
        if not match:
            raise exceptions.InvalidArgument(f"unsupported filter term {term!r}")
        key, value = match.group(1), match.group(2).replace('\\"', '"')
        if key.startswith("labels."):
            if message.labels.get(key[len("labels.") :]) != value:
                return False
        elif getattr(message, key) != value:
            return False
    return True


class FakeModelRegistry:
    def __init__(self):
        self.models: dict[str, list[aiplatform_v1.Model]] = {}  # model name -> versions, oldest first
        self.endpoints: dict[str, aiplatform_v1.Endpoint] = {}
        self.calls: list[str] = []
        self._ids = 100

    def _next_id(self) -> str:
        self._ids += 1
        return str(self._ids)

    def add_endpoint(self, parent: str, display_name: str) -> aiplatform_v1.Endpoint:
        endpoint = aiplatform_v1.Endpoint(
            name=f"{parent}/endpoints/{self._next_id()}", display_name=display_name
        )
        self.endpoints[endpoint.name] = endpoint
        return endpoint

    def deploy_foreign(self, endpoint_name: str, model: aiplatform_v1.Model) -> str:
        """Puts a model of someone else on the endpoint (registered, deployed, with traffic)."""
        name = model.name or f"{endpoint_name.split('/endpoints/')[0]}/models/{self._next_id()}"
        stored = aiplatform_v1.Model(model, name=name, version_id="1")
        self.models[name] = [stored]
        return self._deploy(endpoint_name, name, "1", traffic=None)

    def _deploy(self, endpoint_name: str, model: str, version: str, traffic) -> str:
        endpoint = self.endpoints[endpoint_name]
        deployed_id = self._next_id()
        endpoint.deployed_models.append(
            aiplatform_v1.DeployedModel(id=deployed_id, model=model, model_version_id=version)
        )
        split = dict(endpoint.traffic_split)
        if traffic is None:  # an extra model without traffic, unless it is the only one
            split[deployed_id] = 0 if split else 100
        else:
            split = {(deployed_id if k == "0" else k): v for k, v in traffic.items()}
        self._set_traffic(endpoint, split)
        return deployed_id

    @staticmethod
    def _set_traffic(endpoint, split: dict) -> None:
        deployed = {d.id for d in endpoint.deployed_models}
        unknown = set(split) - deployed
        if unknown:
            raise exceptions.InvalidArgument(f"traffic split names unknown deployed models {sorted(unknown)}")
        if split and sum(split.values()) != 100:
            raise exceptions.InvalidArgument(f"traffic split {split} does not sum to 100")
        endpoint.traffic_split.clear()
        endpoint.traffic_split.update({k: v for k, v in split.items() if v})

    def install(self, monkeypatch) -> FakeModelRegistry:
        registry = self

        class ModelServiceClient:
            def __init__(self, client_options=None, **kwargs):
                assert client_options["api_endpoint"].endswith("-aiplatform.googleapis.com")

            def list_models(self, request=None, **kwargs):
                request = aiplatform_v1.ListModelsRequest(request)
                registry.calls.append("list_models")
                return [
                    aiplatform_v1.Model(versions[-1])
                    for name, versions in registry.models.items()
                    if name.startswith(request.parent + "/") and _matches(versions[0], request.filter)
                ]

            def list_model_versions(self, request=None, **kwargs):
                request = aiplatform_v1.ListModelVersionsRequest(request)
                registry.calls.append("list_model_versions")
                if request.name not in registry.models:
                    raise exceptions.NotFound(request.name)
                return [
                    aiplatform_v1.Model(v, name=f"{request.name}@{v.version_id}")
                    for v in registry.models[request.name]
                    if _matches(v, request.filter)
                ]

            def upload_model(self, request=None, **kwargs):
                request = aiplatform_v1.UploadModelRequest(request)
                registry.calls.append("upload_model")
                if not request.model.artifact_uri or not request.model.container_spec.image_uri:
                    raise exceptions.InvalidArgument(
                        "a model needs artifact_uri and container_spec.image_uri"
                    )
                if request.parent_model:
                    if request.parent_model not in registry.models:
                        raise exceptions.NotFound(request.parent_model)
                    name = request.parent_model
                else:
                    name = f"{request.parent}/models/{registry._next_id()}"
                    registry.models[name] = []
                version = str(len(registry.models[name]) + 1)
                registry.models[name].append(
                    aiplatform_v1.Model(request.model, name=name, version_id=version)
                )
                return _Done(aiplatform_v1.UploadModelResponse(model=name, model_version_id=version))

        class EndpointServiceClient:
            def __init__(self, client_options=None, **kwargs):
                assert client_options["api_endpoint"].endswith("-aiplatform.googleapis.com")

            def list_endpoints(self, request=None, **kwargs):
                request = aiplatform_v1.ListEndpointsRequest(request)
                registry.calls.append("list_endpoints")
                return [
                    aiplatform_v1.Endpoint(e)
                    for name, e in registry.endpoints.items()
                    if name.startswith(request.parent + "/") and _matches(e, request.filter)
                ]

            def get_endpoint(self, name=None, **kwargs):
                registry.calls.append("get_endpoint")
                if name not in registry.endpoints:
                    raise exceptions.NotFound(name)
                return aiplatform_v1.Endpoint(registry.endpoints[name])

            def create_endpoint(self, parent=None, endpoint=None, **kwargs):
                registry.calls.append("create_endpoint")
                created = aiplatform_v1.Endpoint(endpoint, name=f"{parent}/endpoints/{registry._next_id()}")
                registry.endpoints[created.name] = created
                return _Done(aiplatform_v1.Endpoint(created))

            def deploy_model(self, endpoint=None, deployed_model=None, traffic_split=None, **kwargs):
                deployed_model = aiplatform_v1.DeployedModel(deployed_model)
                registry.calls.append("deploy_model")
                model, _, version = deployed_model.model.partition("@")
                versions = registry.models.get(model, [])
                version = version or (versions[-1].version_id if versions else "")
                if version not in {v.version_id for v in versions}:
                    raise exceptions.NotFound(deployed_model.model)
                if not deployed_model.dedicated_resources.machine_spec.machine_type:
                    raise exceptions.InvalidArgument(
                        "dedicated_resources.machine_spec.machine_type is required"
                    )
                deployed_id = registry._deploy(endpoint, model, version, dict(traffic_split))
                return _Done(aiplatform_v1.DeployModelResponse(deployed_model={"id": deployed_id}))

            def undeploy_model(self, endpoint=None, deployed_model_id=None, traffic_split=None, **kwargs):
                registry.calls.append("undeploy_model")
                stored = registry.endpoints[endpoint]
                split = dict(traffic_split) if traffic_split else dict(stored.traffic_split)
                if split.get(deployed_model_id, 0):
                    raise exceptions.FailedPrecondition(
                        f"deployed model {deployed_model_id} has traffic: move it with traffic_split first"
                    )
                remaining = [d for d in stored.deployed_models if d.id != deployed_model_id]
                if len(remaining) == len(stored.deployed_models):
                    raise exceptions.NotFound(deployed_model_id)
                del stored.deployed_models[:]
                stored.deployed_models.extend(remaining)
                split.pop(deployed_model_id, None)
                registry._set_traffic(stored, split)
                return _Done(aiplatform_v1.UndeployModelResponse())

            def update_endpoint(self, endpoint=None, update_mask=None, **kwargs):
                registry.calls.append("update_endpoint")
                stored = registry.endpoints[endpoint.name]
                registry._set_traffic(stored, dict(endpoint.traffic_split))
                return aiplatform_v1.Endpoint(stored)

        monkeypatch.setattr(aiplatform_v1, "ModelServiceClient", ModelServiceClient)
        monkeypatch.setattr(aiplatform_v1, "EndpointServiceClient", EndpointServiceClient)
        return self
