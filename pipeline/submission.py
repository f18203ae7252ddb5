"""Submitting a compiled pipeline and following its run: what Vertex AI Pipelines and Kubeflow share.

``pipeline.vertex_submission`` and ``pipeline.kfp_submission`` each take a compiled ``template.Template`` as
it is, with the run's parameter values (checked beforehand by ``Template.check_values``), and return a
``Submitted``: where the run can be watched and how to read its state. ``Submitted.follow`` (``--wait``)
follows the run to its end through ``effnet_common.follower``, an outage of the API waited out for
``--api-outage-hours``; ``succeeded`` tells the CLI's exit status. Both write each task's caching into the
spec they submit (``caching_written``: the clients' own switches do not reach the exit task or the steps
inside ``tfx-dag``) and give the run an id of this submission's own (``submission_id``), by which a create
whose answer was lost is found.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import secrets
import tempfile
import time

from effnet_common import cloud_retry, follower

# Seconds between two polls of a run's state (a pipeline run takes hours).
POLL_SECONDS = 30.0

# Final states: Vertex's PipelineState names and Kubeflow's run states.
VERTEX_FINAL = ("PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED")
KFP_FINAL = ("SUCCEEDED", "SKIPPED", "FAILED", "CANCELED")
SUCCEEDED = ("PIPELINE_STATE_SUCCEEDED", "SUCCEEDED")


class Unfollowed(RuntimeError):
    """``--wait`` could not read the run's state (its API out, or refusing, for longer than it waits); the
    run goes on. The message is one line."""


class PipelineRun(follower.Resource):
    """A submitted run, as the follower reads it. It is not cancelled from here: a run outlives the command
    that submitted it (Ctrl-C of ``--wait`` stops following, not the run)."""

    ended_states = VERTEX_FINAL + KFP_FINAL

    def __init__(self, submitted: Submitted, poll_seconds: float):
        self.submitted, self.poll_seconds = submitted, poll_seconds
        self.what = f"the state of {submitted.description}"

    def read(self) -> str:
        return self.submitted.poll()

    def request_cancel(self) -> None:
        raise NotImplementedError(f"cancel {self.submitted.description} at {self.submitted.url}")

    def url(self) -> str:
        return self.submitted.url


@dataclasses.dataclass(frozen=True)
class Submitted:
    """A submitted run: what it is (``description``), where to watch it (``url``), how to poll it (``poll``,
    raising the client's own errors), how to say a client's error in one line (``describe``), and what else
    to tell about it (``notes``: one line each, e.g. its experiment's page)."""

    description: str
    url: str
    poll: object  # () -> state name
    describe: object = cloud_retry.one_line  # (error) -> one line
    notes: tuple[str, ...] = ()

    def follow(
        self, interval: float | None = None, on_change=None, patience: cloud_retry.Patience | None = None
    ) -> str:
        """Follows the run until a final state and returns it; ``on_change(state)`` is called as it changes. A
        read that fails is waited out as ``patience`` says (``cloud_retry.Patience.read``).

        Raises:
          Unfollowed: the state could not be read for that long, or the service refused to say it.
        """
        run = PipelineRun(self, POLL_SECONDS if interval is None else interval)
        seen: list[str] = []

        def changed(state: str) -> None:
            if on_change is not None and state not in seen[-1:]:
                on_change(state)
            seen[:] = [state]

        try:
            return follower.follow(run, patience or cloud_retry.Patience(), on_state=changed)
        except cloud_retry.Unanswered as error:
            raise Unfollowed(f"{error}; the run goes on: {self.url}") from None
        except Exception as error:
            raise Unfollowed(f"{self.describe(error)}; the run goes on: {self.url}") from None


def succeeded(state: str) -> bool:
    return state in SUCCEEDED


@contextlib.contextmanager
def caching_written(template, enable_cache: bool):
    """A local copy of the template with each task's caching written (``spec_patches.set_caching``), removed
    afterwards: the clients read the file when the run is built."""
    import copy

    import yaml

    from pipeline import spec_patches

    document = copy.deepcopy(template.document)
    spec_patches.set_caching(document.get("pipelineSpec", document), enable_cache)
    with tempfile.TemporaryDirectory(prefix="effnet-submission-") as directory:
        path = os.path.join(
            directory, f"{template.name or 'pipeline'}.{'json' if template.is_job else 'yaml'}"
        )
        with open(path, "w") as f:
            f.write(json.dumps(document) if template.is_job else yaml.safe_dump(document, sort_keys=True))
        yield path


def submission_id(name: str) -> str:
    """An id of this submission: the pipeline's name, when, and a random part (Vertex:
    ``[a-z][-a-z0-9]*``)."""
    stem = re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-")[:90] or "run"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"
