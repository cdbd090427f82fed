"""One real server (uvicorn on 127.0.0.1, a free port) per test module, stopped after."""

import socket
import threading
import time
from pathlib import Path

import pytest

SPECS = Path(__file__).resolve().parents[2] / "specs"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def live_server():
    uvicorn = pytest.importorskip("uvicorn")
    from maxdecl.serve import build_app, open_server

    server = open_server(SPECS / "llama3.yaml", parallel=3)   # the seeded random tiny model
    port = free_port()
    config = uvicorn.Config(build_app(server), host="127.0.0.1", port=port, log_level="warning")
    http = uvicorn.Server(config)
    thread = threading.Thread(target=http.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not http.started and time.time() < deadline:
        time.sleep(0.05)
    assert http.started, "the server did not start"
    yield server, f"http://127.0.0.1:{port}"
    http.should_exit = True
    thread.join(10)
    server.engine.close()
