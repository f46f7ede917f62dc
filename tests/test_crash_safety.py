"""Crash safety: a writer killed (SIGKILL) at any point while it writes the suffix cache, a cost model or converted
weights leaves the last complete version (or none) and no litter that outlives it; a damaged file is set aside with
one line and the start goes on fresh; converted weights carry their source's checksum and are converted again when
the source's content changed under the same name, size and time."""
import json
import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from specdec.models.loader import load_model
from specdec.proposers.suffix import SuffixProposer
from specdec.utils import atomic_path, write_json_atomic

WRITER = textwrap.dedent("""
    import os, sys, threading
    from specdec.models.loader import load_model
    from specdec.proposers.suffix import SuffixProposer
    from specdec.utils import write_json_atomic

    out, model = sys.argv[1], sys.argv[2]
    os.environ["SPECDEC_CACHE"] = os.path.join(out, "cache")

    def suffix():
        sp = SuffixProposer(vocab_size=1000)
        for i in range(10 ** 6):
            sp.learn("p", [], [i % 1000] * 50)         # version i: requests 0..i, each 50 copies of its number
            sp.save(os.path.join(out, "suffix.json"))

    def cost():
        for i in range(10 ** 6):
            write_json_atomic(os.path.join(out, "cost.json"), {"version": i, "rows": [i] * 2000})

    for f in (suffix, cost):
        threading.Thread(target=f, daemon=True).start()
    print("ready", flush=True)
    import shutil
    converted = os.path.join(os.environ["SPECDEC_CACHE"], "converted")
    while True:                                        # convert, drop the entry (renamed away first), again
        load_model(model, dtype="bfloat16", device="cpu", progress=False, pack=False)
        for d in os.listdir(converted):
            if not d.startswith("."):
                gone = os.path.join(converted, f".gone-{os.getpid()}")
                os.rename(os.path.join(converted, d), gone)
                shutil.rmtree(gone)
""")


def _state(model):
    return {k: v.float() for k, v in model.state_dict().items()}


def test_writers_killed_at_random_points_leave_a_complete_version(tiny_dirs, tmp_path, monkeypatch):
    import specdec.utils

    monkeypatch.setattr(specdec.utils, "STALE_S", 0.0)       # what dead writers left is swept at once
    model = str(tiny_dirs["target"])
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "ref"))
    reference = _state(load_model(model, dtype="bfloat16", device="cpu", progress=False, pack=False).model)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    rng = random.Random(0)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    seen_versions = set()
    deadline = time.monotonic() + 45
    kills = 0
    while kills < 6 and time.monotonic() < deadline:
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), model], env=env,
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 1.2))
        child.send_signal(signal.SIGKILL)
        child.wait()
        kills += 1
        # the suffix cache: the last complete version, read whole
        if (tmp_path / "suffix.json").exists():
            sp = SuffixProposer(vocab_size=1000)
            sp.load(str(tmp_path / "suffix.json"))
            requests = [r.tolist() for r in sp.pools["p"].requests]
            assert requests == [[i] * 50 for i in range(len(requests))]
            seen_versions.add(len(requests))
        if (tmp_path / "cost.json").exists():
            saved = json.loads((tmp_path / "cost.json").read_text())
            assert saved["rows"] == [saved["version"]] * 2000
        # converted weights: a complete entry, or none and a conversion now; never wrong weights
        loaded = load_model(model, dtype="bfloat16", device="cpu", progress=False, pack=False)
        got = _state(loaded.model)
        assert got.keys() == reference.keys() and all(torch.equal(got[k], reference[k]) for k in got)
    assert kills >= 4 and len(seen_versions) >= 2
    # what killed writers left half-written is swept by the next write beside it (their processes are gone)
    write_json_atomic(tmp_path / "cost.json", {"version": -1, "rows": []})
    SuffixProposer(vocab_size=1000).save(str(tmp_path / "suffix.json"))
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    converted = tmp_path / "cache" / "converted"
    assert all(not p.name.startswith(".") for d in converted.iterdir() if not d.name.startswith(".gone")
               for p in d.iterdir())


def test_litter_of_a_live_writer_is_left_alone(tmp_path):
    with atomic_path(tmp_path / "f.json") as mine:
        mine.write_text("{}")
        with atomic_path(tmp_path / "f.json") as other:       # a second writer beside this one (this process)
            other.write_text("{}")
        assert mine.exists()                                   # not swept: its writer is alive
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_new_files_get_the_umask_without_changing_it(tmp_path):
    old = os.umask(0o027)
    try:
        write_json_atomic(tmp_path / "a.json", {})
        assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o640
        assert os.umask(0o027) == 0o027                        # still the process's umask
    finally:
        os.umask(old)


