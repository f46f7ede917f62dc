"""The server on the batching engine: a client leaving during a long prompt frees the engine within a chunk, gauges
follow finished requests at once, admission counts free running slots, KV grows with the request (issue 15's
engine-side items)."""
import asyncio
import time

import httpx
import pytest
from server_utils import running_server

from specdec import LLM, SpeculativeConfig
from specdec.engine import EngineConfig, LLMEngine


@pytest.fixture(scope="module")
def llm(tiny_dirs):
    return LLM(target=str(tiny_dirs["target"]), dtype="float32", device="cpu",
               speculative=SpeculativeConfig(method="none"), progress=False)


def _gauge(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def test_client_leaving_during_a_long_prefill_frees_the_engine_within_a_chunk(llm, monkeypatch):
    steps = []
    real_step = LLMEngine.step

    def recorded_slow_step(self):
        time.sleep(0.1)                        # each 16-token chunk "takes" 0.1 s: the prompt needs 15 chunks
        out = real_step(self)
        steps.append((time.monotonic(), self.last_step.num_prefill_tokens))
        return out

    monkeypatch.setattr(LLMEngine, "step", recorded_slow_step)
    old = llm.engine.sched_cfg.max_num_batched_tokens
    llm.engine.sched_cfg.max_num_batched_tokens = 16
    try:
        with running_server(llm, SpeculativeConfig(method="none")) as (url, state):
            prompt = [(i * 7) % 250 + 3 for i in range(240)]
            with pytest.raises(httpx.TimeoutException):
                httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 4}, timeout=0.45)
            left = time.monotonic()
            while state.engine.num_running and time.monotonic() - left < 5:
                time.sleep(0.01)
            assert state.engine.num_running == 0 and llm.engine.kv.allocated == llm.engine.kv.prefix.capacity
            prefilled = sum(n for _, n in steps)
            # it stopped long before the whole prompt: within a few chunks of the client leaving (counted in steps,
            # not seconds)
            assert prefilled < 240, prefilled
            assert sum(1 for t, n in steps if t > left and n) <= 4
    finally:
        llm.engine.sched_cfg.max_num_batched_tokens = old


def test_running_gauge_drops_as_soon_as_a_request_finishes(llm):
    """The gauges follow the requests, not the periodic log line: with a log interval of an hour, the running gauge
    still drops once the request has finished (the deadline only ends a wait that would never end)."""
    with running_server(llm, SpeculativeConfig(method="none"), log_interval_s=3600) as (url, _):
        r = httpx.post(url + "/v1/chat/completions", timeout=30,
                       json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
        assert r.status_code == 200
        deadline = time.monotonic() + 30
        while _gauge(url, "specdec:num_requests_running") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _gauge(url, "specdec:num_requests_running") == 0
        assert _gauge(url, "specdec:num_requests_waiting") == 0


def test_one_running_and_max_queued_waiting_all_fit(llm, monkeypatch):
    """--max-queued 4 with one running slot: five simultaneous requests all fit (1 running + 4 waiting)."""
    real_step = LLMEngine.step

    def slow_step(self):
        time.sleep(0.01)
        return real_step(self)

    monkeypatch.setattr(LLMEngine, "step", slow_step)
    with running_server(llm, SpeculativeConfig(method="none"), max_queued=4, max_num_seqs=1) as (url, _):
        async def five():
            async with httpx.AsyncClient(timeout=60) as c:
                return await asyncio.gather(*[c.post(url + "/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 8}) for i in range(5)])

        codes = [r.status_code for r in asyncio.run(five())]
        assert codes == [200] * 5, codes


def test_kv_grows_with_the_request_not_the_window(tmp_path_factory):
    """A request allowed 8000 new tokens holds KV for the tokens it has, not for the whole window."""
    from conftest import make_tiny_model

    from specdec.models.loader import load_model
    from specdec.sampling_params import SamplingParams

    target = load_model(str(make_tiny_model(tmp_path_factory.mktemp("window") / "t", max_position_embeddings=8192)),
                        dtype="float32", device="cpu", progress=False)
    engine = LLMEngine(EngineConfig(target.model, target.tokenizer))
    seq = engine.add_request("long", target.tokenizer.encode("def add(a, b):"), SamplingParams(max_tokens=8000,
                                                                                               ignore_eos=True))
    for _ in range(20):
        engine.step()
    assert len(seq.output_ids) == 20
    assert engine.kv.allocated <= 64            # positions allocated, vs 8000+ preallocated before
    engine.abort("long")
    assert engine.kv.allocated == engine.kv.prefix.capacity


def test_an_idle_engine_gathers_the_admissions_in_flight_into_its_first_step(llm, monkeypatch):
    """Requests admitted together (a burst: their prompts still tokenizing when the first is submitted) prefill in
    the idle engine's first step together; an admission given back (a request refused after tokenizing) lets the
    engine start without it."""
    from specdec.sampling_params import SamplingParams
    from specdec.server.async_engine import AsyncEngine
    from specdec.server.metrics import ServerMetrics

    first_steps = []
    real_step = LLMEngine.step

    def step(self):
        first_steps.append(self.num_waiting + self.num_running)      # requests in the engine at this step
        return real_step(self)

    monkeypatch.setattr(LLMEngine, "step", step)
    engine = AsyncEngine(llm, SpeculativeConfig(method="none"), 4, ServerMetrics("tiny"), gather_s=600.0)
    engine.start()
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    prompt = llm.tokenizer.encode("def add(a, b):")

    async def finish(handle):
        return [d async for d in handle.deltas()][-1].finished

    async def burst():
        assert engine.try_admit() and engine.try_admit()
        a = await engine.submit("a", prompt, params, engine.default_spec)
        await asyncio.sleep(0.2)                # the other prompt still tokenizing: the engine waits for it
        assert first_steps == []
        b = await engine.submit("b", prompt, params, engine.default_spec)
        return await asyncio.wait_for(asyncio.gather(finish(a), finish(b)), 60)

    async def one_given_back():
        assert engine.try_admit() and engine.try_admit()
        a = await engine.submit("c", prompt, params, engine.default_spec)
        await asyncio.sleep(0.2)                # the engine gathering
        engine.release_admission()              # the other refused after tokenizing: nothing more to wait for
        return await asyncio.wait_for(finish(a), 60)

    try:
        assert asyncio.run(burst()) == [True, True]
        assert first_steps[0] == 2                                    # both prompts in the first step
        first_steps.clear()
        assert asyncio.run(one_given_back()) is True                  # not held for gather_s (600 s)
        assert first_steps[0] == 1
    finally:
        engine.shutdown(timeout=5)
