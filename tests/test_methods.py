"""One method, one place: the method table built from the proposers' declarations, what every surface reads from
it, the plugin loader's handling of good, broken and filtered entry points, and the count of method-name
literals left outside the table (tools/method_literals.py)."""
from __future__ import annotations

import importlib.util
import logging
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

import specdec
from specdec.config import SpeculativeConfig
from specdec.proposers import plugins, registry
from specdec.proposers.ngram import NgramProposer
from specdec.proposers.registry import (
    METHOD_TABLE,
    Method,
    draft_model_method,
    get_method,
    lookup_method,
    method_names,
    register_method,
    unregister_method,
)

REPO = Path(__file__).resolve().parent.parent


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_builtin_methods_come_from_the_proposers_declarations():
    from specdec.proposers import cross_vocab, draft_model, eagle, hybrid, medusa, ngram, prediction, suffix

    assert method_names() == ("none", "ngram", "suffix", "draft", "cross_vocab", "hybrid", "eagle3", "eagle",
                              "medusa", "predicted_outputs", "auto")
    for declared in (ngram.METHOD, suffix.METHOD, draft_model.METHOD, cross_vocab.METHOD, hybrid.METHOD,
                     eagle.EAGLE3, eagle.EAGLE, medusa.METHOD, prediction.METHOD):
        assert METHOD_TABLE[declared.name] is declared and callable(declared.build)
    assert method_names("head") == ("eagle3", "eagle", "medusa")
    assert get_method("suffix").state_file == "suffix_cache" and get_method("draft").needs == "draft_model"
    # the roles auto and a draft-only start rely on are named on the declarations, not taken from the order
    assert (lookup_method(), draft_model_method()) == ("ngram", "draft")
    with pytest.raises(ValueError, match="unknown speculative method 'nope'.*none, ngram"):
        SpeculativeConfig(method="nope")


@pytest.mark.parametrize("row, message", [
    (Method("ngram", 4, "lookup", build=NgramProposer), "already declared"),
    (Method("Bad Name", 4, "lookup", build=NgramProposer), "must match"),
    (Method("odd", 4, "oracle", build=NgramProposer), "kind must be one of"),
    (Method("odd", 0, "lookup", build=NgramProposer), "default_k must be in"),
    (Method("odd", 4, "lookup"), "build must be a callable"),
    (Method("odd", 4, "lookup", build=NgramProposer, needs="gpu"), "needs must be one of"),
    (Method("odd", 4, "lookup", build=NgramProposer, prior_alpha=1.5), "prior_alpha must be in"),
    ("not a method", "not a specdec.Method"),
    (Method("odd", 4, "lookup", build=NgramProposer, step_lookup=True), "step_lookup is already held by 'ngram'"),
    (Method("odd", 4, "cache", build=NgramProposer, step_lookup=True), "step_lookup needs kind 'lookup'"),
    (Method("odd", 4, "model", build=NgramProposer, draft_default=True), "draft_default needs"),
])
def test_bad_rows_are_refused_with_what_is_wrong(row, message):
    before = dict(METHOD_TABLE)
    with pytest.raises(ValueError, match=message):
        register_method(row)
    assert METHOD_TABLE == before


def test_a_registered_method_reaches_the_surfaces_and_leaves_with_unregister():
    from specdec.bench.offline import bench_methods
    from specdec.cli import build_parser
    from specdec.server.protocol import SpeculativeOverride

    row = register_method(Method("tail", 3, "lookup", build=lambda ctx: NgramProposer(), origin="test"))
    try:
        assert "tail" in method_names() and method_names()[-1] == "auto"
        assert SpeculativeConfig(method="tail").num_speculative_tokens == 3
        assert SpeculativeOverride(method="tail").method == "tail"
        assert "tail" in SpeculativeOverride.model_json_schema()["properties"]["method"]["enum"]
        assert "tail" in bench_methods()
        args = build_parser().parse_args(["generate", "x", "--method", "tail"])
        assert args.method == "tail"
    finally:
        unregister_method(row.name)
    assert "tail" not in METHOD_TABLE
    with pytest.raises(ValueError, match="unknown speculative method"):
        SpeculativeOverride(method="tail")
    with pytest.raises(ValueError, match="built in"):
        unregister_method("ngram")


def _entry_points(monkeypatch, *eps: EntryPoint):
    monkeypatch.setattr(plugins, "entry_points", lambda group: [e for e in eps if e.group == group])
    monkeypatch.setattr(plugins, "_loaded", {})


