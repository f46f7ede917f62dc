"""Peer engines measured in the same run as specdec, on the same model files and the same prompt tokens.

- `hf`: transformers `generate` — plain (`hf-none`), with the draft as `assistant_model` (`hf-assisted`,
  transformers' own draft-length schedule) and with `prompt_lookup_num_tokens` (`hf-lookup`).
- `llamacpp`: llama-cpp-python on the GGUF files — plain (`llamacpp-none`) and its prompt-lookup draft
  (`llamacpp-lookup`). It runs in a child process so that a crash inside llama.cpp on one prompt is recorded
  as that run's error and the next prompt gets a fresh process.

Each peer returns the output token ids and the times of each streamed chunk; TTFT/TPOT follow the same
formulas as specdec's own stats.
"""
from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecDecError
from ..metrics.stats import RequestStats, peak_rss_mb

PEERS = {"hf": ("hf-none", "hf-assisted", "hf-lookup"), "llamacpp": ("llamacpp-none", "llamacpp-lookup")}


@dataclass
class PeerRequest:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    seed: int


def timed_stats(method: str, k: int, prompt_tokens: int, token_ids: list[int], start: float,
                first_token_at: float | None, end: float, finish_reason: str) -> dict:
    s = RequestStats(method=method, num_speculative_tokens=k, prompt_tokens=prompt_tokens,
                     completion_tokens=len(token_ids), finish_reason=finish_reason)
    s.finalize(start, first_token_at, end)
    return {**s.to_dict(), "token_ids": token_ids}


class HFPeer:
    name = "hf"

    def __init__(self, target: Path, draft: Path | None, dtype: str, eos_ids: list[int], lookup_k: int):
        try:
            import transformers  # noqa: F401
        except ImportError:
            raise SpecDecError("peer 'hf' needs transformers: pip install 'specdec[peers]'") from None
        self.dtype = dtype
        self.eos_ids = list(eos_ids)
        self.lookup_k = lookup_k
        self.target = self._load(target)
        self.draft = self._load(draft) if draft is not None else None
        self.methods = [m for m in PEERS["hf"] if m != "hf-assisted" or self.draft is not None]

    def _load(self, path: Path):
        import torch
        from transformers import AutoModelForCausalLM

        dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}[self.dtype]
        if path.is_dir():
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        else:
            # transformers keeps GGUF weights quantized and computes in float32 (its advice: load as float32)
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        return model.eval()

    def run(self, method: str, req: PeerRequest) -> dict:
        import torch
        from transformers import GenerationConfig
        from transformers.generation.streamers import BaseStreamer

        class Clock(BaseStreamer):
            def __init__(self):
                self.calls = 0
                self.first = None

            def put(self, value):
                self.calls += 1
                if self.calls == 2:       # the first put is the prompt itself
                    self.first = time.perf_counter()

            def end(self):
                pass

        sampled = req.temperature > 0
        gen = GenerationConfig(max_new_tokens=req.max_tokens, do_sample=sampled,
                               temperature=req.temperature if sampled else 1.0, top_k=0, top_p=1.0,
                               eos_token_id=self.eos_ids, pad_token_id=self.eos_ids[0])
        extra, k = {}, 0
        if method == "hf-assisted":
            extra["assistant_model"] = self.draft
            k = int(getattr(self.draft.generation_config, "num_assistant_tokens", 20) or 0)
        elif method == "hf-lookup":
            gen.prompt_lookup_num_tokens = k = self.lookup_k
        torch.manual_seed(req.seed)
        ids = torch.tensor([req.prompt_ids])
        clock = Clock()
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.target.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen,
                                       streamer=clock, **extra)
        end = time.perf_counter()
        new = out[0, ids.shape[1]:].tolist()
        reason = "stop" if new and new[-1] in self.eos_ids else "length"
        return timed_stats(method, k, len(req.prompt_ids), new, start, clock.first, end, reason)

    def close(self) -> None:
        self.target = self.draft = None


def _llamacpp_worker(conn, model_path: str, n_ctx: int, threads: int, lookup_k: int, eos_ids: list[int]) -> None:
    """Child process: serve (method, request) pairs over `conn` until it is closed."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    engines = {}

    def engine(method):
        if method not in engines:
            draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup_k) if method == "llamacpp-lookup" else None
            engines[method] = Llama(model_path=model_path, n_ctx=n_ctx, n_threads=threads, n_batch=512,
                                    draft_model=draft, verbose=False)
        return engines[method]

    while True:
        try:
            method, req = conn.recv()
        except EOFError:
            return
        try:
            llm = engine(method)
            llm.set_seed(req.seed)
            tokens, first = [], None
            start = time.perf_counter()
            reason = "length"
            for tok in llm.generate(req.prompt_ids, temp=req.temperature, top_k=0, top_p=1.0, min_p=0.0,
                                    repeat_penalty=1.0, reset=True):
                if first is None:
                    first = time.perf_counter()
                tokens.append(int(tok))
                if tok in eos_ids:
                    reason = "stop"
                    break
                if len(tokens) >= req.max_tokens:
                    break
            end = time.perf_counter()
            k = lookup_k if method == "llamacpp-lookup" else 0
            result = timed_stats(method, k, len(req.prompt_ids), tokens, start, first, end, reason)
            result["peak_rss_mb"] = peak_rss_mb()
            conn.send(("ok", result))
        except Exception as exc:  # noqa: BLE001 - reported as this run's error
            conn.send(("error", f"{type(exc).__name__}: {exc}".strip() or traceback.format_exc(limit=1)))


class LlamaCppPeer:
    name = "llamacpp"

    def __init__(self, target: Path, n_ctx: int, threads: int, lookup_k: int, eos_ids: list[int]):
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            raise SpecDecError("peer 'llamacpp' needs llama-cpp-python: pip install 'specdec[peers]'") from None
        if not target.is_file() or target.suffix != ".gguf":
            raise SpecDecError(f"peer 'llamacpp' needs a GGUF target; {target} is not a .gguf file")
        self.args = (str(target), n_ctx, threads, lookup_k, list(eos_ids))
        self.methods = list(PEERS["llamacpp"])
        self._proc = self._conn = None

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_llamacpp_worker, args=(child, *self.args), daemon=True)
        self._proc.start()
        child.close()

    def run(self, method: str, req: PeerRequest) -> dict:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        try:
            self._conn.send((method, req))
            status, payload = self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self._proc.join(timeout=5)
            code = self._proc.exitcode
            self._proc = None
            raise RuntimeError(f"llama.cpp process died (exit code {code})") from None
        if status == "error":
            raise RuntimeError(payload)
        return payload

    def close(self) -> None:
        if self._proc is not None:
            self._conn.close()
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.kill()
            self._proc = None
