"""A real GCS JSON-API server for tests: PyPI ``gcp-storage-emulator``, served on 127.0.0.1 from this process.

Beam's GCS client (google-cloud-storage) talks to it when ``STORAGE_EMULATOR_HOST`` names it, with anonymous
credentials; worker processes the multi-process DirectRunner starts inherit the variable. The emulator
implements the batch endpoint Beam's ``FileSystems.delete`` uses. Served in-process so that a test can read how
many bytes of each object were downloaded (the Content-Length of every media GET, which is what the client
fetched, buffers and read-ahead included), how many media GETs there were, and how many requests were in flight
at once. Each connection has a thread, but requests are handled one at a time (the emulator's storage is not
thread-safe); ``latency_s``, a wait before handling each request that overlaps between connections, stands in
for the round trip to a remote server.
"""

from __future__ import annotations

import collections
import functools
import http.server
import threading
import time
import urllib.parse

from gcp_storage_emulator import server as emulator_server
from gcp_storage_emulator.handlers import buckets
from gcp_storage_emulator.storage import Storage


class _CountingHandler(emulator_server.RequestHandler):
    """The emulator's request handler, also counting the bytes of each object it sends."""

    def __init__(self, emulator: GcsEmulator, *args, **kwargs):
        self._emulator = emulator
        super().__init__(emulator.storage, *args, **kwargs)

    def do_GET(self):
        self._emulator.serve(super().do_GET)

    def do_POST(self):
        self._emulator.serve(super().do_POST)

    def do_PUT(self):
        self._emulator.serve(super().do_PUT)

    def do_DELETE(self):
        self._emulator.serve(super().do_DELETE)

    def do_PATCH(self):
        self._emulator.serve(super().do_PATCH)

    def send_header(self, keyword, value):
        if keyword.lower() == "content-length" and self.command == "GET":
            url = urllib.parse.urlparse(self.path)
            if "alt=media" in url.query and "/o/" in url.path:
                bucket = url.path.split("/b/", 1)[1].split("/o/", 1)[0]
                name = urllib.parse.unquote(url.path.split("/o/", 1)[1])
                self._emulator.record_download(f"gs://{bucket}/{name}", int(value))
        super().send_header(keyword, value)


class GcsEmulator:
    """Starts on a free port of 127.0.0.1 (chosen by the kernel: no race with other tests) until ``stop``."""

    def __init__(self):
        self.storage = Storage(use_memory_fs=True)
        self.latency_s = 0.0
        self._lock = threading.Lock()
        self._handling = threading.Lock()
        self._downloaded: collections.Counter[str] = collections.Counter()
        self._gets = 0
        self._in_flight = self._max_in_flight = 0
        self._httpd = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(_CountingHandler, self)
        )
        self.host = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="gcs-emulator", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def create_bucket(self, name: str) -> str:
        buckets.create_bucket(name, self.storage)
        return f"gs://{name}"

    def serve(self, handle) -> None:
        """Runs one request's ``handle`` after ``latency_s``, counting the requests in flight."""
        with self._lock:
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
        try:
            time.sleep(self.latency_s)
            with self._handling:
                handle()
        finally:
            with self._lock:
                self._in_flight -= 1

    def record_download(self, path: str, num_bytes: int) -> None:
        with self._lock:
            self._downloaded[path] += num_bytes
            self._gets += 1

    def media_gets(self) -> int:
        """Object downloads (media GETs) since the last ``reset_counts``."""
        with self._lock:
            return self._gets

    def max_in_flight(self) -> int:
        """The most requests the server had at once since the last ``reset_counts``."""
        with self._lock:
            return self._max_in_flight

    def downloaded_bytes(self, prefix: str) -> int:
        """Bytes sent for objects whose gs:// path starts with ``prefix``, since the last ``reset_counts``."""
        with self._lock:
            return sum(n for path, n in self._downloaded.items() if path.startswith(prefix))

    def reset_counts(self) -> None:
        with self._lock:
            self._downloaded.clear()
            self._gets = 0
            self._max_in_flight = self._in_flight

    def list_objects(self, bucket: str, prefix: str = "") -> list[str]:
        """gs:// paths of the live objects of ``bucket`` under ``prefix``, read from the server's own state."""
        objects, _ = self.storage.get_file_list(bucket, prefix=prefix or None)
        return sorted(f"gs://{bucket}/{obj['name']}" for obj in objects)


def upload_archives(folder: str, archives) -> list[str]:
    """Copies an archive pair (``clean_archives``) into ``folder`` (a gs:// URL on the emulator) under the same
    names; returns the train and validation URLs."""
    import os

    from effnet_common import storage

    urls = []
    for local in (archives.train_archive, archives.val_archive):
        url = f"{folder}/{os.path.basename(local)}"
        with open(local, "rb") as f, storage.open_write(url) as out:
            out.write(f.read())
        urls.append(url)
    return urls
