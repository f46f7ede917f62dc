"""CLI: bad input -> one line on stderr, non-zero exit, no traceback; a tiny end-to-end generate."""
import json
import os
import subprocess
import sys

import pytest

from specdec.cli import main


def _run(capsys, *argv):
    rc = main(list(argv))
    err = capsys.readouterr().err.strip()
    return rc, err


@pytest.mark.parametrize("args,needle", [
    (["--target", "no-such-model"], "unknown model 'no-such-model'"),
    (["--target", "/nonexistent/model.gguf"], "not found"),
    (["--temperature", "-0.5"], "temperature must be >= 0"),
    (["--top-p", "0"], "top_p must be in (0, 1]"),
    (["--top-p", "1.5"], "top_p must be in (0, 1]"),
    (["--max-tokens", "0"], "max_tokens must be an integer >= 1"),
])
def test_bad_input_one_line(capsys, args, needle):
    rc, err = _run(capsys, "generate", "hello", *args)
    assert rc != 0
    assert needle in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_corrupt_gguf(capsys, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(200))
    rc, err = _run(capsys, "generate", "hello", "--target", str(bad))
    assert rc != 0 and "cannot read GGUF file" in err and len(err.splitlines()) == 1


def test_prompt_longer_than_context(capsys, tiny_dirs):
    rc, err = _run(capsys, "generate", "word " * 400, "--target", str(tiny_dirs["target"]), "--no-chat",
                   "--dtype", "float32")
    assert rc != 0 and "context window is 256" in err and len(err.splitlines()) == 1


def test_generate_streams_and_writes_stats(capsys, tiny_dirs, tmp_path):
    stats = tmp_path / "out" / "stats.json"
    rc = main(["generate", "def add(a, b):", "--target", str(tiny_dirs["target"]), "--draft", str(tiny_dirs["draft"]),
               "--method", "draft", "--k", "3", "--max-tokens", "12", "--dtype", "float32", "--stats-json",
               str(stats), "--compare"])
    assert rc == 0
    record = json.loads(stats.read_text())
    for key in ("method", "prompt_tokens", "completion_tokens", "finish_reason", "ttft_s", "tpot_s", "decode_tok_s",
                "e2e_s", "num_speculative_tokens", "target_forwards", "draft_tokens", "accepted_tokens",
                "acceptance_rate", "mean_accepted_length", "accepted_per_position", "draft_time_s",
                "verify_time_s", "peak_rss_mb", "baseline", "parity", "speedup"):
        assert key in record, key
    assert record["method"] == "draft" and record["baseline"]["method"] == "none"
    assert record["parity"] is True
    assert record["completion_tokens"] <= 12


def test_stdin_prompt_and_no_traceback_in_subprocess(tiny_dirs):
    env = dict(os.environ)
    ok = subprocess.run([sys.executable, "-m", "specdec.cli", "generate", "-", "--target", str(tiny_dirs["target"]),
                         "--max-tokens", "5", "--dtype", "float32", "--no-chat"],
                        input="class Cache:", capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "completion tokens" in ok.stderr
    bad = subprocess.run([sys.executable, "-m", "specdec.cli", "generate", "x", "--target", "nope"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("config, message", [
    ("{bad", "--speculative-config is not valid JSON"),
    ("[1]", "--speculative-config must be a JSON object"),
    ('{"method": "lookahead"}', "unknown speculative method 'lookahead'"),
    ('{"num_speculative_tokens": 4, "foo": 1}', "unknown key 'foo'"),
])
def test_serve_rejects_bad_speculative_config(capsys, config, message):
    rc = main(["serve", "--speculative-config", config])
    err = capsys.readouterr().err
    assert rc == 1 and message in err and err.count("\n") == 1


@pytest.mark.parametrize("args, message", [
    (["--spec-heads", "lookahead"], "'lookahead' is not a learned head method"),
    (["--speculative-config", '{"method": "ngram", "eagle_topk": 4}'], "needs a method that drafts trees"),
    (["--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 4, "eagle_topk": 2, "num_steps": 6}'],
     "num_steps"),
])
def test_serve_rejects_bad_heads_and_trees(capsys, args, message):
    rc = main(["serve", *args])
    err = capsys.readouterr().err
    assert rc == 1 and message in err and err.count("\n") == 1, err
