"""EngineArgs: one config object, built from Python or from either command's flags, validated in one place."""
import pytest

from specdec import LLM, EngineArgs, SpecDecError, SpeculativeConfig
from specdec.cli import build_parser
from specdec.policy import PolicyConfig


def _serve(*argv):
    return build_parser().parse_args(["serve", *argv])


def test_from_serve_flags_carries_every_engine_setting():
    args = EngineArgs.from_cli_args(_serve(
        "--target", "t.gguf", "--draft", "d.gguf", "--dtype", "float32", "--max-model-len", "4096", "--threads", "3",
        "--quantization", "int8", "--head-quantization", "none", "--spec-heads", "eagle3,medusa=/heads/m",
        "--max-num-seqs", "4", "--max-num-batched-tokens", "256", "--max-total-tokens", "9000",
        "--itl-target-ms", "0", "--spec-max-load", "2", "--spec-min-acceptance", "0.3",
        "--speculative-config", '{"method": "auto", "num_speculative_tokens": 6}'))
    assert (args.target, args.draft, args.dtype, args.max_model_len, args.num_threads) == \
        ("t.gguf", "d.gguf", "float32", 4096, 3)
    assert (args.quantization, args.head_quantization) == ("int8", "none")
    assert args.heads == {"eagle3": None, "medusa": "/heads/m"}
    assert args.speculative.method == "auto" and args.speculative.model == "d.gguf"
    assert (args.scheduler.max_num_seqs, args.scheduler.max_num_batched_tokens, args.scheduler.max_total_tokens,
            args.scheduler.itl_target_s) == (4, 256, 9000, None)
    assert (args.policy_config.k_max, args.policy_config.max_load, args.policy_config.min_acceptance) == (6, 2, 0.3)


def test_from_serve_flags_defaults():
    args = EngineArgs.from_cli_args(_serve())
    assert args.speculative.method == "auto" and args.draft is None and args.heads is None
    assert EngineArgs.from_cli_args(_serve("--spec-heads", "none")).heads == {}
    assert args.scheduler.itl_target_s == pytest.approx(0.8)
    assert args.enable_prefix_caching is True
    assert EngineArgs.from_cli_args(_serve("--no-enable-prefix-caching")).enable_prefix_caching is False
    # a fixed method keeps no policy of its own; the draft flag only feeds methods that use a draft
    fixed = EngineArgs.from_cli_args(_serve("--draft", "d.gguf", "--speculative-config", '{"method": "ngram"}'))
    assert fixed.policy is None and fixed.draft is None and fixed.speculative.method == "ngram"


def test_default_heads_are_the_shipped_ones_under_a_policy():
    """No heads named: auto gets the heads shipped for the target (the default target ships EAGLE-3 and Medusa); a
    fixed method (hybrid's pair included) or a target with none shipped gets none."""
    from specdec.loading import default_heads
    from specdec.models.registry import DEFAULT_TARGET

    assert default_heads("auto", DEFAULT_TARGET) == {"eagle3": None, "medusa": None}
    assert default_heads("hybrid", DEFAULT_TARGET) == {}
    assert default_heads("draft", DEFAULT_TARGET) == {}
    assert default_heads("auto", "my-own-model") == {}


def test_from_generate_flags():
    ns = build_parser().parse_args(["generate", "hi", "--method", "ngram", "--k", "5", "--prompt-lookup-max", "3",
                                    "--threads", "1"])
    args = EngineArgs.from_cli_args(ns)
    assert (args.speculative.method, args.speculative.num_speculative_tokens, args.speculative.prompt_lookup_max) \
        == ("ngram", 5, 3)
    assert args.num_threads == 1 and args.policy is None
    bad = build_parser().parse_args(["generate", "hi", "--method", "ngram", "--k", "99"])
    with pytest.raises(SpecDecError, match="num_speculative_tokens must be in 1..32"):
        EngineArgs.from_cli_args(bad)


def test_draft_p_min_from_each_command():
    """llama.cpp's --draft-p-min: generate's flag, serve's --speculative-config key; left out, the default."""
    assert EngineArgs.from_cli_args(_serve()).speculative.draft_p_min == 0.75
    assert EngineArgs.from_cli_args(_serve("--speculative-config", '{"method": "draft", "draft_p_min": 0.5}')
                                    ).speculative.draft_p_min == 0.5
    gen = build_parser().parse_args(["generate", "hi", "--method", "draft", "--draft-p-min", "0"])
    assert EngineArgs.from_cli_args(gen).speculative.draft_p_min == 0.0
    for bad in ("1", "-0.1"):
        ns = build_parser().parse_args(["generate", "hi", "--method", "draft", "--draft-p-min", bad])
        with pytest.raises(SpecDecError, match="draft_p_min must be a probability in"):
            EngineArgs.from_cli_args(ns)
    with pytest.raises(SpecDecError, match="draft_p_min must be a probability in"):
        EngineArgs.from_cli_args(_serve("--speculative-config", '{"draft_p_min": "high"}'))


@pytest.mark.parametrize("kwargs, message", [
    ({"dtype": "int3"}, "unknown dtype 'int3'"),
    ({"quantization": "int2"}, "unknown quantization 'int2'"),
    ({"head_quantization": "fp8"}, "unknown head_quantization 'fp8'"),
    ({"heads": {"lookahead": None}}, "'lookahead' is not a learned head method"),
    ({"num_threads": 0}, "num_threads must be >= 1"),
    ({"max_model_len": 1}, "max_model_len must be >= 2"),
    ({"speculative": 4}, "speculative must be a SpeculativeConfig or a method name, got int"),
])
def test_bad_values_fail_before_anything_loads(kwargs, message):
    with pytest.raises(SpecDecError, match=message):
        EngineArgs(target="/nonexistent.gguf", **kwargs)
    with pytest.raises(SpecDecError, match=message):           # LLM(**kwargs) builds the same object first
        LLM(target="/nonexistent.gguf", **kwargs)


def test_serve_flags_fail_one_line(capsys):
    from specdec.cli import main

    rc = main(["serve", "--max-num-seqs", "8", "--max-num-batched-tokens", "4"])
    err = capsys.readouterr().err
    assert rc == 1 and "max_num_batched_tokens (4) must be >= max_num_seqs (8)" in err and err.count("\n") == 1


def test_llm_takes_args_or_fields_not_both(tiny_dirs):
    args = EngineArgs(target=str(tiny_dirs["target"]), dtype="float32", progress=False,
                      speculative=SpeculativeConfig(method="ngram"), policy=PolicyConfig(k_max=3))
    with pytest.raises(SpecDecError, match="not both"):
        LLM(args, dtype="float32")
    with pytest.raises(SpecDecError, match="unexpected keyword argument 'modle'"):
        LLM(modle="x")
    llm = LLM(args)
    assert llm.args is args and llm.speculative.method == "ngram" and llm.draft is None
    assert llm.engine.row_cost is None                       # no learned head: nothing sizes a token tree
    assert args.policy_config.k_max == 3
    # the default draft flag: method draft when a draft is named
    assert EngineArgs(draft=str(tiny_dirs["draft"])).speculative.method == "draft"


def test_a_method_name_is_a_speculative_config():
    assert EngineArgs(target="/nonexistent.gguf", speculative="auto").speculative.method == "auto"
