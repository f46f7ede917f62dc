"""A third-party proposer, end to end: examples/proposer-plugin (method `echo`) installed with pip into a
directory of its own, then driven through every surface in fresh interpreters that find it by its entry point:
`LLM`, `specdec generate`, `bench offline`, method auto, and `specdec serve` (server-wide, per request, status),
beside a broken plugin that must cost one log line and nothing else. Without the directory on the path, nothing
of it is left."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
from server_utils import server_process

from specdec.proposers.registry import METHOD_TABLE, method_names

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "proposer-plugin"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    """pip install the example (from a copy, so its build files stay out of the repository) into a directory of
    its own, beside a broken plugin's distribution (its module raises at import)."""
    base = tmp_path_factory.mktemp("plugin")
    src, site = base / "src", base / "site"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--no-index", "--target", str(site), str(src)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (site / "specdec_echo-0.1.0.dist-info" / "entry_points.txt").is_file()
    (site / "specdec_broken.py").write_text("raise ImportError('libspecdec_broken.so: cannot open shared object')\n")
    dist = site / "specdec_broken-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: specdec-broken\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[specdec.proposers]\nbroken = specdec_broken:METHOD\n")
    return site


def _env(site: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("SPECDEC_PLUGINS", "PYTHONPATH")}
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return env


SURFACES = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    from specdec import LLM, SamplingParams, SpeculativeConfig
    from specdec.bench.offline import OfflineBenchConfig, run_offline
    from specdec.cli import main
    from specdec.proposers.registry import method_names

    target, draft, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    found = {"methods": list(method_names())}
    prompt = "class Cache:\\n    def rollback(self, n):\\n        self.length = n\\n"
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    common = dict(target=target, dtype="float32", device="cpu", progress=False, enable_prefix_caching=False)

    # LLM, with echo as its method
    llm = LLM(speculative=SpeculativeConfig(method="echo"), **common)
    echo = llm.generate(prompt, greedy)[0]
    plain = llm.generate(prompt, greedy, spec="none")[0]
    found["llm"] = {"same": echo.token_ids == plain.token_ids, "method": echo.stats.method,
                    "draft_tokens": echo.stats.draft_tokens, "status": llm.method_status("echo"),
                    "listed": [m["method"] for m in llm.methods()]}

    # specdec generate --method echo --compare
    stats = out / "generate.json"
    rc = main(["generate", prompt, "--target", target, "--dtype", "float32", "--device", "cpu", "--method", "echo",
               "--max-tokens", "16", "--compare", "--quiet", "--stats-json", str(stats)])
    found["generate"] = {"rc": rc, **{k: v for k, v in json.loads(stats.read_text()).items()
                                      if k in ("method", "parity")}}

    # bench offline --methods echo
    prompts = out / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": prompt}], "category": "code"}) + "\\n")
    result = run_offline(OfflineBenchConfig(prompts=str(prompts), methods=["echo"], ks=[3], max_tokens=12,
                                            target=target, dtype="float32", device="cpu", progress=False,
                                            out=str(out / "bench")))
    runs = [r for r in result["runs"] if r["method"] == "echo"]
    found["bench"] = {"runs": len(runs), "parity": all(r["parity"] for r in runs),
                      "errors": [r.get("error") for r in runs if r.get("error")],
                      "state": result["config"]["memory"]["methods"].get("echo")}

    # method auto weighs echo and, in a fresh pool, tries it
    auto = LLM(speculative=SpeculativeConfig(method="auto"), draft=draft, **common)
    chosen = [auto.generate(prompt, SamplingParams(max_tokens=32, temperature=0.0), pool="p")[0].stats.method
              for _ in range(3)]
    found["auto"] = {"candidates": list(auto.policy().available), "chosen": chosen}
    print("RESULT " + json.dumps(found))
