"""What a stopped `specdec train-head` run keeps for --resume: the regenerated answers and the features (the run's
slow first hour on a CPU), each saved atomically beside the output as OUT.<what>.pt with the key it was made for,
and removed when the run ends."""
from __future__ import annotations

import contextlib
import os

import torch

from ..utils import save_torch_atomic


class RunCache:
    def __init__(self, out: str, resume: bool):
        self.out, self.resume = out.rstrip("/"), resume

    def path(self, what: str) -> str:
        return f"{self.out}.{what}.pt"

    def cached(self, what: str, key: dict, make):
        """make()'s result, saved to OUT.<what>.pt; with --resume and the same key, what that file holds instead."""
        path = self.path(what)
        if self.resume and os.path.isfile(path):
            saved = torch.load(path, weights_only=False)        # tensors back on the devices they were saved from
            if saved["key"] == key:
                return saved["value"]
        value = make()
        save_torch_atomic({"key": key, "value": value}, path)
        return value

    def remove(self, *whats: str) -> None:
        for what in whats:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(what))
