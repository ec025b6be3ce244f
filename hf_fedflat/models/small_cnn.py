"""The small CNN of the FedAvg / FedGAM MNIST and CIFAR experiments.

McMahan et al. (2017), "Communication-Efficient Learning of Deep Networks from Decentralized
Data", describe it as two 5x5 convolutions (32 then 64 channels), each followed by ReLU and 2x2
max pooling, a fully connected layer with 512 units and ReLU, and a linear output layer. With
"same" padding on 28x28 MNIST digits it has exactly 1,663,370 parameters; on 32x32 inputs the
flattened feature map is 64 x 8 x 8 and the model has about 2.16M parameters.

It contains no normalisation layer at all, so it has no running statistics (BatchNorm buffers)
that a federated server would have to average or keep local.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from ..field_checks import ConfigError

__all__ = ["SmallCNN"]


def _pooled_size(size: int, num_pools: int) -> int:
    """Spatial size after ``num_pools`` 2x2/stride-2 max-pools (floor division, as PyTorch)."""
    for _ in range(num_pools):
        size //= 2
    return size


class SmallCNN(nn.Module):
    """Two conv(5x5)+ReLU+maxpool(2) blocks followed by two fully connected layers.

    The convolutions use "same" padding, so only the max-pools shrink the image and the size of
    the first fully connected layer follows from ``image_size`` alone.

    Args:
        num_classes: Number of output logits.
        in_chans: Number of input channels (1 for MNIST/FEMNIST, 3 for CIFAR).
        image_size: Height and width of the (square) input images.
        conv_channels: Output channels of the two convolutions (FedAvg: 32, 64).
        hidden_dim: Width of the hidden fully connected layer (FedAvg: 512).
        kernel_size: Convolution kernel size (odd; FedAvg: 5).
        dropout: Dropout probability before each fully connected layer (0 disables it, as in
            FedAvg).

    Raises:
        ValueError: If the arguments give an empty feature map or an even kernel size.
    """

    def __init__(
        self,
        num_classes: int,
        in_chans: int = 1,
        image_size: int = 28,
        conv_channels: Sequence[int] = (32, 64),
        hidden_dim: int = 512,
        kernel_size: int = 5,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        conv_channels = tuple(int(c) for c in conv_channels)
        if len(conv_channels) != 2:
            raise ConfigError(f"conv_channels must have two entries, got {conv_channels!r}")
        if kernel_size % 2 != 1:
            raise ConfigError(f"kernel_size must be odd to keep 'same' padding, got {kernel_size}")
        feat = _pooled_size(int(image_size), 2)
        if feat < 1:
            raise ConfigError(f"image_size={image_size} is too small for two 2x2 max-pools")

        self.num_classes = int(num_classes)
        self.in_chans = int(in_chans)
        pad = kernel_size // 2
        c1, c2 = conv_channels
        self.conv1 = nn.Conv2d(in_chans, c1, kernel_size, padding=pad)
        self.conv2 = nn.Conv2d(c1, c2, kernel_size, padding=pad)
        self.act = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(2)
        self.drop = nn.Dropout(dropout)
        self.fc1 = nn.Linear(c2 * feat * feat, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Return the flattened output of the two conv blocks, shape ``(B, c2 * s * s)``."""
        x = self.pool(self.act(self.conv1(x)))
        x = self.pool(self.act(self.conv2(x)))
        return torch.flatten(x, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map images ``(B, in_chans, H, W)`` to logits ``(B, num_classes)``."""
        x = self.forward_features(x)
        x = self.act(self.fc1(self.drop(x)))
        return self.fc2(self.drop(x))
