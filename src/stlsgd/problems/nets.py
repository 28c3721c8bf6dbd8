"""The networks of the paper's non-convex experiments (Section 5), in plain ``torch.nn``.

- :class:`ResNet18`: He et al. (2016) in the CIFAR-10 form used by the paper's code base lineage -- a 3x3
  stem of stride 1 and no max-pool, four stages of two BasicBlocks (64, 128, 256, 512 channels), global
  average pooling and one linear layer; 11,173,962 parameters for 3x32x32 inputs and 10 classes.
- :class:`VGG16`: Simonyan & Zisserman (2014) configuration D with batch norm after every convolution and
  one linear classifier (the CIFAR-10 form); 14,728,266 parameters.
- :class:`SmallCNN`: two strided conv-BN-ReLU layers and a linear layer, for the CPU-scale runs on MNIST.

Every model normalises with :class:`torch.nn.BatchNorm2d` only, so the vectorised clients of
:mod:`stlsgd.problems.neural` can recompute each BN layer's batch statistics and keep the running ones
per client. No torchvision: these definitions are a few lines each and the CIFAR forms differ from
torchvision's ImageNet ones anyway.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

ModelName = Literal["cnn", "resnet18", "vgg16"]


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with an identity (or 1x1 conv-BN projection) shortcut."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet18 for 32x32 images: 3x3 stem, no max-pool, [2, 2, 2, 2] BasicBlocks."""

    def __init__(self, in_channels: int = 3, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers: list[nn.Module] = []
        in_planes = 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(BasicBlock(in_planes, planes, stride), BasicBlock(planes, planes, 1)))
            in_planes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.linear = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        # Global average pooling: 4x4 for CIFAR's 32x32, and still defined for other sizes.
        out = out.mean(dim=(-2, -1))
        return self.linear(out)


_VGG16_CFG: tuple[int | str, ...] = (
    64,
    64,
    "M",
    128,
    128,
    "M",
    256,
    256,
    256,
    "M",
    512,
    512,
    512,
    "M",
    512,
    512,
    512,
    "M",
)


class VGG16(nn.Module):
    """VGG16 (configuration D) with batch norm, CIFAR form: 13 conv-BN-ReLU layers, 5 max-pools, one linear."""

    def __init__(self, in_channels: int = 3, num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for v in _VGG16_CFG:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(channels, int(v), 3, padding=1), nn.BatchNorm2d(int(v)), nn.ReLU()]
                channels = int(v)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.features(x)
        return self.classifier(out.mean(dim=(-2, -1)))


class SmallCNN(nn.Module):
    """Two strided conv-BN-ReLU layers and a linear layer: the CPU-scale stand-in for ResNet18/VGG16.

    conv(width, 5x5, stride 2)-BN-ReLU, conv(2 width, 3x3, stride 2)-BN-ReLU, linear; 9,250 parameters for
    28x28 MNIST at the default ``width = 8``. Strided convolutions replace conv + max-pool because the
    vmap'd clients of :mod:`stlsgd.problems.neural` spend most of a CPU step in full-resolution convolutions
    and their pooling backward: this form runs one step of 8 clients x 64 MNIST images about ten times faster
    than a 16/32-channel conv-pool net on two cores, which is what lets the CPU-scale Table 3 finish.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28, width: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 5, stride=2, padding=2, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
        )
        # Both convolutions map a side of n to ceil(n / 2).
        side = (((image_size + 1) // 2) + 1) // 2
        self.classifier = nn.Linear(2 * width * side * side, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


def make_model(name: ModelName, in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    """The named network for images of ``in_channels`` x ``image_size`` x ``image_size``."""
    if name == "resnet18":
        return ResNet18(in_channels, num_classes)
    if name == "vgg16":
        if image_size < 32:
            raise ValueError(f"vgg16 needs images of at least 32x32 (five 2x2 max-pools), got {image_size}")
        return VGG16(in_channels, num_classes)
    if name == "cnn":
        return SmallCNN(in_channels, num_classes, image_size)
    raise ValueError(f"unknown model {name!r}; known: cnn, resnet18, vgg16")


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
