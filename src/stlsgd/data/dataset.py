"""The in-memory dataset type shared by every problem and executor."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True)
class Dataset:
    """Features and labels of one dataset.

    Binary sets: ``X`` is CSR float64 (n, d) and ``y`` float64 in {-1, +1}, ``num_classes == 2``.
    Image sets: ``X`` is float32 (n, C, H, W) and ``y`` int64 class ids 0..K-1.
    """

    name: str
    X: sp.csr_matrix | np.ndarray
    y: np.ndarray
    num_classes: int

    def __post_init__(self) -> None:
        # Catch shape mix-ups at construction, not deep inside a training loop.
        if self.X.shape[0] != self.y.shape[0]:
            raise ValueError(f"{self.name}: X has {self.X.shape[0]} rows but y has {self.y.shape[0]}")

    @property
    def n(self) -> int:
        """Number of rows."""
        return int(self.X.shape[0])

    @property
    def d(self) -> int:
        """Number of features per row (C*H*W for image sets)."""
        return int(np.prod(self.X.shape[1:]))
