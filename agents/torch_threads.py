"""torch's intra-op thread count for a block of work, the caller's count restored after.

Trainers and evaluators pin torch to a few threads (results on 2 cores, and a service that must
not oversubscribe its host), but torch's count is process-wide: without a restore, a notebook or
a service that trained, then served, ran on the trainer's count."""
from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def torch_threads(n: int):
    """Context: torch on `n` intra-op threads; the caller's count is back after, also on error."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
