"""The code passes ruff (config: pyproject.toml's [tool.ruff]; ruff is pinned in the `test` extra)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_check_passes():
    ruff = Path(sys.executable).with_name("ruff")        # installed beside this interpreter by `pip install .[test]`
    if not ruff.is_file():
        pytest.fail(f"ruff is not installed beside {sys.executable}: pip install -e '.[test]'")
    out = subprocess.run([str(ruff), "check", "--no-cache", "--output-format", "concise", "specdec", "tests", "tools",
                          "examples"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"ruff check found problems:\n{out.stdout}{out.stderr}"