def test_plugin_loader_registers_good_ones_and_reports_bad_ones_in_one_line(monkeypatch, caplog, tmp_path):
    (tmp_path / "plugin_good.py").write_text(
        "from specdec import Method\nfrom specdec.proposers.ngram import NgramProposer\n"
        "METHOD = Method('good', 5, 'lookup', build=lambda ctx: NgramProposer())\n"
        "def several():\n    return [Method('good2', 2, 'cache', build=lambda ctx: NgramProposer())]\n")
    (tmp_path / "plugin_broken.py").write_text("raise ImportError('libfoo.so: cannot open shared object')\n")
    (tmp_path / "plugin_badrow.py").write_text(
        "from specdec import Method\nMETHOD = Method('ngram', 5, 'lookup', build=print)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    g = plugins.GROUP
    _entry_points(monkeypatch, EntryPoint("good", "plugin_good:METHOD", g),
                  EntryPoint("many", "plugin_good:several", g), EntryPoint("broken", "plugin_broken:METHOD", g),
                  EntryPoint("badrow", "plugin_badrow:METHOD", g),
                  EntryPoint("elsewhere", "plugin_good:METHOD", "other.group"))
    try:
        with caplog.at_level(logging.WARNING, logger="specdec.plugins"):
            loaded = registry.load_plugins()
        assert loaded == {"good": ["good"], "many": ["good2"], "broken": [], "badrow": []}
        assert get_method("good").default_k == 5 and get_method("good2").kind == "cache"
        assert get_method("good").origin != "specdec"                   # the distribution (here: the module)
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 2 and all("\n" not in line for line in lines)
        assert "'broken = plugin_broken:METHOD' not loaded: ImportError: libfoo.so" in lines[0]
        assert "'badrow = plugin_badrow:METHOD' not loaded: method 'ngram' is already declared" in lines[1]
        assert registry.load_plugins() == loaded                          # once per process
    finally:
        for name in ("good", "good2"):
            unregister_method(name)


@pytest.mark.parametrize("wanted, expect", [("", set()), ("other", set()), ("good, other", {"good"})])
def test_specdec_plugins_names_the_entry_points_that_load(monkeypatch, tmp_path, wanted, expect):
    (tmp_path / "plugin_filtered.py").write_text(
        "from specdec import Method\nfrom specdec.proposers.ngram import NgramProposer\n"
        "METHOD = Method('good', 5, 'lookup', build=lambda ctx: NgramProposer())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _entry_points(monkeypatch, EntryPoint("good", "plugin_filtered:METHOD", plugins.GROUP))
    monkeypatch.setenv("SPECDEC_PLUGINS", wanted)
    try:
        registry.load_plugins()
        assert {"good"} & set(METHOD_TABLE) == expect
    finally:
        unregister_method("good")


def test_method_names_are_spelled_out_only_where_a_reason_says_why():
    tool = _tool("method_literals")
    hits = tool.find(REPO / "specdec", {m for m in METHOD_TABLE if METHOD_TABLE[m].origin == "specdec"})
    assert len(hits) <= 10, hits
    unexplained = [h for h in hits if (h[0], h[2]) not in tool.ALLOWED]
    assert unexplained == []
    assert tool.main([]) == 0


def test_method_literal_counter_finds_what_it_must(tmp_path):
    tool = _tool("method_literals")
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "x.py").write_text(
        '"""Docstrings may say "draft"."""\n'
        'def f(seq, spec, r):\n'
        '    if seq.method == "draft":\n'             # counted
        '        return {"draft": 1}\n'               # a record's key: not counted
        '    if spec.method in ("none", "ngram"):\n'  # both counted: "none" compared with a method
        '        return r["suffix"]\n'                # a field: not counted
        '    quantization = "none"\n'                 # another meaning of the word: not counted
        '    method: str = "auto"\n'                  # counted
        '    return g(method="medusa", impl="auto")\n')   # method= counted, impl= not
    (tmp_path / "proposers").mkdir()
    (tmp_path / "proposers" / "mine.py").write_text('NAME = "draft"\n')   # a method's own file: not counted
    found = sorted((line, lit) for _, line, lit in tool.find(tmp_path, {"none", "ngram", "suffix", "draft", "medusa",
                                                                        "auto"}))
    assert found == [(3, "draft"), (5, "ngram"), (5, "none"), (8, "auto"), (9, "medusa")]


def test_readme_method_table_is_the_generated_one():
    tool = _tool("method_table")
    assert tool.readme_table((REPO / "README.md").read_text()) == tool.table(), \
        "README.md's method table is stale: python tools/method_table.py --write"


def test_public_api_exports_what_a_plugin_needs():
    for name in ("Method", "Proposer", "BuildContext", "register_method"):
        assert hasattr(specdec, name)


def test_every_declared_method_keeps_greedy_parity(tiny_dirs, tiny_models, tmp_path):
    """Every method in the method table, as a request names it, gives plain decoding's greedy tokens: the draft
    models (the tiny draft; cross_vocab with one of another vocabulary), random learned heads of each kind, the
    lookups, suffix decoding, a prediction with wrong tokens in it, and the policy."""
    from test_heads import _eagle1, _eagle3, _medusa

    from specdec import LLM, SamplingParams
    from specdec.models.heads import save_head, target_fingerprint
    from specdec.proposers.registry import METHOD_TABLE

    target, _ = tiny_models
    fingerprint = {"specdec_target_fingerprint": target_fingerprint(target.model)}
    heads = {"eagle3": _eagle3(target.model), "medusa": _medusa(target.model, truncated=150),
             "eagle": _eagle1(target.model)}
    for method, head in heads.items():
        save_head(head, method, tmp_path / method, fingerprint)
    common = dict(target=str(tiny_dirs["target"]), dtype="float32", device="cpu", progress=False)
    main = LLM(draft=str(tiny_dirs["draft"]), speculative="auto", heads={m: str(tmp_path / m) for m in heads},
               **common)
    other = LLM(draft=str(tiny_dirs["other_vocab"]), speculative="cross_vocab", **common)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):"
    plain = main.generate(prompt, params, spec="none")[0].token_ids
    wrong = list(plain)
    wrong[5:8] = [t + 1 for t in wrong[5:8]]                 # a prediction that is right, then wrong, then right
    tested = {}
    for name, method in METHOD_TABLE.items():
        llm = other if method.needs == "draft_model" and name == "cross_vocab" else main
        if method.kind in ("plain", "policy"):
            spec = name
        else:
            spec = SpeculativeConfig(method=name, num_speculative_tokens=3,
                                     prediction=wrong if name == "predicted_outputs" else None)
        out = llm.generate(prompt, params, spec=spec)[0]
        tested[name] = out.token_ids == plain
        if name not in ("none", "auto"):
            assert out.stats.draft_tokens > 0, name           # it really drafted
    assert tested == {name: True for name in METHOD_TABLE}