''')


def test_example_plugin_through_llm_generate_bench_and_auto(plugin_site, tiny_dirs, tmp_path):
    out = subprocess.run([sys.executable, "-c", SURFACES, str(tiny_dirs["target"]), str(tiny_dirs["draft"]),
                          str(tmp_path)], capture_output=True, text=True, timeout=600, env=_env(plugin_site),
                         cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    found = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert found["methods"][-2:] == ["echo", "auto"]
    llm = found["llm"]
    assert llm["same"] and llm["method"] == "echo" and llm["draft_tokens"] > 0
    assert llm["status"]["proposals"] > 0 and "echo" in llm["listed"]
    assert found["generate"] == {"rc": 0, "method": "echo", "parity": True}
    assert found["bench"] == {"runs": 1, "parity": True, "errors": [], "state": found["bench"]["state"]}
    assert found["bench"]["state"]["proposals"] > 0
    assert "echo" in found["auto"]["candidates"] and "echo" in found["auto"]["chosen"], found["auto"]
    # the broken plugin beside it: one line on stderr, naming it and why
    broken = [line for line in out.stderr.splitlines() if "specdec_broken" in line]
    assert len(broken) == 1 and "proposer plugin 'broken = specdec_broken:METHOD' not loaded: ImportError" in broken[0]


def test_example_plugin_served_server_wide_and_per_request(plugin_site, tiny_dirs, tmp_path):
    args = ["--target", str(tiny_dirs["target"]), "--dtype", "float32", "--device", "cpu",
            "--speculative-config", '{"method": "echo", "num_speculative_tokens": 4}']
    with server_process(args, tmp_path / "serve.log", env=_env(plugin_site)) as (_, url):
        def ask(spec):
            body = {"messages": [{"role": "user", "content": "class Cache:\n    def rollback(self, n):"}],
                    "max_tokens": 24, "temperature": 0, "ignore_eos": True, **({"speculative": spec} if spec else {})}
            r = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            return r.json()
        default, per_request, plain = ask(None), ask({"method": "echo"}), ask({"method": "none"})
        status = httpx.get(url + "/v1/speculative/status", timeout=10).json()
    text = lambda r: r["choices"][0]["message"]["content"]  # noqa: E731
    assert text(default) == text(per_request) == text(plain)
    assert default["speculative"]["method"] == per_request["speculative"]["method"] == "echo"
    assert plain["speculative"]["method"] == "none"
    assert status["default"]["method"] == "echo"
    echo = next(m for m in status["methods"] if m["method"] == "echo")
    assert echo["origin"] == "specdec-echo" and echo["status"]["proposals"] > 0
    assert {m["method"] for m in status["methods"]} >= {"none", "ngram", "suffix", "echo", "auto"}
    log = (tmp_path / "serve.log").read_text()
    assert sum("proposer plugin 'broken = specdec_broken:METHOD' not loaded" in line for line in log.splitlines()) == 1


def test_removing_the_plugin_leaves_nothing(plugin_site, tmp_path):
    assert "echo" not in METHOD_TABLE                       # this process never had it on its path
    site = tmp_path / "site"
    shutil.copytree(plugin_site, site)
    code = "from specdec.proposers.registry import method_names; print(','.join(method_names()))"
    run = lambda: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,  # noqa: E731
                                 env=_env(site), cwd=tmp_path)
    assert "echo" in run().stdout.split(",")
    shutil.rmtree(site)                                     # what `pip uninstall specdec-echo` removes
    out = run()
    assert out.returncode == 0
    assert out.stdout.strip() == ",".join(method_names())     # the built-in ones, as this process has them
    assert "specdec" not in out.stderr                      # no warning about a plugin that is gone


def test_importing_registers_nothing_until_the_table_is_read(plugin_site, tmp_path):
    """The method table fills itself on its first read: importing specdec and every proposer module loads no
    plugin (a plugin's import cost and its warnings wait for a reader), and the first read sees the whole table."""
    code = textwrap.dedent("""
        import specdec, specdec.llm, specdec.server.app
        from specdec.proposers import plugins
        from specdec.proposers.registry import METHOD_TABLE
        print(sorted(plugins.loaded_plugins()))
        print(METHOD_TABLE["echo"].origin, sorted(plugins.loaded_plugins()))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=_env(plugin_site), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "specdec-echo ['broken', 'echo']"]
    assert out.stderr.count("proposer plugin 'broken") == 1   # reported once, at the first read
