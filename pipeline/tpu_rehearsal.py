"""The local runner's rehearsal of a pod run (``--rehearse-slice``): the Trainer trains through the TPU VM
backend (``components.tpu_vm_trainer``) against a Cloud TPU API on 127.0.0.1 whose slices are processes of
this machine (``pipeline.rehearsal_tpu_api``), worker 0 in the trainer image with this machine's Docker.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess

from pipeline.rehearsal_tpu_api import RehearsalTpuApi, Scenario

__all__ = ["Rehearsal", "Scenario", "missing_image"]


def missing_image(image: str) -> str:
    """Why this machine's Docker cannot run ``image`` (no docker, no daemon, no such image), or ''."""
    if not shutil.which("docker"):
        return "worker 0 of a rehearsed slice runs the trainer image with Docker, which is not installed here"
    found = subprocess.run(["docker", "image", "inspect", image], capture_output=True, text=True, check=False)
    if found.returncode == 0:
        return ""
    if "daemon" in found.stderr.lower():
        return (
            "worker 0 of a rehearsed slice runs the trainer image with Docker, whose daemon does not answer"
        )
    return "Docker here has no such image: build it with scripts/images.sh build trainer-tpu"


@dataclasses.dataclass
class Rehearsal:
    """The local runner's rehearsal of a pod run: the service, and the Trainer step that trains through it."""

    accelerator: str
    api: RehearsalTpuApi
    image: str

    @classmethod
    def start(cls, accelerator: str, root: str, scenario: Scenario, image: str) -> Rehearsal:
        """Starts the service for a run under pipeline root ``root``, whose worker 0 runs ``image``; the
        Trainer step finds it through the environment (``components.tpu_vm.ENDPOINT_VARIABLE``), so that its
        compiled settings, and with them its cache key, do not change with the service's port."""
        from components import tpu_vm

        api = RehearsalTpuApi(os.path.join(root, "tpu_rehearsal", "hosts"), scenario, shared=(root,))
        os.environ[tpu_vm.ENDPOINT_VARIABLE] = api.endpoint
        return cls(accelerator, api, image)

    @property
    def endpoint(self) -> str:
        return self.api.endpoint

    def describe(self) -> str:
        from components import tpu_slices

        return tpu_slices.SLICES[self.accelerator].describe()

    def trainer_step(self, pipeline_name: str, checkpoints: str):
        """The Trainer on the rehearsed slice (``components.tpu_vm_trainer.TpuVmTrainer``), its checkpoints
        kept where the local runner keeps them."""
        from components import tpu_slices, tpu_vm, tpu_vm_trainer
        from pipeline import pipeline_def
        from trainer_module import tfx_trainer

        settings = tpu_vm.SliceSettings(
            project="effnet-rehearsal",
            zone=tpu_slices.SLICES[self.accelerator].generation.zones[0],
            accelerator=self.accelerator,
            image=self.image,
            tier="spot",
            max_wait_seconds=600,
            labels={"effnet-pipeline": pipeline_name},
            poll_seconds=1.0,  # the rehearsed service answers at once
        )
        config = {tpu_vm.CONFIG_KEY: settings.to_config(), tfx_trainer.CHECKPOINT_ROOT_KEY: checkpoints}
        return pipeline_def.TrainerStep(tpu_vm_trainer.TpuVmTrainer, config)

    def summary(self) -> str:
        created = [r["query"]["queuedResourceId"][0] for r in self.api.calls("POST", "/queuedResources")]
        left = self.api.slices()
        return (
            f"rehearsed {self.accelerator}: {len(created)} slice{'s' if len(created) != 1 else ''} created"
            f"{' (' + ', '.join(created) + ')' if created else ''}, {self.api.preemptions} preempted, "
            f"{len(left)} left{': ' + ', '.join(left) if left else ''}"
        )

    def close(self) -> None:
        from components import tpu_vm

        self.api.close()
        os.environ.pop(tpu_vm.ENDPOINT_VARIABLE, None)
