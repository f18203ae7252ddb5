"""The push of a blessed model to Vertex AI: a version in the Model Registry, served alone on the endpoint.

TFX's Vertex Pusher uploads every blessed model as a new Model deployed at 100% traffic beside all the
earlier ones, which keep their machines (and their cost) until someone undeploys them. This push keeps one
registry model per pipeline (labelled ``effnet-pipeline=<pipeline>``), each blessed model a new *version* of
it labelled with the push id (a digest of the trained model's URI) and made its default version; deploys it
at 100% on the endpoint (by display name, created if missing, or resource name); then undeploys the
pipeline's other models there, leaving other pipelines' alone (docs/serving.md). A retried push finds its
version by the push id instead of uploading or deploying twice.

The serving image is checked when the pipeline is compiled (``check_serving_image``): only prebuilt images
the pinned SDK lists, from ``OLDEST_SERVING_TENSORFLOW`` on (docs/serving.md, 'The serving image'). Calls go
through ``aiplatform_v1``'s Model and Endpoint service clients with ``effnet_common.cloud_retry``; a create
whose answer was lost is looked for before it is sent again (tests: ``tests/fake_vertex_registry.py``).
Models are compared by the service's own names (project *number*), without their ``@version`` suffix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
from typing import Any

from google.cloud import aiplatform_v1
from tfx.components.pusher import executor as pusher_executor
from tfx.dsl.components.base import executor_spec
from tfx.types import artifact_utils, standard_component_specs
from tfx.utils import io_utils, json_utils

from components import evaluation_results, run_label
from components import tfx_api as tfx
from effnet_common import cloud_retry

logger = logging.getLogger(__name__)

CONFIG_KEY = "effnet_vertex_push"
PIPELINE_LABEL = "effnet-pipeline"  # the same label the pipeline's jobs carry (pipeline.cloud)
PUSH_LABEL = "effnet-push"
DEFAULT_ALIAS = "default"  # the version alias Vertex uses where a request names no version
# The oldest TensorFlow whose Serving the export is checked to load and answer with (docs/serving.md).
OLDEST_SERVING_TENSORFLOW = (2, 15)
# Vertex's prebuilt TensorFlow prediction images:
# REGISTRY-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest
_PREBUILT = re.compile(
    r"^(?P<registry>[a-z]+)-docker\.pkg\.dev/vertex-ai/prediction/"
    r"tf2-(?P<accelerator>cpu|gpu)\.2-(?P<minor>\d+)"
    r"(?::[\w.-]+|@sha256:[0-9a-f]+)?$"
)


def serving_image_tensorflow(image: str) -> tuple[int, int] | None:
    """The TensorFlow (major, minor) of an image named as Vertex's prebuilt prediction images are; None for
    any other image."""
    match = _PREBUILT.match(image)
    return (2, int(match.group("minor"))) if match else None


def prebuilt_tensorflow_images() -> dict[tuple[str, str, tuple[int, int]], str]:
    """The prebuilt TensorFlow prediction images of the pinned google-cloud-aiplatform, by (registry,
    accelerator, TensorFlow version): ('us', 'cpu', (2, 15)) ->
    'us-docker.pkg.dev/.../tf2-cpu.2-15:latest'."""
    from google.cloud.aiplatform.constants import prediction

    images = {}
    for uri in prediction.TF_CONTAINER_URIS:
        match = _PREBUILT.match(uri)
        if match:
            key = (match.group("registry"), match.group("accelerator"), (2, int(match.group("minor"))))
            images[key] = uri
    return images


def _suggested_image(images: dict, region: str, accelerator: str) -> str:
    """The listed image with the newest TensorFlow, of ``accelerator``, in the registry nearest ``region``."""
    registries = {registry for registry, _, _ in images}
    registry = region.split("-")[0] if region.split("-")[0] in registries else "us"
    newest = max(v for r, a, v in images if (r, a) == (registry, accelerator))
    return images[(registry, accelerator, newest)]


def check_serving_image(image: str, region: str) -> str | None:
    """Refuses a prebuilt Vertex TensorFlow image the pinned SDK does not list, or one older than
    ``OLDEST_SERVING_TENSORFLOW``; returns a warning for any other image (its TensorFlow cannot be told from
    its name), else None.

    Raises:
      ValueError: one line naming the image, why, and the listed image to use (in ``region``'s registry).
    """
    from importlib import metadata

    images = prebuilt_tensorflow_images()
    match = _PREBUILT.match(image)
    accelerator = match.group("accelerator") if match else "cpu"
    suggestion = _suggested_image(images, region, accelerator)
    oldest = ".".join(map(str, OLDEST_SERVING_TENSORFLOW))
    if match is None:
        return (
            f"--serving-image {image} is not a prebuilt Vertex TensorFlow image: make sure it serves a "
            f"SavedModel with TensorFlow Serving {oldest} or newer on Vertex's routes, as {suggestion} does"
        )
    serving = serving_image_tensorflow(image)
    if (match.group("registry"), accelerator, serving) not in images:
        sdk = metadata.version("google-cloud-aiplatform")
        raise ValueError(
            f"--serving-image {image}: google-cloud-aiplatform {sdk} lists no such prebuilt prediction "
            f"image: use {suggestion}, which serves this export"
        )
    if serving < OLDEST_SERVING_TENSORFLOW:
        raise ValueError(
            f"--serving-image {image} serves with TensorFlow {serving[0]}.{serving[1]}, older than {oldest}, "
            f"the oldest the export is checked to load with: use {suggestion}"
        )
    return None


@dataclasses.dataclass(frozen=True)
class PushTarget:
    """Where and how a blessed model is served.

    Attributes:
      project, region: the Vertex location of the registry and the endpoint.
      pipeline: the pipeline's name: the registry model's display name and ``effnet-pipeline`` label.
      endpoint: an endpoint's display name (found or created) or resource name (projects/.../endpoints/N).
      serving_image: the prediction container.
      machine_type, min_replicas, max_replicas: the deployed model's machines.
      labels: the pipeline's labels, put on the model, its versions and a created endpoint.
    """

    project: str
    region: str
    pipeline: str
    endpoint: str
    serving_image: str
    machine_type: str = "n1-standard-4"
    min_replicas: int = 1
    max_replicas: int = 1
    labels: dict = dataclasses.field(default_factory=dict)

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.region}"

    @property
    def client_options(self) -> dict:
        return {"api_endpoint": f"{self.region}-aiplatform.googleapis.com"}

    def to_config(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, values: dict) -> PushTarget:
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class Pushed:
    """What a push left: the version it deployed, where, and what it undeployed."""

    model: str  # projects/.../models/N
    version_id: str
    endpoint: str  # projects/.../endpoints/M
    deployed_model_id: str
    undeployed: tuple[str, ...] = ()
    uploaded: bool = True
    evaluation: str = ""  # projects/.../models/N/evaluations/E, the version's imported evaluation


def push_id(model_uri: str) -> str:
    """The label value naming one trained model's push (a retry of the same model finds its version)."""
    return hashlib.sha256(model_uri.encode()).hexdigest()[:20]


def _once(create, find, what: str):
    """``create()`` retried on transient errors; a create whose answer was lost may have made its resource, so
    before each retry ``find()`` looks for it (None: not made)."""
    sent = False

    def attempt():
        nonlocal sent
        if sent:
            found = find()
            if found is not None:
                logger.warning("%s: made by a call whose answer was lost", what)
                return found
        sent = True
        return create()

    return cloud_retry.retried(attempt, what)


def _quoted(value: str) -> str:
    return '"' + value.replace('"', '\\"') + '"'


def _unversioned(name: str) -> str:
    """A model's name without the '@VERSION' the service writes into versions and deployed models."""
    return name.split("@")[0]


def _pipeline_models(models, target: PushTarget) -> list[aiplatform_v1.Model]:
    request = aiplatform_v1.ListModelsRequest(
        parent=target.parent, filter=f"labels.{PIPELINE_LABEL}={_quoted(target.labels[PIPELINE_LABEL])}"
    )
    return list(
        models.list_models(
            request=request, **cloud_retry.call_policy(f"listing the models of {target.parent}")
        )
    )


def _version_of_push(models, model: aiplatform_v1.Model, push: str) -> aiplatform_v1.Model | None:
    request = aiplatform_v1.ListModelVersionsRequest(
        name=model.name, filter=f"labels.{PUSH_LABEL}={_quoted(push)}"
    )
    found = list(
        models.list_model_versions(
            request=request, **cloud_retry.call_policy(f"listing the versions of {model.name}")
        )
    )
    return found[0] if found else None


def _upload(models, target: PushTarget, artifact_uri: str, push: str, parent_model: str | None):
    model = aiplatform_v1.Model(
        display_name=target.pipeline,
        artifact_uri=artifact_uri,
        container_spec=aiplatform_v1.ModelContainerSpec(image_uri=target.serving_image),
        labels={**target.labels, PUSH_LABEL: push},
        version_aliases=[DEFAULT_ALIAS],  # the served version is the one used where none is named
        version_description=f"pushed by {target.pipeline} from {artifact_uri}",
    )
    request = aiplatform_v1.UploadModelRequest(
        parent=target.parent, model=model, parent_model=parent_model or ""
    )
    response = models.upload_model(request=request, timeout=cloud_retry.CALL_TIMEOUT_SECONDS).result()
    return response.model, response.model_version_id


def _endpoint(endpoints, target: PushTarget) -> aiplatform_v1.Endpoint:
    if target.endpoint.startswith("projects/"):
        return endpoints.get_endpoint(
            name=target.endpoint, **cloud_retry.call_policy(f"reading {target.endpoint}")
        )
    request = aiplatform_v1.ListEndpointsRequest(
        parent=target.parent, filter=f"display_name={_quoted(target.endpoint)}"
    )
    found = list(
        endpoints.list_endpoints(
            request=request, **cloud_retry.call_policy(f"listing the endpoints of {target.parent}")
        )
    )
    if len(found) > 1:
        raise ValueError(
            f"{len(found)} endpoints are named {target.endpoint} in {target.parent}: give the resource name "
            f"(--vertex-endpoint {found[0].name})"
        )
    if found:
        return found[0]
    created = aiplatform_v1.Endpoint(display_name=target.endpoint, labels=dict(target.labels))

    def find():
        again = list(
            endpoints.list_endpoints(
                request=request, **cloud_retry.call_policy(f"listing the endpoints of {target.parent}")
            )
        )
        return again[0] if again else None

    return _once(
        lambda: endpoints.create_endpoint(
            parent=target.parent, endpoint=created, timeout=cloud_retry.CALL_TIMEOUT_SECONDS
        ).result(),
        find,
        f"creating endpoint {target.endpoint} in {target.parent}",
    )


def _deployed(endpoint: aiplatform_v1.Endpoint, model: str, version_id: str):
    return next(
        (
            d
            for d in endpoint.deployed_models
            if _unversioned(d.model) == model and d.model_version_id == version_id
        ),
        None,
    )


# The classification metrics schema of Vertex's model evaluations (the one Google's pipeline components import
# classification results with): top-1 is the recall of the top-scoring label, top-5 the recall of five labels.
EVALUATION_SCHEMA = "gs://google-cloud-aiplatform/schema/modelevaluation/classification_metrics_1.0.0.yaml"


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """The Evaluator's result the pushed version carries in the Model Registry (an imported model evaluation).

    Attributes:
      metrics: the blessing's ``evaluation_results.BLESSING_METRICS`` (top1, top5, evaluated_examples).
      run: the pipeline run that produced it (its id), or "".
      blessing_uri: the Evaluator's blessing of the model, or "".
    """

    metrics: dict
    run: str = ""
    blessing_uri: str = ""

    def message(self, target: PushTarget, push: str) -> aiplatform_v1.ModelEvaluation:
        top1, top5 = self.metrics.get("top1"), self.metrics.get("top5")
        confidence = []
        if top1 is not None:
            confidence.append(
                {"confidenceThreshold": 0.0, "maxPredictions": 1, "recall": top1, "recallAt1": top1,
                 "precisionAt1": top1}
            )  # fmt: skip
        if top5 is not None:
            confidence.append({"confidenceThreshold": 0.0, "maxPredictions": 5, "recall": top5})
        metadata = {**self.metrics, "pipeline": target.pipeline, "push_id": push}
        metadata.update({key: value for key, value in
                         (("pipeline_job_id", self.run), ("blessing_uri", self.blessing_uri))
                         if value})  # fmt: skip
        return aiplatform_v1.ModelEvaluation(
            display_name=f"{target.pipeline} push {push}",
            metrics_schema_uri=EVALUATION_SCHEMA,
            metrics={"confidenceMetrics": confidence},
            metadata=metadata,
        )


def _import_evaluation(models, version: str, evaluation: aiplatform_v1.ModelEvaluation) -> str:
    """Imports ``evaluation`` as an evaluation of ``version`` (``MODEL@VERSION_ID``) once: a retried push, or
    an import whose answer was lost, finds the one it made by its display name. Returns its name."""

    def find():
        listed = models.list_model_evaluations(
            parent=version, **cloud_retry.call_policy(f"listing the evaluations of {version}")
        )
        return next((e.name for e in listed if e.display_name == evaluation.display_name), None)

    found = find()
    if found is not None:
        return found
    return _once(
        lambda: (
            models.import_model_evaluation(
                parent=version, model_evaluation=evaluation, timeout=cloud_retry.CALL_TIMEOUT_SECONDS
            ).name
        ),
        find,
        f"importing the evaluation of {version}",
    )


def push(target: PushTarget, artifact_uri: str, push: str, evaluation: Evaluation | None = None) -> Pushed:
    """Uploads ``artifact_uri`` (a SavedModel directory) as a version of the pipeline's registry model (once
    per ``push`` id) with ``evaluation`` as its model evaluation, deploys it on the endpoint at 100% and
    undeploys the pipeline's other models there."""
    models = aiplatform_v1.ModelServiceClient(client_options=target.client_options)
    endpoints = aiplatform_v1.EndpointServiceClient(client_options=target.client_options)
    pipeline_models = _pipeline_models(models, target)
    registry = [m for m in pipeline_models if m.display_name == target.pipeline]
    parent_model = registry[0] if registry else None
    existing = _version_of_push(models, parent_model, push) if parent_model else None
    if existing is not None:
        model_name, version_id, uploaded = _unversioned(existing.name), existing.version_id, False
        logger.info("version %s of %s holds this model already (a retried push)", version_id, model_name)
        if DEFAULT_ALIAS not in existing.version_aliases:
            models.merge_version_aliases(
                name=f"{model_name}@{version_id}",
                version_aliases=[DEFAULT_ALIAS],
                **cloud_retry.call_policy(f"making version {version_id} of {model_name} the default"),
            )
    else:

        def find_upload():  # an upload whose answer was lost: its version carries the push's label
            made = [m for m in _pipeline_models(models, target) if m.display_name == target.pipeline]
            version = _version_of_push(models, made[0], push) if made else None
            return (_unversioned(version.name), version.version_id) if version is not None else None

        model_name, version_id = _once(
            lambda: _upload(
                models, target, artifact_uri, push, _unversioned(parent_model.name) if parent_model else None
            ),
            find_upload,
            f"uploading {artifact_uri} to {target.parent}",
        )
        uploaded = True
        logger.info("uploaded %s as version %s of %s", artifact_uri, version_id, model_name)
    evaluation_name = ""
    if evaluation is not None:
        message = evaluation.message(target, push)
        evaluation_name = _import_evaluation(models, f"{model_name}@{version_id}", message)
        logger.info("version %s of %s carries evaluation %s", version_id, model_name, evaluation_name)

    endpoint = _endpoint(endpoints, target)
    current = _deployed(endpoint, model_name, version_id)
    if current is None:
        deployed = aiplatform_v1.DeployedModel(
            model=f"{model_name}@{version_id}",
            display_name=f"{target.pipeline}-v{version_id}",
            dedicated_resources=aiplatform_v1.DedicatedResources(
                machine_spec=aiplatform_v1.MachineSpec(machine_type=target.machine_type),
                min_replica_count=target.min_replicas,
                max_replica_count=target.max_replicas,
            ),
        )
        read = cloud_retry.call_policy(f"reading {endpoint.name}")

        def find_deployment():  # a deployment whose answer was lost is on the endpoint
            return _deployed(endpoints.get_endpoint(name=endpoint.name, **read), model_name, version_id)

        _once(
            lambda: endpoints.deploy_model(
                endpoint=endpoint.name,
                deployed_model=deployed,
                traffic_split={"0": 100},
                timeout=cloud_retry.CALL_TIMEOUT_SECONDS,
            ).result(),
            find_deployment,
            f"deploying version {version_id} of {model_name} on {endpoint.name}",
        )
        endpoint = endpoints.get_endpoint(name=endpoint.name, **read)
        current = _deployed(endpoint, model_name, version_id)
    elif endpoint.traffic_split.get(current.id, 0) != 100:
        endpoint = endpoints.update_endpoint(
            endpoint=aiplatform_v1.Endpoint(name=endpoint.name, traffic_split={current.id: 100}),
            update_mask={"paths": ["traffic_split"]},
            **cloud_retry.call_policy(f"moving the traffic of {endpoint.name}"),
        )

    ours = {_unversioned(m.name) for m in pipeline_models} | {model_name}  # the upload's model, if new
    replaced = [d for d in endpoint.deployed_models if _unversioned(d.model) in ours and d.id != current.id]
    for old in replaced:
        endpoints.undeploy_model(
            endpoint=endpoint.name,
            deployed_model_id=old.id,
            traffic_split={current.id: 100},
            **cloud_retry.call_policy(f"undeploying {old.id} from {endpoint.name}"),
        ).result()
        logger.info("undeployed %s (%s) from %s", old.id, old.model, endpoint.name)
    replaced_ids = tuple(d.id for d in replaced)
    return Pushed(model_name, version_id, endpoint.name, current.id, replaced_ids, uploaded, evaluation_name)


class VertexPusherExecutor(pusher_executor.Executor):
    """TFX's Pusher contract (the blessing check, the ``pushed_model`` artifact) with ``push`` as the push."""

    def Do(  # noqa: N802 - TFX's executor interface
        self,
        input_dict: dict[str, list],
        output_dict: dict[str, list],
        exec_properties: dict[str, Any],
    ):
        self._log_startup(input_dict, output_dict, exec_properties)
        custom_config = json_utils.loads(
            exec_properties.get(standard_component_specs.CUSTOM_CONFIG_KEY, "null")
        )
        if not isinstance(custom_config, dict) or CONFIG_KEY not in custom_config:
            raise ValueError(
                f"the Vertex push needs custom_config[{CONFIG_KEY!r}] (pipeline.kubeflow_v2_runner)"
            )
        target = PushTarget.from_config(custom_config[CONFIG_KEY])
        model_push = artifact_utils.get_single_instance(
            output_dict[standard_component_specs.PUSHED_MODEL_KEY]
        )
        if not self.CheckBlessing(input_dict):
            self._MarkNotPushed(model_push)
            return
        model = artifact_utils.get_single_instance(input_dict[standard_component_specs.MODEL_KEY])
        io_utils.copy_dir(src=self.GetModelPath(input_dict), dst=model_push.uri)
        blessing = artifact_utils.get_single_instance(input_dict[standard_component_specs.MODEL_BLESSING_KEY])
        run_id, _ = run_label.take_run_id(self._extra_flags or [], output_dict)
        evaluation = Evaluation(evaluation_results.evaluated(blessing), run_id or "", blessing.uri)
        pushed = push(target, model_push.uri, push_id(model.uri), evaluation)
        self._MarkPushed(model_push, pushed_destination=pushed.endpoint, pushed_version=pushed.version_id)
        model_push.set_string_custom_property("vertex_model", f"{pushed.model}@{pushed.version_id}")
        model_push.set_string_custom_property("vertex_deployed_model_id", pushed.deployed_model_id)
        model_push.set_string_custom_property("vertex_undeployed", ",".join(pushed.undeployed))
        model_push.set_string_custom_property("vertex_model_evaluation", pushed.evaluation)


class VertexPusher(tfx.components.Pusher):
    """The Pusher whose push is a version in the Vertex Model Registry, served alone on an endpoint."""

    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(VertexPusherExecutor)
