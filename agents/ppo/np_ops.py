"""Matrix products for the NumPy code paths of training.

NumPy's bundled OpenBLAS runs a product on several threads once it has 16 rows or so; on a
2-core machine shared with the JVM that costs ~20 times a single-threaded product (350 µs
instead of 17 µs for 16 × 128 × 512). PyTorch's product obeys `torch.set_num_threads`, and
`from_numpy`/`numpy()` share memory, so products go through it.
"""
from __future__ import annotations

import numpy as np
import torch


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return torch.mm(torch.from_numpy(a), torch.from_numpy(b)).numpy()
