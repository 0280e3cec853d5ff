"""A node's host-memory checkpoint store: an HTTP server holding objects in its own memory.

It runs as its own process on every node (the agent starts it), so checkpoints in it outlive a
restart of the workers and vanish with the node: which is why every object also goes to a peer.

    PUT    /o/PATH   (X-Offset: N)   write the body at offset N (N=0 truncates)
    GET    /o/PATH   (Range: bytes=a-b)
    HEAD   /o/PATH
    GET    /dirs?prefix=P            JSON list of folder names directly under P
    DELETE /dirs/NAME
"""

from __future__ import annotations

import argparse
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_RANGE = re.compile(r"bytes=(\d+)-(\d+)")


class MemoryStore:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self.objects: dict[str, bytearray] = {}
        self.lock = threading.Lock()

    def used(self) -> int:
        return sum(len(b) for b in self.objects.values())


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Small request/response pairs on a kept-alive connection: without this, Nagle's algorithm and
    # delayed ACKs add ~40 ms to every ranged read.
    disable_nagle_algorithm = True
    store: MemoryStore

    def log_message(self, fmt: str, *args: object) -> None:  # quiet: one line per request is noise
        pass

    def _reply(self, code: int, body: bytes = b"", ctype: str = "application/octet-stream") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _path(self) -> str | None:
        return self.path[3:] if self.path.startswith("/o/") and ".." not in self.path else None

    def do_PUT(self) -> None:
        path = self._path()
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        if path is None:
            self._reply(400, b"bad path")
            return
        offset = int(self.headers.get("X-Offset", "0"))
        st = self.store
        with st.lock:
            if st.used() + length > st.capacity:
                self._reply(507, b"memory store full")
                return
            buf = st.objects.setdefault(path, bytearray()) if offset else bytearray()
            if len(buf) != offset:
                self._reply(409, f"offset {offset} but object has {len(buf)} bytes".encode())
                return
            buf += body
            st.objects[path] = buf
        self._reply(200)

    def do_GET(self) -> None:
        if self.path == "/dirs" or self.path.startswith("/dirs?prefix="):
            prefix = self.path.partition("?prefix=")[2]
            with self.store.lock:
                rests = [k[len(prefix) :] for k in self.store.objects if k.startswith(prefix)]
            names = sorted({r.split("/", 1)[0] for r in rests if "/" in r})
            self._reply(200, json.dumps(names).encode(), "application/json")
            return
        path = self._path()
        m = _RANGE.fullmatch(self.headers.get("Range", ""))
        with self.store.lock:  # copy only the range asked for: a load makes many ranged reads
            buf = self.store.objects.get(path or "")
            if buf is None:
                data = None
            elif m is None:
                data = bytes(buf)
            elif int(m.group(2)) >= len(buf):
                data = b""
            else:
                data = bytes(memoryview(buf)[int(m.group(1)) : int(m.group(2)) + 1])
        if data is None:
            self._reply(404)
        elif m is not None and not data:
            self._reply(416)
        else:
            self._reply(206 if m else 200, data)

    do_HEAD = do_GET

    def do_DELETE(self) -> None:
        if not self.path.startswith("/dirs/"):
            self._reply(400)
            return
        prefix = self.path[len("/dirs/") :] + "/"
        with self.store.lock:
            for k in [k for k in self.store.objects if k.startswith(prefix)]:
                del self.store.objects[k]
        self._reply(200)


class Server(ThreadingHTTPServer):
    # After a node loss every restarted rank opens a connection per reading thread to the same
    # store at once. socketserver's default backlog of 5 drops the SYNs past it, and the kernel
    # resends them only after a second: that second was most of a hot-swap's checkpoint load.
    request_queue_size = 1024


def serve(host: str, port: int, capacity_bytes: int) -> Server:
    handler = type("BoundHandler", (Handler,), {"store": MemoryStore(capacity_bytes)})
    server = Server((host, port), handler)
    server.daemon_threads = True
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description="Stalwart host-memory checkpoint store")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--capacity-gib", type=float, default=16.0)
    args = parser.parse_args()
    server = serve(args.host, args.port, int(args.capacity_gib * (1 << 30)))
    print(f"memory store listening on {args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
