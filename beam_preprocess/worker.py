"""The worker process of a multi-process DirectRunner run: Beam's SDK harness, started lean and ended at once.

Beam starts ``python -m apache_beam.runners.worker.sdk_worker_main`` per worker; ``beam_preprocess.direct``
starts this module instead, which runs the same harness with two differences measured on 2 cores:

- it refuses the connectors sharding never uses before Beam is imported (``beam_preprocess.lean_imports``):
  about 2 s less per worker start;
- once the harness has finished (the runner closed its control channel, every bundle is done and logged), it
  leaves with ``os._exit`` instead of the interpreter's shutdown, which waited about 1 s per worker for
  Beam's and gRPC's threads, and the runner stops its workers one after the other.
"""

from __future__ import annotations

import logging
import os
import sys


def main(argv: list[str]) -> int:
    from beam_preprocess import lean_imports

    lean_imports.install()
    from apache_beam.runners.worker import sdk_worker_main

    try:
        sdk_worker_main.main(argv)
    except Exception:  # noqa: BLE001 - the harness has logged it to the runner; the exit status reports it
        return 1
    return 0


if __name__ == "__main__":
    status = main(sys.argv)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
