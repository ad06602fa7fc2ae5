"""The scrape and probe HTTP client against real servers: chunked and close-delimited bodies,
redirects, size limits, and answers that are not HTTP."""

from __future__ import annotations

import asyncio
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sloguard.collectors.http_client import HttpError, request


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Content-Type", "text/plain; charset=latin-1")
            self.end_headers()
            for part in (b"hello ", b"chunked ", b"world"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/loop":
            self._redirect(302, "/loop")
        elif self.path.startswith("/old"):
            self._redirect(301, "/new?x=1")
        elif self.path == "/new?x=1":
            self._body(200, b"moved here")
        elif self.path == "/big":
            self._body(200, b"x" * 5000)
        else:
            self._body(404, b"no")

    def _redirect(self, code: int, where: str) -> None:
        self.send_response(code)
        self.send_header("Location", where)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _body(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class OldHandler(Handler):
    protocol_version = "HTTP/1.0"  # no Content-Length: the body ends when the server closes

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"until close")


@pytest.fixture
def server():
    servers = []

    def start(handler):
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def get(url: str, **kw):
    return asyncio.run(request("GET", url, **kw))


def test_bodies_redirects_and_limits(server):
    url = server(Handler)
    chunked = get(f"{url}/chunked")
    assert chunked.status == 200 and chunked.body == b"hello chunked world"
    assert chunked.charset() == "latin-1"
    moved = get(f"{url}/old")
    assert (moved.status, moved.body, moved.url) == (200, b"moved here", f"{url}/new?x=1")
    assert get(f"{url}/old", follow_redirects=0).status == 301
    with pytest.raises(HttpError, match="more than 5 redirects"):
        get(f"{url}/loop")
    with pytest.raises(HttpError, match="5000 bytes exceeds the limit"):
        get(f"{url}/big", max_bytes=1000)
    assert get(f"{url}/missing").status == 404
    assert get(server(OldHandler)).body == b"until close"


def test_answers_that_are_not_http():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]

    def serve(replies):
        for reply in replies:
            conn, _ = listener.accept()
            conn.recv(65536)
            conn.sendall(reply)
            conn.close()

    thread = threading.Thread(target=serve, args=([b"SSH-2.0-OpenSSH_9.2\r\n", b""],),
                              daemon=True)
    thread.start()
    try:
        with pytest.raises(HttpError, match="malformed HTTP response"):
            get(f"http://127.0.0.1:{port}/")
        with pytest.raises(HttpError):  # closed without a word
            get(f"http://127.0.0.1:{port}/")
    finally:
        thread.join(timeout=5)
        listener.close()
