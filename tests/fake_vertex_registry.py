"""Vertex AI's Model Registry and endpoints in this process, faked at the two gapic clients.

``FakeModelRegistry().install(monkeypatch)`` replaces ``google.cloud.aiplatform_v1.ModelServiceClient`` and
``EndpointServiceClient`` with clients over one in-memory state. Requests must be the API's own messages (or
dicts the messages accept: an unknown field fails as in the service). The service's rules it applies, with
where each comes from:

- **Project numbers** (Vertex's responses: the reference docs' sample responses name ``projects/PROJECT_NUMBER``
  where the request named the project ID, e.g. the context-cache list; every published ``predict`` answer
  too): a request may name the project by ID or by number (``projects`` maps one to the other); every name
  the fake returns carries the number. A project it does not know is ``PermissionDenied`` (the status code
  is not confirmed).
- **Versions** (``aiplatform_v1`` Model and UploadModelRequest docs): a model's versions are ``1, 2, ...``;
  ``upload_model`` with ``parent_model`` adds the next version, without it creates a model with version 1.
  ``UploadModelResponse.model`` is the model's name without a version.
- **The default version** (Model.version_aliases docs, the Model Registry's alias page): the first version
  carries the ``default`` alias; an upload whose ``version_aliases`` hold ``default`` moves it (an alias is
  on one version of a model at a time), otherwise it stays where it was; ``merge_version_aliases`` moves
  aliases (``-name`` removes one) and refuses to leave the model without ``default``. Aliases must match
  ``[a-z][a-zA-Z0-9-]{0,126}[a-z0-9]``.
- **``@version`` in requests** (GetModelRequest, DeployedModel.model docs): ``get_model`` and
  ``DeployedModel.model`` take a model with ``@VERSION_ID``, ``@ALIAS`` or nothing, which means the *default*
  version, not the newest. ``merge_version_aliases`` needs an explicit version. ``list_model_versions`` and
  ``parent_model`` take the model without a version here (what the service does with one is not confirmed).
- **What lists return**: ``list_model_versions`` names each version ``MODEL@VERSION_ID`` (ListModelVersions
  response docs); ``list_models`` returns one entry per model, its default version, named without a version,
  and filters on that version's labels and display name (one entry per model and the default version are
  the SDK's and console's reading; the name's form and the filter's version are not confirmed). ``get_model``
  returns the version asked for, named without a version (not confirmed).
- **Deployed models**: an endpoint's ``DeployedModel.model`` is returned as ``MODEL@VERSION_ID`` with
  ``model_version_id`` set (the proto says the name may carry a version; that the service always writes the
  resolved id is what the review of the service found, not confirmed from documentation).
- list filters take ``KEY="VALUE"`` terms joined by ``AND`` (``labels.K``, ``display_name``);
- ``deploy_model`` needs an existing version, a machine type and a traffic split that sums to 100 (``"0"`` is
  the model being deployed); ``undeploy_model`` refuses a deployed model that still has traffic unless the
  request moves it elsewhere (``FailedPrecondition``);
- long-running calls return an operation whose ``result()`` is the response.
- **Model evaluations** (ModelService ``ImportModelEvaluation`` and ``ListModelEvaluations``, v1): an import
  takes the model as ``parent`` (Google's own pipeline component passes ``MODEL@VERSION``, which attaches the
  evaluation to that version; without ``@`` the default version), has no id of its own (each call makes a new
  evaluation, named ``MODEL/evaluations/ID`` with its ``create_time``), and needs ``metrics_schema_uri`` and
  ``metrics`` (not confirmed as required; the service's own evaluations always carry both). A list of
  ``MODEL@VERSION`` returns that version's evaluations (what the service does with a versioned list is not
  confirmed; ``evaluations`` keeps them by version).

``calls`` records every call by name, so a test can tell that a retried push uploaded nothing. ``faults`` (a
``faults.FaultSchedule``) gives each call, by its name (``upload_model``...), the service's transient faults.
"""

from __future__ import annotations

import datetime
import functools
import re

import faults
from google.api_core import exceptions
from google.cloud import aiplatform_v1

