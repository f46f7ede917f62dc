"""`specdec bench` subcommands: what was `bench decode` is `bench offline` now (one A/B path, one report)."""
from specdec.cli import main


def test_bench_decode_is_folded_into_offline(capsys):
    import pytest

    with pytest.raises(SystemExit) as exc:
        main(["bench", "decode", "--methods", "none"])
    assert exc.value.code == 2 and "invalid choice: 'decode'" in capsys.readouterr().err


def test_bench_rejects_unknown_method(capsys):
    rc = main(["bench", "offline", "--methods", "none,medusa"])
    assert rc != 0 and "unknown method 'medusa'" in capsys.readouterr().err
