"""What every trainer shares about its output folder: TensorBoard when the package is installed
(optional), and the refusal to start a fresh run over an earlier one."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable


class TrainingDiverged(ValueError):
    """A trainer stopped on a NaN or inf before saving anything: a failure of the work (exit 1),
    not of its usage (exit 2). A ValueError, so callers that only knew that still catch it."""


def tensorboard_writer(out):
    """A SummaryWriter writing to `<out>/tb`, or None without an output folder or TensorBoard."""
    if out is None:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:  # tensorboard is optional
        return None
    return SummaryWriter(str(Path(out) / "tb"))


def refuse_existing_run(out: Path, run_files: Iterable[str], also: Iterable[Path] = (),
                        hint: str = "choose another --out or remove it") -> None:
    """A fresh run into the folder of an earlier one would overwrite its policy and mix its logs
    (appended CSV rows, TensorBoard events, an old best policy beside the new one): refused,
    naming the first file found. `also`: other paths that mark a run (a log kept elsewhere)."""
    out = Path(out)
    found = [out / n for n in run_files if (out / n).exists()] + [p for p in also if p.exists()]
    if found:
        raise ValueError(f"{found[0]} exists: {out} already holds a training run; {hint}")


def first_non_finite(module) -> str | None:
    """The name of a module's first parameter holding NaN or inf, else None: a diverged network
    must stop a run before it is saved (it would decide by garbage)."""
    import torch

    return next((name for name, p in module.named_parameters() if not torch.isfinite(p).all()), None)
