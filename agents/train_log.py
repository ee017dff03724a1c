"""Training logs every trainer shares: TensorBoard when the package is installed (optional)."""
from __future__ import annotations

from pathlib import Path


def tensorboard_writer(out):
    """A SummaryWriter writing to `<out>/tb`, or None without an output folder or TensorBoard."""
    if out is None:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:  # tensorboard is optional
        return None
    return SummaryWriter(str(Path(out) / "tb"))
