"""A TCP proxy in front of the test cluster that counts round trips, as the network sees them.

A round trip starts each time a client sends after the server last sent to it (or sends for the
first time): statements sent together in one pipeline are one round trip, a statement whose
answer the client waits for before sending the next is one each. Counted on the wire, outside
the engine, so the count does not depend on the engine reporting itself honestly. A large
pipeline the server starts answering before the client finished sending it counts more than
once: the count can only overstate. A Flush message sent alone is not counted (see
``_only_flushes``).
"""

from __future__ import annotations

import socket
import threading

from psycopg.conninfo import conninfo_to_dict, make_conninfo

FLUSH = b"H\x00\x00\x00\x04"  # the protocol's Flush message: "send me what you have"


def _only_flushes(data: bytes) -> bool:
    """The chunk is Flush messages alone. psycopg sends one when it wants the answers of a
    pipeline, and whether it goes out before or after the server answered depends on timing
    (under load: after, which counted an extra round trip now and then)."""
    return bool(data) and len(data) % len(FLUSH) == 0 and data == FLUSH * (len(data) // len(FLUSH))


class RoundTripProxy:
    def __init__(self, conninfo: str) -> None:
        params = conninfo_to_dict(conninfo)
        self._upstream = (str(params.get("host", "127.0.0.1")), int(params.get("port", 5432)))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self.conninfo = make_conninfo(conninfo, host="127.0.0.1", port=str(self.port))
        self._lock = threading.Lock()
        self._round_trips = 0
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="rt-proxy-accept").start()

    @property
    def round_trips(self) -> int:
        with self._lock:
            return self._round_trips

    def reset(self) -> None:
        with self._lock:
            self._round_trips = 0

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._upstream)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            last = ["s"]  # per connection: who sent last ("s": the server, or nobody yet)
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, "c", last), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, "s", last), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, side: str, last: list[str]) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    if side == "c" and _only_flushes(data):
                        pass  # a Flush has no answer of its own: the client does not wait on it
                    else:
                        if side == "c" and last[0] != "c":
                            self._round_trips += 1
                        last[0] = side
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                try:
                    s.close()
                except OSError:
                    pass
