"""A fake of the Compute Engine metadata server, on 127.0.0.1: the service account a cloud worker runs as.

Every Dataflow, Vertex AI and TPU VM worker finds its credentials here (google-auth's application-default
lookup pings the server, then asks it for the default service account's access tokens). A process without it
and without a credentials file finds nothing, and Beam then retries the lookup with backoff for about 35 s
before it connects anonymously; the suite's processes that reach the GCS emulator would each pay that. With
this server named by ``GCE_METADATA_HOST`` and ``GCE_METADATA_IP`` they start as a cloud worker does.

It keeps the server's documented rules (cloud.google.com/compute/docs/metadata/querying-metadata):
- a request without the header ``Metadata-Flavor: Google``, or with ``X-Forwarded-For``, is refused with 403;
- every answer carries ``Metadata-Flavor: Google`` (which is how a client tells the server from anything else
  listening at that address);
- ``/computeMetadata/v1/`` paths: a directory ending in ``/`` answers its contents as JSON with
  ``?recursive=true``; the default service account's ``token`` is a JSON access token with ``expires_in``;
  a path the server does not hold is 404 (``universe/universe-domain`` on servers that predate it);
- it can be unavailable for a moment (``fail_next``: 503s, which clients retry).
"""

from __future__ import annotations

import http.server
import json
import secrets
import threading
import urllib.parse

PROJECT = "effnet-test-project"
SERVICE_ACCOUNT = f"effnet-worker@{PROJECT}.iam.gserviceaccount.com"
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)


class GceMetadataServer:
    """Serves on a free port of 127.0.0.1 until ``stop``; ``host`` is what the environment variables name."""

    def __init__(self):
        self.tokens_issued = 0
        self.refused = 0
        self._unavailable = 0
        self._lock = threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.host = f"127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def environment(self) -> dict[str, str]:
        """The variables that point google-auth at this server (read when a process imports google-auth)."""
        return {"GCE_METADATA_HOST": self.host, "GCE_METADATA_IP": self.host}

    def fail_next(self, count: int) -> None:
        """The next ``count`` requests are answered 503, as while the server restarts."""
        with self._lock:
            self._unavailable = count

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, path: str, query: dict[str, list[str]]) -> tuple[int, str, str]:
        """(status, content type, body) for a GET of ``path`` under ``/computeMetadata/v1/``."""
        account = {"aliases": ["default"], "email": SERVICE_ACCOUNT, "scopes": list(SCOPES)}
        if path in ("instance/service-accounts/default/", f"instance/service-accounts/{SERVICE_ACCOUNT}/"):
            if query.get("recursive") == ["true"]:
                return 200, "application/json", json.dumps(account)
            return 200, "text/plain", "aliases\nemail\nidentity\nscopes\ntoken\n"
        if path in (
            "instance/service-accounts/default/email",
            f"instance/service-accounts/{SERVICE_ACCOUNT}/email",
        ):
            return 200, "text/plain", SERVICE_ACCOUNT
        if path in (
            "instance/service-accounts/default/token",
            f"instance/service-accounts/{SERVICE_ACCOUNT}/token",
        ):
            with self._lock:
                self.tokens_issued += 1
            token = {
                "access_token": f"ya29.fake-{secrets.token_hex(8)}",
                "expires_in": 3599,
                "token_type": "Bearer",
            }
            return 200, "application/json", json.dumps(token)
        if path == "project/project-id":
            return 200, "text/plain", PROJECT
        return 404, "text/html", "Not Found"

    def _handler(self):
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                url = urllib.parse.urlsplit(self.path)
                if self.headers.get("Metadata-Flavor") != "Google" or "X-Forwarded-For" in self.headers:
                    with server._lock:
                        server.refused += 1
                    self._send(403, "text/html", "Missing required header: Metadata-Flavor: Google")
                    return
                with server._lock:
                    unavailable = server._unavailable > 0
                    server._unavailable -= unavailable
                if unavailable:
                    self._send(503, "text/html", "Service Unavailable")
                elif url.path in ("", "/"):
                    self._send(200, "application/text", "computeMetadata/\n")
                elif url.path.startswith("/computeMetadata/v1/"):
                    path = url.path[len("/computeMetadata/v1/") :]
                    self._send(*server._answer(path, urllib.parse.parse_qs(url.query)))
                else:
                    self._send(404, "text/html", "Not Found")

            def _send(self, status: int, content_type: str, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        return Handler
