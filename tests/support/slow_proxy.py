"""A TCP proxy that holds every chunk the client sends for `delay` seconds before passing it
on: in front of the real apiserver, every API call (TLS and all) takes that much longer."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class SlowProxy:
    def __init__(self, upstream: tuple[str, int], delay: float) -> None:
        self.upstream = upstream
        self.delay = delay
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, self.delay),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, 0.0),
                             daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, delay: float) -> None:
        with contextlib.suppress(OSError):
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if delay:
                    time.sleep(delay)
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._stop.set()
        self._server.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
