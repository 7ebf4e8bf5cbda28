"""The probe server: ``/livez``, ``/readyz``, ``/startupz`` and ``/metrics`` from the node itself.

A small threaded HTTP server from the standard library on a daemon thread, so Kubernetes can ask
a pod whether it is alive and ready without starting Django for each probe. Each answer is read
from the node's memory (engine.health): a probe never queries the database.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

logger = logging.getLogger(__name__)

#: What /metrics serves: the body and its content type.
Exposition = Callable[[], tuple[bytes, str]]


class Answer(Protocol):
    @property
    def ok(self) -> bool: ...

    @property
    def checks(self) -> dict[str, bool]: ...


class Health(Protocol):
    """The verdicts a probe serves (engine.health.NodeHealth)."""

    def live(self) -> Answer: ...

    def ready(self) -> Answer: ...

    def started(self) -> Answer: ...


PROBES = {"/livez": "live", "/readyz": "ready", "/startupz": "started"}


class ProbeHandler(BaseHTTPRequestHandler):
    """Answer GET (and HEAD) for the probe paths; 200 when the check passes, 503 when not."""

    server: ProbeHTTPServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in PROBES:
            self._probe(getattr(self.server.health, PROBES[path])())
        elif path == "/metrics" and self.server.metrics is not None:
            self._metrics(self.server.metrics)
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8")

    def do_HEAD(self) -> None:
        self.do_GET()

    def _probe(self, answer: Answer) -> None:
        body = {"status": "ok" if answer.ok else "failing", "checks": answer.checks}
        status = HTTPStatus.OK if answer.ok else HTTPStatus.SERVICE_UNAVAILABLE
        self._send(status, json.dumps(body).encode() + b"\n", "application/json")

    def _metrics(self, metrics: Exposition) -> None:
        try:
            body, content_type = metrics()
        except Exception:  # a broken collector must not take the probes down
            logger.exception("rendering /metrics failed")
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, b"error\n", "text/plain; charset=utf-8")
            return
        self._send(HTTPStatus.OK, body, content_type)

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("probe %s", format % args)


class ProbeHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], health: Health, metrics: Exposition | None):
        super().__init__(address, ProbeHandler)
        self.health, self.metrics = health, metrics


class ProbeServer:
    """Serve ``health`` (and ``metrics``) on ``port``; :meth:`start` binds, :meth:`stop` closes.

    Port 0 lets the system pick one (tests); :attr:`port` is the one bound.
    """

    def __init__(
        self, health: Health, port: int, *, host: str = "", metrics: Exposition | None = None
    ) -> None:
        self.health, self.address, self.metrics = health, (host, port), metrics
        self._server: ProbeHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return self._server.server_address[1]

    def start(self) -> None:
        self._server = ProbeHTTPServer(self.address, self.health, self.metrics)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="cluster-jobs-probes", daemon=True
        )
        self._thread.start()
        logger.info("probes listening on port %s", self.port)

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None