def test_a_damaged_suffix_cache_is_set_aside_and_the_server_starts_fresh(tiny_dirs, tmp_path, caplog):
    from specdec import LLM, SpeculativeConfig

    path = tmp_path / "suffix.json"
    sp = SuffixProposer(vocab_size=1000)
    sp.learn("p", [], [1, 2, 3] * 40)
    sp.save(str(path))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])          # cut in half
    with caplog.at_level(logging.WARNING, logger="specdec"):
        llm = LLM(target=str(tiny_dirs["target"]), dtype="float32", progress=False,
                  speculative=SpeculativeConfig(method="suffix"), suffix_cache=str(path))
    warned = [r for r in caplog.records if "suffix" in r.getMessage()]
    assert len(warned) == 1 and "set aside" in warned[0].getMessage() and "\n" not in warned[0].getMessage()
    assert llm.engine.proposers["suffix"].status()["tokens"] == 0
    assert not path.exists() and (tmp_path / "suffix.json.damaged").exists()
    llm.save_state()                                                           # and it keeps learning from here
    assert json.loads(path.read_text())["pools"] == {}


@pytest.mark.parametrize("damage", ["not json", '{"version": 1, "pools": {"p": [[1, 2, -5]]}}',
                                    '{"version": 1, "pools": {"p": [[1, 2, 99999]]}}', '[1, 2]'])
def test_suffix_cache_load_is_all_or_nothing(tmp_path, damage):
    from specdec.errors import SpecDecError

    path = tmp_path / "s.json"
    path.write_text(damage)
    sp = SuffixProposer(vocab_size=1000)
    sp.learn("q", [], [7, 8, 9])
    with pytest.raises(SpecDecError, match="--suffix-cache"):
        sp.load(str(path))
    assert list(sp.pools) == ["q"] and sp.status()["tokens"] == 4             # nothing half-read


def test_a_damaged_cost_model_is_measured_again(tmp_path):
    from specdec.policy.cost_model import read_cost_file

    path = tmp_path / "c.json"
    for text in ("{cut", "[]", '{"revision": 11, "key": "k"}', '{"revision": 10, "key": "k", "verify": [1, 2]}',
                 '{"revision": 11, "key": "k", "draft_step": 0.1, "verify": [1]}'):
        path.write_text(text)
        assert read_cost_file(path, "k", 11) is None, text
    from specdec.policy import CostModel

    path.write_text(json.dumps({**CostModel(0.3, [1.0, 1.1, 1.2]).to_dict(), "key": "k", "revision": 11}))
    assert read_cost_file(path, "k", 11).verify == [1.0, 1.1, 1.2]
    assert read_cost_file(path, "other", 11) is None and read_cost_file(tmp_path / "none.json", "k", 11) is None
    # measured without a draft model (--draft none, a Gemma target): standard JSON (null), read back and reused
    no_draft = CostModel(float("inf"), [1.0, 1.1], by_context=[{"context": 1024, "verify": [1.0, 1.2],
                                                                 "draft_step": float("inf"), "target_step_s": 0.1}])
    path.write_text(json.dumps({**no_draft.to_dict(), "key": "k", "revision": 11}, allow_nan=False))
    back = read_cost_file(path, "k", 11)
    assert back.draft_step == float("inf") and back.by_context[0]["draft_step"] == float("inf")


def test_converted_weights_follow_their_sources_checksum(tiny_dirs, tmp_path, monkeypatch, caplog):
    import shutil

    src = tmp_path / "model"
    shutil.copytree(tiny_dirs["target"], src)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    first = load_model(str(src), dtype="bfloat16", device="cpu", progress=False, pack=False)
    assert first.converted and not load_model(str(src), dtype="bfloat16", device="cpu", progress=False,
                                              pack=False).converted
    # other weights under the same name, size and modification time (e.g. a copy with preserved times)
    weights = next(src.glob("*.safetensors"))
    st = weights.stat()
    data = bytearray(weights.read_bytes())
    for i in range(len(data) - 4000, len(data), 4):       # the last fp32 values' high mantissa bits
        data[i + 2] ^= 0x20
    weights.write_bytes(bytes(data))
    assert weights.stat().st_size == st.st_size
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    with caplog.at_level(logging.WARNING, logger="specdec"):
        again = load_model(str(src), dtype="bfloat16", device="cpu", progress=False, pack=False)
    assert again.converted and any("checksum" in r.getMessage() for r in caplog.records)
    a, b = _state(first.model), _state(again.model)
    assert not all(torch.equal(a[k], b[k]) for k in a)
    # a damaged converted file: set aside with one line, converted again
    entry = next((tmp_path / "cache" / "converted").iterdir())
    weights_file = next(entry.rglob("model.safetensors"))
    weights_file.write_bytes(weights_file.read_bytes()[:1000])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="specdec"):
        third = load_model(str(src), dtype="bfloat16", device="cpu", progress=False, pack=False)
    assert third.converted and any("damaged" in r.getMessage() for r in caplog.records)
    c = _state(third.model)
    assert all(torch.equal(b[k], c[k]) for k in b)
