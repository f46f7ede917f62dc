"""Small shared helpers."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from .errors import SpecDecError


def parse_json_object(text: str, flag: str) -> dict:
    """A command-line flag's JSON object, or a one-line SpecDecError naming the flag."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecDecError(f"{flag} is not valid JSON ({exc.msg}): {text}") from None
    if not isinstance(obj, dict):
        raise SpecDecError(f"{flag} must be a JSON object")
    return obj


def read_jsonl(path: Path) -> Iterator[tuple[str, object]]:
    """Each non-blank line of a JSON Lines file as ("path:line", value); a line that is not JSON is a one-line
    SpecDecError naming its place."""
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{lineno}", json.loads(line)
            except json.JSONDecodeError as exc:
                raise SpecDecError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None


# Temporary files and directories are named ".<final name>.<writer's pid>.<random>": a writer killed mid-write
# (SIGKILL, OOM, power) leaves one behind, and the next write beside the same target removes those whose writer is
# gone and that have not been touched for STALE_S (a live writer keeps its file's mtime fresh; the age also keeps a
# writer in another PID namespace, sharing the directory, from being taken for a dead one while it writes).
STALE_S = 60.0


def _temp_prefix(target: Path) -> str:
    return f".{target.name}.{os.getpid()}."


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:       # another user's live process
        return True
    return True


def sweep_stale(target: Path) -> list[Path]:
    """Remove the temporary files and directories that dead writers left beside `target`; returns them."""
    removed = []
    try:
        siblings = list(target.parent.iterdir())
    except OSError:
        return removed
    head = f".{target.name}."
    now = time.time()
    for p in siblings:
        if not p.name.startswith(head):
            continue
        pid = p.name[len(head):].split(".", 1)[0]
        try:
            if not pid.isdigit() or _pid_alive(int(pid)) or now - p.lstat().st_mtime < STALE_S:
                continue
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            removed.append(p)
        except OSError:           # gone meanwhile, or not ours to remove
            continue
    return removed


def _new_temp(target: Path, suffix: str, directory: bool) -> Path:
    """A new temporary file (or directory) beside target, created with the mode open() (or mkdir) would give, so
    the umask applies without ever being read (reading it means setting it, which races with other threads)."""
    for _ in range(100):
        tmp = target.parent / f"{_temp_prefix(target)}{secrets.token_hex(4)}{suffix}"
        try:
            if directory:
                os.mkdir(tmp, 0o777)
            else:
                os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot create a temporary file beside {target}")


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str = "") -> Iterator[Path]:
    """A temporary path beside `path` to write the file at; renamed onto `path` when the block exits normally,
    removed when it raises, so `path` is never seen half-written. The one atomic-write primitive for files: the
    writers below, plots, training checkpoints and model assembly use it.

    >>> with atomic_path("out/plot.png") as tmp:  # doctest: +SKIP
    ...     fig.savefig(tmp, format="png")
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(target)
    tmp = _new_temp(target, suffix, directory=False)
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_dir(path: str | Path, replace: bool = False) -> Iterator[Path]:
    """A temporary directory beside `path` to fill; renamed to `path` when the block exits normally (removed when
    it raises). An existing `path` is kept (another process finished first: theirs is as good) unless `replace`,
    when it is renamed aside and removed once the new one is in place."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(target)
    tmp = _new_temp(target, "", directory=True)
    try:
        yield tmp
        old = _move_aside(target) if replace else None
        try:
            os.rename(tmp, target)
        except OSError:
            if replace or not target.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _move_aside(target: Path) -> Path | None:
    """Rename `target` to a fresh temporary name beside it (one `sweep_stale` removes if its remover is killed);
    None when there is nothing there."""
    aside = _new_temp(target, ".old", directory=True)
    os.rmdir(aside)
    try:
        os.rename(target, aside)
    except FileNotFoundError:
        return None
    return aside


def remove_tree(path: str | Path) -> None:
    """Remove a directory (a cache entry) so that nothing ever sees it half-removed: renamed away first, then
    deleted."""
    aside = _move_aside(Path(path))
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def set_aside(path: str | Path) -> Path:
    """Move a damaged file (or directory) out of the way as `<path>.damaged` (replacing an older one), so that the
    next start begins fresh while the bytes stay for whoever wants to look; returns the new path."""
    path = Path(path)
    aside = path.with_name(path.name + ".damaged")
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside, ignore_errors=True)
    os.replace(path, aside)
    return aside


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=2))


def save_torch_atomic(obj, path: str | Path) -> None:
    """torch.save(obj, path), atomically."""
    import torch

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def progress_bar(iterable, desc: str, enabled: bool = True):
    """tqdm over `iterable` on stderr when enabled (and tqdm is installed), else the iterable itself."""
    if not enabled:
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, desc=desc, dynamic_ncols=True)