_TERM = re.compile(r'^\s*([\w.-]+)\s*=\s*"((?:[^"\\]|\\.)*)"\s*$')
_ALIAS = re.compile(r"^[a-z][a-zA-Z0-9-]{0,126}[a-z0-9]$")
DEFAULT_ALIAS = "default"
PROJECTS = {"p": "123456789012"}  # project ID -> project number


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


def _with_faults(client_class, fake) -> None:
    """Makes each call of ``client_class`` a GAPIC method (``faults.gapic_method``): the caller's ``retry=`` and
    ``timeout=`` apply, and each attempt meets the next fault ``fake.faults`` schedules for the call's name."""
    for name, serve in list(vars(client_class).items()):
        if name.startswith("_") or not callable(serve):
            continue

        def call(self, *args, _name=name, _serve=serve, **kwargs):
            bound = functools.partial(_serve, self)
            return faults.gapic_method(lambda: fake.faults, _name, bound)(*args, **kwargs)

        setattr(client_class, name, call)


class FakeModelRegistry:
    def __init__(self, projects: dict[str, str] | None = None):
        self.faults: faults.FaultSchedule | None = None  # what each call meets (tests/faults.py)
        self.projects = dict(PROJECTS if projects is None else projects)
        self.models: dict[str, list[aiplatform_v1.Model]] = {}  # model name -> versions, oldest first
        self.endpoints: dict[str, aiplatform_v1.Endpoint] = {}
        self.evaluations: dict[str, list[aiplatform_v1.ModelEvaluation]] = {}  # MODEL@VERSION -> evaluations
        self.calls: list[str] = []
        self._ids = 100

    def _next_id(self) -> str:
        self._ids += 1
        return str(self._ids)

    # ---- names ---------------------------------------------------------------------------------------------

    def canonical(self, name: str) -> str:
        """``name`` with its project as the number, as the service returns it."""
        parts = name.split("/")
        if len(parts) < 2 or parts[0] != "projects":
            raise exceptions.InvalidArgument(f"not a resource name: {name!r}")
        project = parts[1]
        if project not in self.projects and project not in self.projects.values():
            raise exceptions.PermissionDenied(f"Permission denied on resource project {project}")
        parts[1] = self.projects.get(project, project)
        return "/".join(parts)

    def _model_name(self, name: str, versioned: str = "refused") -> tuple[str, str | None]:
        """The canonical model name and the version or alias after '@' (``versioned``: 'refused' or 'allowed')."""
        bare, at, version = self.canonical(name).partition("@")
        if at and versioned == "refused":
            raise exceptions.InvalidArgument(f"{name}: a model name without a version is expected here")
        if bare not in self.models:
            raise exceptions.NotFound(name)
        return bare, version if at else None

    def version(self, name: str) -> aiplatform_v1.Model:
        """The stored version ``name`` names: ``@ID``, ``@ALIAS``, or the default one without '@'."""
        bare, ref = self._model_name(name, versioned="allowed")
        ref = ref or DEFAULT_ALIAS
        for stored in self.models[bare]:
            if stored.version_id == ref or ref in stored.version_aliases:
                return stored
        raise exceptions.NotFound(name)

    def default_version(self, model: str) -> aiplatform_v1.Model:
        return self.version(model.split("@")[0])

    def _endpoint(self, name: str) -> aiplatform_v1.Endpoint:
        stored = self.endpoints.get(self.canonical(name))
        if stored is None:
            raise exceptions.NotFound(name)
        return stored

    # ---- helpers for tests ---------------------------------------------------------------------------------

    def add_endpoint(self, parent: str, display_name: str) -> aiplatform_v1.Endpoint:
        endpoint = aiplatform_v1.Endpoint(
            name=f"{self.canonical(parent)}/endpoints/{self._next_id()}", display_name=display_name
        )
        self.endpoints[endpoint.name] = endpoint
        return endpoint

    def deploy_foreign(self, endpoint_name: str, model: aiplatform_v1.Model) -> str:
        """Puts a model of someone else on the endpoint (registered, deployed, with traffic)."""
        parent = self.canonical(endpoint_name).split("/endpoints/")[0]
        name = f"{parent}/models/{self._next_id()}"
        self.models[name] = [
            aiplatform_v1.Model(model, name=name, version_id="1", version_aliases=[DEFAULT_ALIAS])
        ]
        return self._deploy(self.canonical(endpoint_name), name, "1", traffic=None)

    def _deploy(self, endpoint_name: str, model: str, version: str, traffic) -> str:
        endpoint = self.endpoints[endpoint_name]
        deployed_id = self._next_id()
        endpoint.deployed_models.append(
            aiplatform_v1.DeployedModel(id=deployed_id, model=f"{model}@{version}", model_version_id=version)
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

    def _merge_aliases(self, bare: str, target: aiplatform_v1.Model, changes) -> None:
        for change in changes:
            alias = change[1:] if change.startswith("-") else change
            if not _ALIAS.match(alias):
                raise exceptions.InvalidArgument(f"version alias {alias!r} must match {_ALIAS.pattern}")
            if change.startswith("-"):
                if alias == DEFAULT_ALIAS:
                    raise exceptions.FailedPrecondition("a model needs exactly one version aliased 'default'")
                if alias in target.version_aliases:
                    target.version_aliases.remove(alias)
                continue
            for other in self.models[bare]:
                if other is not target and alias in other.version_aliases:
                    other.version_aliases.remove(alias)
            if alias not in target.version_aliases:
                target.version_aliases.append(alias)

    # ---- the clients ---------------------------------------------------------------------------------------

    def install(self, monkeypatch) -> FakeModelRegistry:
        registry = self

        class ModelServiceClient:
            def __init__(self, client_options=None, **kwargs):
                assert client_options["api_endpoint"].endswith("-aiplatform.googleapis.com")

            def list_models(self, request=None, **kwargs):
                request = aiplatform_v1.ListModelsRequest(request)
                registry.calls.append("list_models")
                parent = registry.canonical(request.parent)
                defaults = [
                    registry.default_version(name)
                    for name in registry.models
                    if name.startswith(parent + "/")
                ]
                return [aiplatform_v1.Model(v) for v in defaults if _matches(v, request.filter)]

            def get_model(self, request=None, name=None, **kwargs):
                request = aiplatform_v1.GetModelRequest(request or {"name": name})
                registry.calls.append("get_model")
                return aiplatform_v1.Model(registry.version(request.name))

            def list_model_versions(self, request=None, **kwargs):
                request = aiplatform_v1.ListModelVersionsRequest(request)
                registry.calls.append("list_model_versions")
                bare, _ = registry._model_name(request.name)
                return [
                    aiplatform_v1.Model(v, name=f"{bare}@{v.version_id}")
                    for v in registry.models[bare]
                    if _matches(v, request.filter)
                ]

            def upload_model(self, request=None, **kwargs):
                request = aiplatform_v1.UploadModelRequest(request)
                registry.calls.append("upload_model")
                if not request.model.artifact_uri or not request.model.container_spec.image_uri:
                    raise exceptions.InvalidArgument(
                        "a model needs artifact_uri and container_spec.image_uri"
                    )
                parent = registry.canonical(request.parent)
                if request.parent_model:
                    name, _ = registry._model_name(request.parent_model)
                    if not name.startswith(parent + "/"):
                        raise exceptions.InvalidArgument(f"parent_model {name} is not in {parent}")
                else:
                    name = f"{parent}/models/{registry._next_id()}"
                    registry.models[name] = []
                version = str(len(registry.models[name]) + 1)
                stored = aiplatform_v1.Model(request.model, name=name, version_id=version, version_aliases=[])
                registry.models[name].append(stored)
                aliases = list(request.model.version_aliases)
                if version == "1" and DEFAULT_ALIAS not in aliases:
                    aliases.append(DEFAULT_ALIAS)
                registry._merge_aliases(name, stored, aliases)
                return _Done(aiplatform_v1.UploadModelResponse(model=name, model_version_id=version))

            def merge_version_aliases(self, request=None, name=None, version_aliases=None, **kwargs):
                request = aiplatform_v1.MergeVersionAliasesRequest(
                    request or {"name": name, "version_aliases": version_aliases}
                )
                registry.calls.append("merge_version_aliases")
                bare, version = registry._model_name(request.name, versioned="allowed")
                if version is None:
                    raise exceptions.InvalidArgument(f"{request.name}: name the version (MODEL@VERSION)")
                target = registry.version(request.name)
                registry._merge_aliases(bare, target, request.version_aliases)
                return aiplatform_v1.Model(target)

            def import_model_evaluation(self, request=None, parent=None, model_evaluation=None, **kwargs):
                request = aiplatform_v1.ImportModelEvaluationRequest(
                    request or {"parent": parent, "model_evaluation": model_evaluation}
                )
                registry.calls.append("import_model_evaluation")
                version = registry.version(request.parent)
                evaluation = request.model_evaluation
                if not evaluation.metrics_schema_uri or "metrics" not in evaluation:
                    raise exceptions.InvalidArgument(
                        "a model evaluation needs metrics_schema_uri and metrics"
                    )
                bare = version.name
                stored = aiplatform_v1.ModelEvaluation(
                    evaluation, name=f"{bare}/evaluations/{registry._next_id()}"
                )
                stored.create_time = datetime.datetime.now(datetime.timezone.utc)
                registry.evaluations.setdefault(f"{bare}@{version.version_id}", []).append(stored)
                return aiplatform_v1.ModelEvaluation(stored)

            def list_model_evaluations(self, request=None, parent=None, **kwargs):
                request = aiplatform_v1.ListModelEvaluationsRequest(request or {"parent": parent})
                registry.calls.append("list_model_evaluations")
                version = registry.version(request.parent)
                key = f"{version.name}@{version.version_id}"
                return [aiplatform_v1.ModelEvaluation(e) for e in registry.evaluations.get(key, [])]

        class EndpointServiceClient:
            def __init__(self, client_options=None, **kwargs):
                assert client_options["api_endpoint"].endswith("-aiplatform.googleapis.com")

            def list_endpoints(self, request=None, **kwargs):
                request = aiplatform_v1.ListEndpointsRequest(request)
                registry.calls.append("list_endpoints")
                parent = registry.canonical(request.parent)
                return [
                    aiplatform_v1.Endpoint(e)
                    for name, e in registry.endpoints.items()
                    if name.startswith(parent + "/") and _matches(e, request.filter)
                ]

            def get_endpoint(self, name=None, **kwargs):
                registry.calls.append("get_endpoint")
                return aiplatform_v1.Endpoint(registry._endpoint(name))

            def create_endpoint(self, parent=None, endpoint=None, **kwargs):
                registry.calls.append("create_endpoint")
                name = f"{registry.canonical(parent)}/endpoints/{registry._next_id()}"
                created = aiplatform_v1.Endpoint(endpoint, name=name)
                registry.endpoints[created.name] = created
                return _Done(aiplatform_v1.Endpoint(created))

            def deploy_model(self, endpoint=None, deployed_model=None, traffic_split=None, **kwargs):
                deployed_model = aiplatform_v1.DeployedModel(deployed_model)
                registry.calls.append("deploy_model")
                stored = registry._endpoint(endpoint)
                version = registry.version(deployed_model.model)
                if not deployed_model.dedicated_resources.machine_spec.machine_type:
                    raise exceptions.InvalidArgument(
                        "dedicated_resources.machine_spec.machine_type is required"
                    )
                deployed_id = registry._deploy(
                    stored.name, version.name, version.version_id, dict(traffic_split)
                )
                return _Done(aiplatform_v1.DeployModelResponse(deployed_model={"id": deployed_id}))

            def undeploy_model(self, endpoint=None, deployed_model_id=None, traffic_split=None, **kwargs):
                registry.calls.append("undeploy_model")
                stored = registry._endpoint(endpoint)
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
                stored = registry._endpoint(endpoint.name)
                registry._set_traffic(stored, dict(endpoint.traffic_split))
                return aiplatform_v1.Endpoint(stored)

        for client in (ModelServiceClient, EndpointServiceClient):
            _with_faults(client, self)
        monkeypatch.setattr(aiplatform_v1, "ModelServiceClient", ModelServiceClient)
        monkeypatch.setattr(aiplatform_v1, "EndpointServiceClient", EndpointServiceClient)
        return self
