"""The CPU allocator specdec._C installs (csrc/cpu_allocator.cpp): freed blocks come back for the next request of
their size class, classes cover every size with at most a quarter to spare, large blocks and blocks past the cap go
back to the system, tensors stay correct under it, and a bad SPECDEC_CPU_ALLOCATOR is refused."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from specdec.errors import SpecDecError
from specdec.models.quantization import kernels

ext = pytest.importorskip("specdec._C", reason="specdec._C not built (needs a C++ compiler at install)")


def test_importing_the_kernels_installs_it():
    assert kernels.extension() is not None
    assert ext.use_reusing_cpu_allocator()          # already installed: installing again is harmless


def test_a_freed_block_serves_the_next_request_of_its_class():
    kernels.extension()
    a = torch.empty(3000, dtype=torch.uint8)       # class of 3,072 bytes
    ptr = a.data_ptr()
    a.fill_(7)
    kept = ext.cpu_allocator_kept_bytes()
    del a
    assert ext.cpu_allocator_kept_bytes() == kept + 3072
    b = torch.empty(2900, dtype=torch.uint8)       # another size, same class: the same block
    assert b.data_ptr() == ptr
    assert ext.cpu_allocator_kept_bytes() == kept
    assert b.data_ptr() % 64 == 0                  # aligned as PyTorch's own allocator aligns


def test_size_classes_cover_every_size_with_at_most_a_quarter_spare():
    last_cls, last_bytes = -1, 0
    for n in sorted(list(range(0, 5000, 7)) + [2 ** e + d for e in range(12, 25) for d in (-1, 0, 1)] + [32 << 20]):
        cls, size = ext.cpu_allocator_size_class(n)
        assert size >= n and (n <= 256 or size <= n * 1.25 + 1)
        if n > 256:
            assert cls >= last_cls and size >= last_bytes   # the classes grow with the size
        last_cls, last_bytes = cls, size
    assert ext.cpu_allocator_size_class((32 << 20) + 1) == (-1, (32 << 20) + 1)   # past the largest class


def test_blocks_past_the_largest_class_go_back_to_the_system():
    kernels.extension()
    kept = ext.cpu_allocator_kept_bytes()
    big = torch.empty((33 << 20) // 4, dtype=torch.float32)
    del big
    assert ext.cpu_allocator_kept_bytes() == kept


def test_tensors_compute_the_same_under_it():
    kernels.extension()
    g = torch.Generator().manual_seed(0)
    for _ in range(3):                              # blocks freed by one round serve the next
        x = torch.randn(64, 96, generator=g)
        w = torch.randn(96, 80, generator=g)
        y = x @ w
        ref = torch.tensor([[sum(float(x[i, k]) * float(w[k, j]) for k in range(96)) for j in range(3)]
                            for i in range(3)])
        assert torch.allclose(y[:3, :3], ref, atol=1e-4)
        s = torch.cat([y, y.flip(0)]).sum(0)
        assert torch.allclose(s, 2 * y.sum(0), atol=1e-3)


def test_a_bad_choice_is_refused_and_system_keeps_pytorchs(monkeypatch):
    monkeypatch.setenv("SPECDEC_CPU_ALLOCATOR", "fast")
    with pytest.raises(SpecDecError, match="SPECDEC_CPU_ALLOCATOR"):
        kernels.use_cpu_allocator(ext)
    # a fresh process with system: nothing is kept, blocks go back to glibc
    code = ("import torch; from specdec.models.quantization import kernels; e = kernels.extension(); "
            "a = torch.empty(5000); del a; print(e.cpu_allocator_kept_bytes())")
    env = {**os.environ, "SPECDEC_CPU_ALLOCATOR": "system"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"


def test_blocks_allocated_before_it_was_installed_are_freed_by_their_own():
    # oneDNN's buffers (a packed weight, an mkldnn tensor) free through the current CPU allocator's raw deleter: one
    # made before the switch must go back to the default allocator, not be read as one of this one's blocks (it
    # crashed the interpreter's exit once)
    code = ("import torch\n"
            "w = torch.randn(64, 64).to_mkldnn()\n"
            "lin = torch.nn.Linear(64, 64)\n"
            "packed = torch.ops.mkldnn._reorder_linear_weight(lin.weight.detach()) "
            "if hasattr(torch.ops.mkldnn, '_reorder_linear_weight') else None\n"
            "from specdec.models.quantization import kernels\n"
            "assert kernels.extension().use_reusing_cpu_allocator()\n"
            "y = (w.to_dense() @ torch.eye(64)).sum()\n"
            "del w, packed\n"
            "import gc; gc.collect()\n"
            "print(float(y) != 0.0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "True"
