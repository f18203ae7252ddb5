"""Vertex AI's TensorboardService and MetadataService (where Vertex AI Experiments live) faked at their clients.

Like ``fake_vertex.FakePipelineService``, each fake is installed in this process (``install(monkeypatch)``): the
methods of ``aiplatform_v1``'s generated clients that the submission and the SDK call are replaced, every one a
GAPIC method (``faults.gapic_method``: the caller's ``retry=`` and ``timeout=`` apply, and each attempt meets the
next fault of ``faults`` for its name first). Requests and answers are the API's own messages. The rules are the
ones ``docs/run-page-research.md`` (2, 3) cites from the v1 protos; what no source says is named as the fake's
assumption where it is made.
"""

from __future__ import annotations

import re

import faults

TENSORBOARD_NAME = re.compile(
    r"^projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/tensorboards/[^/]+$"
)
# ``CreateContextRequest.context_id``: 4-128 characters of [a-z0-9-], unique in its store.
CONTEXT_ID = re.compile(r"^[a-z0-9-]{4,128}$")
MAX_DISPLAY_NAME = 128
MAX_PARENTS = 10  # ``AddContextChildren``: a context with more parents is INVALID_ARGUMENT


def _location(name: str) -> str:
    return name.split("/locations/", 1)[1].split("/", 1)[0] if "/locations/" in name else ""


def _check_endpoint(client, name: str) -> None:
    """A location's resources are served by its regional endpoint (``L-aiplatform.googleapis.com``): a request
    for another location's is INVALID_ARGUMENT (as ``fake_vertex.FakeProjectJobs`` has it; the service's wording
    is not confirmed)."""
    from google.api_core import exceptions

    endpoint = client.api_endpoint
    location = _location(name)
    if location and endpoint != f"{location}-aiplatform.googleapis.com":
        raise exceptions.InvalidArgument(f"{name} is not served by the endpoint {endpoint}")


class FakeTensorboardService:
    """Vertex AI's TensorboardService: ``get_tensorboard`` of the instances given.

    ``instances``: the resource names of the TensorBoard instances that exist (``projects/P/locations/L/
    tensorboards/T``; a project by its id, or by its number through ``numbers``: id -> number, as the service
    names resources by number). Rules:

    - the name's form (INVALID_ARGUMENT), and a location other than the client's regional endpoint's
      (INVALID_ARGUMENT: a client built for one region cannot reach another's);
    - ``denied``: the caller lacks ``aiplatform.tensorboards.get``: PERMISSION_DENIED, in Google IAM's usual words
      ("Permission '...' denied on resource '...' (or it may not exist).");
    - an instance that does not exist in that location (another region's is not this one's): NOT_FOUND.

    ``gets`` records each request (endpoint, name).
    """

    def __init__(self, instances=(), numbers: dict[str, str] | None = None, denied: bool = False):
        self.numbers = numbers or {}
        self.instances = {self._canonical(name) for name in instances}
        self.denied = denied
        self.gets: list[tuple[str, str]] = []
        self.faults: faults.FaultSchedule | None = None

    def _canonical(self, name: str) -> str:
        parts = name.split("/")
        if len(parts) > 1 and parts[0] == "projects":
            parts[1] = self.numbers.get(parts[1], parts[1])
        return "/".join(parts)

    def get(self, endpoint: str, name: str):
        from google.api_core import exceptions
        from google.cloud import aiplatform_v1

        self.gets.append((endpoint, name))
        if not TENSORBOARD_NAME.match(name or ""):
            raise exceptions.InvalidArgument(f"{name!r} is not a Tensorboard resource name")
        if self.denied:
            raise exceptions.PermissionDenied(
                f"Permission 'aiplatform.tensorboards.get' denied on resource "
                f"'//aiplatform.googleapis.com/{name}' (or it may not exist)."
            )
        canonical = self._canonical(name)
        if canonical not in self.instances:
            raise exceptions.NotFound(f"Tensorboard {name} not found")
        return aiplatform_v1.Tensorboard(name=canonical, display_name=canonical.rsplit("/", 1)[-1])

    def install(self, monkeypatch) -> FakeTensorboardService:
        from google.cloud.aiplatform_v1.services.tensorboard_service import TensorboardServiceClient

        fake = self

        def get_tensorboard(client, *args, **kwargs):
            def serve(request=None, *, name=None):
                name = name or getattr(request, "name", None) or (request or {}).get("name")
                _check_endpoint(client, name or "")
                return fake.get(client.api_endpoint, name)

            return faults.gapic_method(lambda: fake.faults, "get_tensorboard", serve)(*args, **kwargs)

        monkeypatch.setattr(TensorboardServiceClient, "get_tensorboard", get_tensorboard)
        return self


