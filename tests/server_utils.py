"""Start a specdec server on a free loopback port: in-process (a thread running uvicorn), or as a child process."""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager


def draft_llm(tiny_dirs, k: int = 3):
    """The tiny fp32 target with its draft, method draft at k: the LLM the server tests serve."""
    from specdec import LLM, SpeculativeConfig

    return LLM(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), dtype="float32", device="cpu",
               speculative=SpeculativeConfig(method="draft", num_speculative_tokens=k), progress=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(llm, spec, max_queued: int = 16, api_key: str | None = None, name: str = "tiny",
                   max_num_seqs: int | None = None, api_keys: dict[str, str] | None = None,
                   log_interval_s: float = 0.5):
    import uvicorn

    from specdec.server.app import ServerState, create_app
    from specdec.server.async_engine import AsyncEngine
    from specdec.server.metrics import ServerMetrics

    old_max = llm.engine.sched_cfg.max_num_seqs
    if max_num_seqs is not None:            # the scheduler reads its config at every step
        llm.engine.sched_cfg.max_num_seqs = max_num_seqs
    engine = AsyncEngine(llm, spec, max_queued, ServerMetrics(name), log_interval_s=log_interval_s)
    state = ServerState(engine, name, api_key=api_key, api_keys=api_keys or {}, drain_timeout_s=5)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(state), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    # start-up may measure the cost model (method auto on the real pair): ~10 s on an AVX-512 CPU, over 30 s on an
    # AVX2-only one; the deadline only catches a server that never starts
    deadline = time.time() + 300
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError("server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", state
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        llm.engine.sched_cfg.max_num_seqs = old_max


@contextmanager
def server_process(args: list[str], log_path, env: dict | None = None):
    """`specdec serve ARGS --port P` in a child process, its output in log_path; yields (proc, url) once /health
    answers 200 (the child dying or 120 s passing fails the test with the log). A child still running is killed."""
    import httpx

    port = free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "specdec.cli", "serve", *args, "--port", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + 120
            while True:
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None and time.time() < deadline, open(log_path).read()
                time.sleep(0.2)
            yield proc, url
        finally:
            if proc.poll() is None:
                proc.kill()
