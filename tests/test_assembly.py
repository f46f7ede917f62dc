"""GGUF assembly from part packages: verified, atomic, nothing half-written."""
import hashlib

import pytest

from specdec.errors import SpecDecError
from specdec.models import registry
from specdec.models.registry import BuiltinModel, assemble, assembled_path, is_assembled


@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
    """Three importable part packages `fakemodelpartN` whose data concatenate to a known blob."""
    blobs = [bytes([i]) * (1000 + i) for i in range(1, 4)]
    for i, blob in enumerate(blobs, 1):
        pkg = tmp_path / "site" / f"fakemodelpart{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(blob)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    whole = b"".join(blobs)
    return whole


def _model(whole, sha=None):
    return BuiltinModel("fake", "fake model", "fakemodelpart", 3, "fake.gguf", len(whole),
                        sha or hashlib.sha256(whole).hexdigest())


def test_assembles_and_verifies(fake_parts):
    m = _model(fake_parts)
    path = assemble(m, progress=False)
    assert path.read_bytes() == fake_parts
    assert is_assembled(m)
    assert list(path.parent.iterdir()) == [path]     # no temporary files left


def test_wrong_sha_leaves_no_file(fake_parts):
    m = _model(fake_parts, sha="0" * 64)
    with pytest.raises(SpecDecError, match="sha256 mismatch"):
        assemble(m, progress=False)
    dest = assembled_path(m)
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []


def test_interrupted_write_leaves_no_file(fake_parts, monkeypatch):
    m = _model(fake_parts)
    real_sha = hashlib.sha256
    calls = {"n": 0}

    class Exploding:
        def __init__(self):
            self.h = real_sha()

        def update(self, chunk):
            calls["n"] += 1
            if calls["n"] == 2:
                raise KeyboardInterrupt  # the user pressed Ctrl-C mid-assembly
            self.h.update(chunk)

        def hexdigest(self):
            return self.h.hexdigest()

    monkeypatch.setattr(registry.hashlib, "sha256", Exploding)
    with pytest.raises(KeyboardInterrupt):
        assemble(m, progress=False)
    dest = assembled_path(m)
    assert not dest.exists() and list(dest.parent.iterdir()) == []
    monkeypatch.setattr(registry.hashlib, "sha256", real_sha)
    assert assemble(m, progress=False).read_bytes() == fake_parts


def test_missing_parts_named(fake_parts, monkeypatch):
    m = BuiltinModel("fake", "x", "fakemodelpart", 5, "fake.gguf", 1, "0" * 64)
    with pytest.raises(SpecDecError, match="fakemodelpart4, fakemodelpart5"):
        assemble(m, progress=False)