class _Operation:
    """A long-running operation that has completed (``create_metadata_store``'s answer)."""

    def __init__(self, result):
        self._result = result

    def result(self, timeout=None, **kwargs):
        return self._result

    def done(self, **kwargs) -> bool:
        return True


class FakeMetadataService:
    """Vertex ML Metadata's MetadataService: the metadata stores and contexts of a project, as the SDK's
    ``Experiment.get_or_create`` and the submission's ``AddContextChildren`` use them.

    Rules (``metadata_service.proto``, ``context.proto``):

    - stores: ``get_metadata_store`` NOT_FOUND until one is created; ``create_metadata_store`` (a long-running
      operation) ALREADY_EXISTS for a store that exists.
    - contexts: created in an existing store (NOT_FOUND otherwise) under a ``context_id`` of 4-128 characters of
      ``[a-z0-9-]`` (INVALID_ARGUMENT otherwise) unique in the store (ALREADY_EXISTS), a ``display_name`` of at most
      128 characters; ``get_context`` NOT_FOUND for a context that does not exist.
    - ``add_context_children``: the context and each child must exist (NOT_FOUND: the fake's assumption, the
      usual answer for a missing resource); a child already added is skipped; a cycle, or a child that would have
      more than ``MAX_PARENTS`` parents, is INVALID_ARGUMENT.

    ``racing``: names of contexts another client creates between this client's get and its create: such a
    ``get_context`` answers NOT_FOUND, and the rival's create is done at once, so the caller's create is refused
    ALREADY_EXISTS (the race ``Context.get_or_create`` does not handle).

    What a pipeline run makes (``start_run``, called by ``fake_vertex.FakePipelineService``): its
    ``system.PipelineRun`` context and, as the parameters of its ``system.Run`` execution, the pipeline's
    parameters as ``input:NAME`` (``run_parameters``, by run context). ``experiment_runs(name)`` is what an
    experiment holds: the pipeline runs among its children, with their parameters.
    """

    def __init__(self):
        self.stores: dict = {}  # by name
        self.contexts: dict = {}  # by name
        self.parents: dict[str, list[str]] = {}  # child context -> its parents, in order
        self.run_parameters: dict[str, dict] = {}  # pipeline run context -> {"input:NAME": value}
        self.racing: set[str] = set()
        self.calls: list[tuple[str, str]] = []  # (method, name) of every request
        self.faults: faults.FaultSchedule | None = None

    # ---- the test's side ---------------------------------------------------------------------------------

    def add_context(self, name: str, schema_title: str, metadata: dict | None = None):
        """A context that exists already (its store made if missing), e.g. one of another schema."""
        from google.cloud import aiplatform_v1

        store = name.split("/contexts/")[0]
        self.stores.setdefault(store, aiplatform_v1.MetadataStore(name=store))
        context = aiplatform_v1.Context(
            name=name,
            display_name=name.rsplit("/", 1)[-1],
            schema_title=schema_title,
            schema_version="0.0.1",
            metadata=metadata or {},
        )
        self.contexts[name] = context
        return context

    def start_run(self, context, parameters: dict):
        """A pipeline run's context, made by Vertex as the run starts (``fake_vertex.FakePipelineService``)."""
        from google.cloud import aiplatform_v1

        made = self.add_context(context.name, context.schema_title)
        made.display_name = context.display_name
        self.run_parameters[context.name] = dict(parameters)
        return aiplatform_v1.Context(made)

    def experiment_runs(self, experiment: str) -> dict[str, dict]:
        """The pipeline runs experiment ``experiment`` (its context's name) holds, with their parameters."""
        return {
            child: self.run_parameters.get(child, {})
            for child, parents in self.parents.items()
            if experiment in parents and self.contexts[child].schema_title == "system.PipelineRun"
        }

    # ---- the service ---------------------------------------------------------------------------------------

    def get_metadata_store(self, name):
        from google.api_core import exceptions
        from google.cloud import aiplatform_v1

        self.calls.append(("get_metadata_store", name))
        if name not in self.stores:
            raise exceptions.NotFound(f"MetadataStore {name} not found")
        return aiplatform_v1.MetadataStore(self.stores[name])

    def create_metadata_store(self, parent, metadata_store=None, metadata_store_id=None):
        from google.api_core import exceptions
        from google.cloud import aiplatform_v1

        name = f"{parent}/metadataStores/{metadata_store_id or 'default'}"
        self.calls.append(("create_metadata_store", name))
        if name in self.stores:
            raise exceptions.AlreadyExists(f"MetadataStore {name} already exists")
        store = aiplatform_v1.MetadataStore(metadata_store or {})
        store.name = name
        self.stores[name] = store
        return _Operation(aiplatform_v1.MetadataStore(store))

    def get_context(self, name):
        from google.api_core import exceptions
        from google.cloud import aiplatform_v1

        self.calls.append(("get_context", name))
        if name in self.racing:  # another client creates it right after this answer
            self.racing.discard(name)
            self.add_context(name, "system.Experiment", {"experiment_deleted": False})
            raise exceptions.NotFound(f"Context {name} not found")
        if name not in self.contexts:
            raise exceptions.NotFound(f"Context {name} not found")
        return aiplatform_v1.Context(self.contexts[name])

    def create_context(self, parent, context=None, context_id=None):
        from google.api_core import exceptions
        from google.cloud import aiplatform_v1

        message = aiplatform_v1.Context(context or {})  # the API's own message
        name = f"{parent}/contexts/{context_id}"
        self.calls.append(("create_context", name))
        if parent not in self.stores:
            raise exceptions.NotFound(f"MetadataStore {parent} not found")
        if not CONTEXT_ID.match(context_id or ""):
            raise exceptions.InvalidArgument(
                f"context_id {context_id!r} must be 4 to 128 characters of [a-z0-9-]"
            )
        if len(message.display_name) > MAX_DISPLAY_NAME:
            raise exceptions.InvalidArgument(f"display_name is longer than {MAX_DISPLAY_NAME} characters")
        if name in self.contexts:
            raise exceptions.AlreadyExists(f"Context {name} already exists")
        message.name = name
        self.contexts[name] = message
        return aiplatform_v1.Context(message)

    def add_context_children(self, context, child_contexts=()):
        from google.api_core import exceptions
        from google.cloud import aiplatform_v1

        self.calls.append(("add_context_children", context))
        for name in (context, *child_contexts):
            if name not in self.contexts:
                raise exceptions.NotFound(f"Context {name} not found")
        for child in child_contexts:
            if child == context or child in self._ancestors(context):
                raise exceptions.InvalidArgument(f"adding {child} as a child of {context} makes a cycle")
            parents = self.parents.setdefault(child, [])
            if context in parents:
                continue  # already a child: skipped
            if len(parents) >= MAX_PARENTS:
                raise exceptions.InvalidArgument(f"{child} would have more than {MAX_PARENTS} parents")
            parents.append(context)
        return aiplatform_v1.AddContextChildrenResponse()

    def _ancestors(self, name: str) -> set[str]:
        found, pending = set(), list(self.parents.get(name, []))
        while pending:
            parent = pending.pop()
            if parent not in found:
                found.add(parent)
                pending.extend(self.parents.get(parent, []))
        return found

    def install(self, monkeypatch) -> FakeMetadataService:
        from google.cloud.aiplatform_v1.services.metadata_service import MetadataServiceClient

        fake = self

        def method(call: str, serve, name_of):
            def patched(client, *args, **kwargs):
                def checked(*a, **k):
                    _check_endpoint(client, name_of(*a, **k))
                    return serve(*a, **k)

                return faults.gapic_method(lambda: fake.faults, call, checked)(*args, **kwargs)

            return patched

        methods = {
            "get_metadata_store": (fake.get_metadata_store, lambda name: name),
            "create_metadata_store": (fake.create_metadata_store, lambda parent, **k: parent),
            "get_context": (fake.get_context, lambda name: name),
            "create_context": (fake.create_context, lambda parent, **k: parent),
            "add_context_children": (fake.add_context_children, lambda context, **k: context),
        }
        for call, (serve, name_of) in methods.items():
            monkeypatch.setattr(MetadataServiceClient, call, method(call, serve, name_of))
        return self
