"""The default trained policy that ships inside the package, so the daemon and the demo work
without training first. It is reproduced by the command recorded in its metadata
(`training.command`) and in docs/benchmarks.md."""
from __future__ import annotations

from pathlib import Path

SHIPPED_DIR = Path(__file__).resolve().parent / "policies" / "lstm-ppo-default"


def shipped_policy_dir() -> Path | None:
    return SHIPPED_DIR if (SHIPPED_DIR / "metadata.json").is_file() else None
