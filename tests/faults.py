"""Fault schedules for the fakes of cloud services: the transient faults a real service gives, on cue.

A ``FaultSchedule`` maps a call's name (``get_custom_job``, ``GET jobs/ID``...: each fake names its calls) to the
faults its next requests meet, one fault a request, in order; a request past the list is served. A fault is:

- an HTTP status (``"503"``, ``"429"``, ``"500"``, ``"403"``...): the service's error answer with that code;
- ``"drop"``: the connection is reset without an answer (a GAPIC client over gRPC sees ``UNAVAILABLE``, an HTTP
  client a reset connection);
- ``"slow:S"``: the answer comes after S seconds; a client whose timeout is shorter gives up first (a GAPIC
  call raises ``DEADLINE_EXCEEDED``, as gRPC does when the call's deadline passes), while the service still does
  what was asked: a create that timed out may have created its resource.

- ``"lost"``: the service does what was asked, and its answer is lost (the connection dropped on the way back):
  a create that "failed" this way made its resource.

A fault written with a trailing ``*`` (``"403*"``) is persistent: every request from there on meets it.

Schedules cross processes as JSON files (``save`` / ``load``): a task run as its container process loads the
test's schedule. Every fault injected is recorded (``injected``; with ``record_path``, also appended to that file
as JSON lines, so a test reads what a task's process met).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import struct
import threading
import time


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str  # "status", "drop", "lost" or "slow"
    status: int = 0
    seconds: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Fault:
        if text in ("drop", "lost"):
            return cls(text)
        if text.startswith("slow:"):
            return cls("slow", seconds=float(text.split(":", 1)[1]))
        return cls("status", status=int(text))

    def __str__(self) -> str:
        return {"drop": "drop", "lost": "lost", "slow": f"slow:{self.seconds:g}"}.get(
            self.kind, str(self.status)
        )


class FaultSchedule:
    """The faults each call meets (see the module's docstring)."""

    def __init__(self, plan: dict[str, list[str]] | None = None, record_path: str = ""):
        self.plan = {call: list(faults) for call, faults in (plan or {}).items()}
        self.record_path = record_path
        self.injected: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def save(self, path: str) -> str:
        with open(path, "w") as f:
            json.dump({"plan": self.plan, "record_path": self.record_path}, f)
        return path

    @classmethod
    def load(cls, path: str) -> FaultSchedule:
        with open(path) as f:
            saved = json.load(f)
        return cls(saved["plan"], saved.get("record_path", ""))

    def take(self, call: str) -> Fault | None:
        """The fault the next request of ``call`` meets, or None (served)."""
        with self._lock:
            faults = self.plan.get(call)
            if not faults:
                return None
            text = faults[0]
            if not text.endswith("*"):
                faults.pop(0)
            fault = Fault.parse(text.rstrip("*"))
            self.injected.append((call, str(fault)))
            if self.record_path:
                with open(self.record_path, "a") as f:
                    f.write(json.dumps({"call": call, "fault": str(fault), "pid": os.getpid()}) + "\n")
            return fault

    @staticmethod
    def recorded(path: str) -> list[dict]:
        """The faults recorded in ``path`` (by every process that shared the schedule)."""
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]


# ---- how a fault reaches a client ------------------------------------------------------------------------------


# The gRPC status a GAPIC client (over gRPC, its default transport) receives for each HTTP status of the API's
# documentation (google.rpc.Code's HTTP mapping).
GRPC_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
               409: "ALREADY_EXISTS", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 502: "UNAVAILABLE",
               503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}  # fmt: skip


def gapic_error(fault: Fault, call: str) -> Exception:
    """The exception a GAPIC client raises for ``fault``: the gRPC status of its HTTP one, or for a dropped
    connection gRPC's UNAVAILABLE."""
    import grpc
    from google.api_core import exceptions

    if fault.kind in ("drop", "lost"):
        return exceptions.ServiceUnavailable(f"{call}: Connection reset by peer (injected)")
    code = getattr(grpc.StatusCode, GRPC_STATUS[fault.status])
    return exceptions.from_grpc_status(code, f"{call}: injected fault {fault.status}")


def gapic_method(schedule_of, call: str, serve):
    """``serve`` (the fake service's handling of one request, keyword arguments as the client passes them) as a
    GAPIC client method: wrapped by ``google.api_core.gapic_v1.method.wrap_method``, as the generated clients wrap
    their transport's methods, so the caller's ``retry=`` and ``timeout=`` apply as they do to the real client.
    Each attempt meets the next fault of ``schedule_of()`` for ``call`` first."""
    from google.api_core import exceptions
    from google.api_core.gapic_v1 import method

    def transport(*args, timeout=None, metadata=(), **kwargs):
        schedule = schedule_of()
        fault = schedule.take(call) if schedule is not None else None
        if fault is not None and fault.kind == "slow":
            if timeout is not None and timeout < fault.seconds:
                time.sleep(timeout)
                serve(*args, **kwargs)  # the service does it; the caller has stopped waiting for the answer
                raise exceptions.DeadlineExceeded(f"{call}: Deadline Exceeded (injected slow answer)")
            time.sleep(fault.seconds)
        elif fault is not None and fault.kind == "lost":
            serve(*args, **kwargs)
            raise gapic_error(fault, call)
        elif fault is not None:
            raise gapic_error(fault, call)
        return serve(*args, **kwargs)

    return method.wrap_method(transport, default_retry=None, default_timeout=None)


def google_error_body(status: int, call: str) -> dict:
    """A Google API's JSON error body (what Dataflow's REST API answers)."""
    names = {403: "PERMISSION_DENIED", 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
             502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}  # fmt: skip
    return {
        "error": {
            "code": status,
            "message": f"{call}: injected fault {status}",
            "status": names.get(status, "UNKNOWN"),
        }
    }


def drop_connection(handler) -> None:
    """Resets an ``http.server`` request's connection without an answer (RST, not an orderly close)."""
    sock = handler.connection
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    handler.close_connection = True
    sock.close()


def serve_http_fault(handler, fault: Fault | None, call: str, reply) -> bool:
    """Applies ``fault`` to an ``http.server`` request: True when the request was answered (or dropped) by the
    fault, False when it is to be served (after a slow answer's wait). ``reply(status, body)`` answers. A
    ``lost`` answer is served by the handler, which then calls ``drop_connection`` instead of answering."""
    if fault is None or fault.kind == "lost":
        return False
    if fault.kind == "slow":
        time.sleep(fault.seconds)
        return False
    if fault.kind == "drop":
        drop_connection(handler)
        return True
    reply(fault.status, google_error_body(fault.status, call))
    return True
