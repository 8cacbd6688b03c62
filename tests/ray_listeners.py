"""Run inside a network namespace of its own (tests/test_ray_addresses.py): a listener of one
kind on a loopback port, then a build given it as ``--ray-address``; prints one JSON line: the
build's exit code, its seconds from the listener's first connection (with ``--interrupt``, from
the SIGINT the build then gets), its seconds in all, and its stderr.

    python -m tests.ray_listeners KIND MODEL CACHE_DIR [--interrupt]

KIND: ``http`` (Python's http.server; Ray's dashboard is an HTTP server too), ``silent`` (takes
the connection and says nothing), ``grpc`` (a gRPC server without Ray's services), ``client``
(one answering Ray Client's ping only). A build not ended after ``LIMIT_S`` is killed (exit -9):
on 1e2aec7 each of these hung in ``ray.init`` for many minutes."""
from __future__ import annotations

import concurrent.futures
import http.server
import json
import signal
import socket
import subprocess
import sys
import threading
import time

LIMIT_S = 40
SERVING = []  # a gRPC server stops once no reference to it is left


class FirstConnection:
    """When the listener first saw the build."""

    def __init__(self):
        self.event, self.at = threading.Event(), None

    def seen(self) -> None:
        if not self.event.is_set():
            self.at = time.monotonic()
            self.event.set()


def http_server(first: FirstConnection) -> int:
    class Handler(http.server.BaseHTTPRequestHandler):
        def setup(self):
            first.seen()
            super().setup()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


def silent_server(first: FirstConnection) -> int:
    listener = socket.create_server(("127.0.0.1", 0))
    held = []

    def accept():
        while True:
            held.append(listener.accept()[0])  # kept open, never answered
            first.seen()

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1]


def grpc_server(first: FirstConnection, ping: bool = False) -> int:
    import grpc
    from ray.core.generated import ray_client_pb2, ray_client_pb2_grpc

    class Pinged(ray_client_pb2_grpc.RayletDriverServicer):
        def ClusterInfo(self, request, context):
            return ray_client_pb2.ClusterInfoResponse(json="{}")

    class Noticed(grpc.ServerInterceptor):  # a gRPC server's connections show as its calls
        def intercept_service(self, continuation, details):
            first.seen()
            return continuation(details)

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(2), interceptors=[Noticed()])
    if ping:
        ray_client_pb2_grpc.add_RayletDriverServicer_to_server(Pinged(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    SERVING.append(server)
    return port


LISTENERS = {"http": http_server, "silent": silent_server, "grpc": grpc_server,
             "client": lambda first: grpc_server(first, ping=True)}


def main(kind: str, model: str, cache: str, *flags: str) -> None:
    # SIGINT handled here, so the build gets its default, as from a terminal (tests/terminal.py),
    # without a preexec_fn: a fork running Python beside a gRPC server's threads may abort
    signal.signal(signal.SIGINT, signal.default_int_handler)
    first = FirstConnection()
    port = LISTENERS[kind](first)
    started = time.monotonic()
    build = subprocess.Popen(
        [sys.executable, "-m", "pypto_offline", model, "--target", "kirin9050", "--executor",
         "ray", "--ray-address", f"127.0.0.1:{port}", "--cache-dir", cache, "--no-report"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    signalled = None
    if "--interrupt" in flags and first.event.wait(LIMIT_S):
        time.sleep(0.5)  # into the wait for an answer
        build.send_signal(signal.SIGINT)
        signalled = time.monotonic()
    try:
        _, err = build.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        build.kill()
        _, err = build.communicate()
    ended = time.monotonic()
    since = signalled or first.at or started
    print(json.dumps({"port": port, "exit": build.returncode, "seconds": round(ended - since, 1),
                      "total": round(ended - started, 1), "stderr": err}))


if __name__ == "__main__":
    main(*sys.argv[1:])
