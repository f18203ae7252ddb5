"""The machine-readable run log (JSON lines) and the human progress lines printed beside it."""

from __future__ import annotations

import json
import logging
import time

logger = logging.getLogger("trainer_module")


class RunLog:
    """Appends one JSON object per event to ``path`` (None: print only, as on non-chief workers).

    Every record has ``event`` and ``time`` (Unix seconds); plots and reports read the file back with
    ``read_run_log``.
    """

    def __init__(self, path: str | None):
        self._path = path

    def event(self, name: str, **fields) -> None:
        record = {"event": name, "time": time.time(), **fields}
        if self._path:
            with open(self._path, "a") as f:
                f.write(json.dumps(record) + "\n")
        if name == "eval":
            logger.info(
                "eval  step %d  epoch %.2f  top1 %.4f  top5 %.4f  loss %.4f  (%d examples)",
                fields["step"],
                fields["epoch"],
                fields["top1"],
                fields["top5"],
                fields["loss"],
                fields["examples"],
            )
        elif name != "progress":
            logger.info("%s %s", name, json.dumps(fields, default=str))

    def progress(self, **fields) -> None:
        self.event("progress", **fields)
        logger.info(
            "train step %d/%d  epoch %.2f  loss %.4f  lr %.4g  %.1f img/s  ETA %s",
            fields["step"],
            fields["total_steps"],
            fields["epoch"],
            fields["loss"],
            fields["learning_rate"],
            fields["images_per_second"],
            fields["eta"],
        )


def read_run_log(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
