"""What stands in for a slice's TPU chips when a pod run is rehearsed (``pipeline.tpu_rehearsal``): worker 0's
trainer, in the trainer image, resolves the slice as on a real one, then trains on this machine's CPU split
into the slice's replicas (logical devices) under the mirrored strategy.

A rehearsed worker 0 runs ``python -m pipeline.tpu_stand_in --replicas N -- COMMAND``, COMMAND being TFX's
executor entry point on the Trainer's exec properties, whose trainer config asks for the 'tpu' strategy. First
the strategy's resolver (``trainer_module.distribute.strategies.tpu_cluster``) is built from ``TPU_NAME`` and
asked for the cluster, through the rehearsed metadata server and Cloud TPU API: the point past which a TPU
must answer. Then the config's strategy becomes 'mirrored' over N logical CPUs, all on this one process
(``data.replicas_per_host`` = N). With N the slice's replicas, the run's replicas, global batch, per-replica
batch and batch-norm groups are the slice's; a rehearsal may stand in with fewer (``data.num_cores`` = N, the
same global batch; one replica trains on the CPU device itself), since tracing a step for every replica costs
minutes on a small machine. The command then runs in this interpreter.
"""

from __future__ import annotations

import json
import os
import runpy
import sys

TRAINER_CONFIG_KEY = "trainer_config"  # the key of trainer_module.tfx_trainer's custom_config
EXECUTOR_MODULE = "tfx.scripts.run_executor"


def stand_in_properties(exec_properties: str, replicas: int) -> tuple[str, bool]:
    """The Trainer's exec properties (JSON) with the 'tpu' strategy replaced by the mirrored one on
    ``replicas`` local devices, and whether anything was replaced."""
    properties = json.loads(exec_properties)
    custom_config = json.loads(properties.get("custom_config") or "{}")
    if TRAINER_CONFIG_KEY not in custom_config:
        return exec_properties, False
    config = json.loads(custom_config[TRAINER_CONFIG_KEY])
    if config["loop"]["strategy"] != "tpu":
        return exec_properties, False
    config["loop"]["strategy"] = "mirrored" if replicas > 1 else "one_device"
    config["data"]["num_cores"] = replicas
    config["data"]["replicas_per_host"] = replicas
    custom_config[TRAINER_CONFIG_KEY] = json.dumps(config, indent=2, sort_keys=True)
    properties["custom_config"] = json.dumps(custom_config)
    return json.dumps(properties), True


def resolve_slice(exec_properties: str) -> str:
    """Builds the 'tpu' strategy's resolver of the Trainer's config and asks it for the slice's TPU workers;
    returns a line saying what it found.

    Raises:
      ValueError: the resolver found no TPU worker.
    """
    from trainer_module.config import TrainerConfig
    from trainer_module.distribute import strategies

    custom_config = json.loads(json.loads(exec_properties).get("custom_config") or "{}")
    config = TrainerConfig.from_json(custom_config[TRAINER_CONFIG_KEY])
    resolver = strategies.tpu_cluster(config)
    workers = resolver.cluster_spec().as_dict().get("worker", [])
    if not workers:
        raise ValueError(f"TPUClusterResolver({strategies.tpu_to_resolve(config)!r}) found no TPU worker")
    return (
        f"rehearsal: TPUClusterResolver('{strategies.tpu_to_resolve(config)}') found the slice's "
        f"{len(workers)} TPU workers through the Cloud TPU API: {', '.join(workers)}"
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["--replicas"] or "--" not in argv:
        print(
            "usage: python -m pipeline.tpu_stand_in --replicas N -- python -m MODULE ARGS...", file=sys.stderr
        )
        return 2
    replicas = int(argv[1])
    command = argv[argv.index("--") + 1 :]
    if command[1:3] != ["-m", EXECUTOR_MODULE]:
        print(
            f"error: a rehearsed worker runs {EXECUTOR_MODULE}, not {' '.join(command[:3])}", file=sys.stderr
        )
        return 2
    args = command[3:]
    position = args.index("--exec-properties") + 1
    properties = args[position]
    args[position], replaced = stand_in_properties(properties, replicas)
    if replaced:
        print(resolve_slice(properties), file=sys.stderr, flush=True)
        print(
            f"rehearsal: {replicas} logical CPU device(s) stand in for the replicas of TPU slice "
            f"{os.environ.get('TPU_NAME', '')}",
            file=sys.stderr,
            flush=True,
        )
        if replicas > 1:
            from trainer_module.run import use_logical_cpus

            use_logical_cpus(replicas)
    sys.argv = [EXECUTOR_MODULE, *args]
    runpy.run_module(EXECUTOR_MODULE, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    from effnet_common import quick_exit

    quick_exit.exit_with(main())
