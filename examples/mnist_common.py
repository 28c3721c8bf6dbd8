"""What the adapter examples share: a small CNN with BatchNorm and MNIST (or synthetic digits without it).

MNIST comes from stlsgd's reader (``stlsgd.data.load_dataset("mnist10", data_dir)``) when ``data_dir`` holds
``mnist/*-ubyte.gz``; the default data dir is ``$STLSGD_DATA`` or ``../shared/data`` beside the repository.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

DEFAULT_DATA = os.environ.get("STLSGD_DATA") or str(Path(__file__).resolve().parents[2] / "shared" / "data")


class SmallCNN(nn.Module):
    """Two conv-BN-ReLU-pool blocks and a linear layer: 28x28 -> 10 classes."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(2 * width * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


def load_images(data_dir: str | None, n: int) -> tuple[torch.Tensor, torch.Tensor, str]:
    """The first ``n`` MNIST training images, or synthetic digits (class templates + noise) without data."""
    if data_dir and (Path(data_dir) / "mnist").is_dir():
        from stlsgd.data import load_dataset

        ds = load_dataset("mnist10", data_dir)
        return torch.from_numpy(ds.X[:n]), torch.from_numpy(ds.y[:n]), "MNIST"
    rng = np.random.default_rng(0)
    templates = rng.random((10, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, size=n)
    X = templates[y] + 0.5 * rng.standard_normal((n, 1, 28, 28), dtype=np.float32)
    return torch.from_numpy(X), torch.from_numpy(y), "synthetic"


def accuracy(model: nn.Module, X: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return float((model(X).argmax(1) == y).float().mean())
