"""MobileNetV2 (Sandler et al., 2018) with the module names of torchvision's implementation,
so that its ImageNet state dict loads with ``strict=True`` (torchvision itself is not needed:
PyPI's wheel is a CUDA build).

features: a 3x3 stride-2 stem (32), 17 inverted residual blocks, a 1x1 conv to 1280; then
global average pooling, dropout and a linear classifier. Every conv is followed by batch norm;
ReLU6 after all but each block's last (linear bottleneck) projection.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["MobileNetV2", "mobilenet_v2"]

# expansion t, output channels c, repeats n, first stride s (the paper's Table 2)
_SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
            (6, 160, 3, 2), (6, 320, 1, 1))  # fmt: skip


def _conv_bn_relu6(inp: int, out: int, kernel: int, stride: int, groups: int = 1) -> nn.Module:
    """Conv -> BatchNorm -> ReLU6 (torchvision's ``Conv2dNormActivation`` names: 0, 1, 2)."""
    padding = (kernel - 1) // 2
    return nn.Sequential(
        nn.Conv2d(inp, out, kernel, stride, padding, groups=groups, bias=False),
        nn.BatchNorm2d(out),
        nn.ReLU6(inplace=True),
    )


class _InvertedResidual(nn.Module):
    """1x1 expansion (unless t = 1) -> 3x3 depthwise -> 1x1 linear projection, with a skip
    connection when the shape is unchanged."""

    def __init__(self, inp: int, out: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = inp * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(_conv_bn_relu6(inp, hidden, 1, 1))
        layers += [
            _conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
            nn.Conv2d(hidden, out, 1, 1, 0, bias=False),
            nn.BatchNorm2d(out),
        ]
        self.conv = nn.Sequential(*layers)
        self.use_res_connect = stride == 1 and inp == out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.conv(x)
        return x + y if self.use_res_connect else y


class MobileNetV2(nn.Module):
    """MobileNetV2 at width 1.0: images [N, 3, H, W] -> logits [N, num_classes]."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.2) -> None:
        super().__init__()
        channels, last = 32, 1280
        layers: list[nn.Module] = [_conv_bn_relu6(3, channels, 3, 2)]
        for expand, out, repeats, stride in _SETTING:
            for i in range(repeats):
                layers.append(_InvertedResidual(channels, out, stride if i == 0 else 1, expand))
                channels = out
        layers.append(_conv_bn_relu6(channels, last, 1, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(p=dropout), nn.Linear(last, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)  # [N, 1280]
        logits: torch.Tensor = self.classifier(x)
        return logits


def mobilenet_v2(*args: Any) -> MobileNetV2:
    """The recipe factory: ``MobileNetV2(*args)`` in eval mode (weights loaded by the builder)."""
    return MobileNetV2(*args).eval()
