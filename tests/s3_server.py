"""A real S3 endpoint on loopback for the tests (moto's server mode), and a proxy that injects faults.

Clients talk to them over HTTP through s3fs, exactly as they talk to S3: nothing is mocked in-process.
"""

from __future__ import annotations

import http.client
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from moto.server import ThreadedMotoServer

CREDENTIALS = {"key": "AKIATESTSECRETKEYID00", "secret": "test-secret-access-key-do-not-log"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoS3:
    """moto's S3 on 127.0.0.1, started and stopped by the test session."""

    def __init__(self) -> None:
        self.port = free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()


class FaultyProxy:
    """Forwards HTTP to `upstream`, but answers every `every`-th request with a 503 or a reset connection.

    Bounded by construction: it only ever serves the requests its clients send, and stops with the test.
    """

    def __init__(self, upstream_port: int, every: int = 4) -> None:
        self.port = free_port()
        self.injected = 0
        count = {"n": 0}
        lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                with lock:
                    count["n"] += 1
                    n = count["n"]
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if n % every == 0:
                    proxy.injected += 1
                    if n % (2 * every) == 0:  # a connection reset mid-request
                        self.connection.shutdown(socket.SHUT_RDWR)
                        self.close_connection = True
                        return
                    self.send_response(503, "Slow Down")
                    payload = b"<Error><Code>SlowDown</Code><Message>injected</Message></Error>"
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                upstream = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=30)
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("connection", "transfer-encoding")
                }
                upstream.request(self.command, self.path, body=body or None, headers=headers)
                response = upstream.getresponse()
                data = response.read()
                self.send_response(response.status, response.reason)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                # A HEAD answer carries the object's length, not the (empty) body's.
                length = response.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                upstream.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
