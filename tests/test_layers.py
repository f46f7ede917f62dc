"""specdec's import layers (tools/check_imports.py): the package passes, and the checker catches what it must."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tools" / "check_imports.py"


def _checker():
    spec = importlib.util.spec_from_file_location("check_imports", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_specdec_has_no_cycle_and_no_upward_import():
    problems = _checker().check(REPO / "specdec")
    assert problems == [], "\n".join(problems)


def test_script_exits_zero_on_specdec():
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "fakepkg"


FAKE = {
    "fakepkg/__init__.py": "",
    "fakepkg/low.py": "from __future__ import annotations\n\n\ndef f():\n    from .high import x\n    return x\n",
    "fakepkg/typed.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from fakepkg.high import x\n",
    "fakepkg/mid/__init__.py": "",
    "fakepkg/mid/a.py": "from .b import y\n",
    "fakepkg/mid/b.py": "import fakepkg.mid.a\n\ny = 1\n",
    "fakepkg/high.py": "from . import typed\n\nx = 1\n\n\nclass C:\n    def f(self, other):\n"
                       "        return self._own, other._own, typed._hidden.value\n\n    _own = 1\n",
    "fakepkg/stray.py": "",
}
LAYERS = [("fakepkg.low", "fakepkg.typed"), ("fakepkg.mid",), ("fakepkg.high",), ("fakepkg",)]


def test_checker_reports_cycle_upward_lazy_import_unplaced_module_and_private_read(tmp_path):
    checker = _checker()
    problems = checker.check(_write(tmp_path, FAKE), LAYERS, {})
    text = "\n".join(problems)
    assert len(problems) == 4, text
    assert any(p.startswith("fakepkg/high.py:8: private attribute of another module's object: typed._hidden")
               for p in problems), text            # self._own and other._own (defined here) pass
    assert any(p.startswith("import cycle: fakepkg.mid.a -> fakepkg.mid.b -> fakepkg.mid.a") for p in problems), text
    assert any(p.startswith("fakepkg/low.py:5: upward import (in a function): fakepkg.low") for p in problems), text
    assert any("fakepkg.stray is in no layer" in p for p in problems), text
    assert "imports fakepkg.typed" not in text and "typed.py" not in text   # TYPE_CHECKING-guarded and downward pass


def test_allowed_exception_silences_one_import_and_goes_stale(tmp_path):
    checker = _checker()
    pkg = _write(tmp_path, FAKE)
    allowed = {("fakepkg.low", "fakepkg.high"): "a plugin hook"}
    problems = checker.check(pkg, LAYERS, allowed)
    assert not any("upward" in p for p in problems), problems
    (pkg / "low.py").write_text("")
    problems = checker.check(pkg, LAYERS, allowed)
    assert any(p.startswith("stale exception in ALLOWED: fakepkg.low") for p in problems), problems
