"""The baseline of ``benchmarks/direct_workers.py``: the lean worker process ``beam_preprocess`` started up to issue 38.

Beam's multi-process DirectRunner starts ``python -m apache_beam.runners.worker.sdk_worker_main`` per worker; the
package's ``beam_preprocess.direct`` (gone with issue 38: it drove Beam's portability internals) started this
script instead, which runs the same harness with three differences measured on 2 cores:

- it refuses the connectors sharding never uses before Beam is imported (``beam_preprocess.lean_imports``):
  about 2 s less per worker start;
- once the harness has finished (the runner closed its control channel, every bundle is done and logged), it
  leaves with ``os._exit`` instead of the interpreter's shutdown, which waited about 1 s per worker for
  Beam's and gRPC's threads, and the runner stops its workers one after the other;
- Ctrl-C (the terminal's SIGINT reaches every process of its group) or the end of the runner's process ends it
  at once and quietly: the runner's command stops itself and says so in one line (``effnet_common.stopping``),
  and a worker left without its runner would otherwise go on until its gRPC channel times out.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from effnet_common.stopping import STOPPED_EXIT

# How often a worker checks that the process that started it is still there.
PARENT_CHECK_SECONDS = 0.5


def end_with_the_runner() -> None:
    """SIGINT ends this worker at once, without a traceback; so does the end of the process that started it."""
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(STOPPED_EXIT))
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(STOPPED_EXIT)

    threading.Thread(target=watch, name="runner-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    from beam_preprocess import lean_imports

    end_with_the_runner()
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
