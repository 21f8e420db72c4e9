"""How an image package resizes and normalizes pictures (``ImageSpec``): from a recipe's
table or a Hugging Face ``preprocessor_config.json``.

Every form ends as one ``ImageSpec`` in the manifest, so the device repeats exactly what the
export's gate measured (``runtime/pictures.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgeinfer.errors import ConfigError
from edgeinfer.package_io import ImageSpec

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "spec_from_processor",
    "spec_from_table",
]

# ImageNet's channel statistics on 0-255 values (torchvision's, most image models').
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)
# Pillow's resampling codes, as image processor configs store them.
_RESAMPLE = {1: "lanczos", 2: "bilinear", 3: "bicubic"}
_RESIZE_MODES = ("crop", "stretch", "shorter-side")
_FILTERS = ("bilinear", "bicubic", "lanczos")


def spec_from_table(
    table: dict[str, Any],
    *,
    height: int,
    width: int,
    resize_modes: tuple[str, ...] = _RESIZE_MODES,
) -> ImageSpec:
    """An ``ImageSpec`` from a recipe's table (or ``--preprocess`` settings): ``mean``/``std``
    (0-255 values, the graph's channel order; default ImageNet's), ``color``, ``resize``,
    ``shorter_side``, ``interpolation``, ``pad``."""
    resize = str(table.get("resize", "crop"))
    interpolation = str(table.get("interpolation", "bilinear"))
    color = str(table.get("color", "RGB"))
    pad = str(table.get("pad", "center"))
    if (
        resize not in resize_modes
        or interpolation not in _FILTERS
        or color not in ("RGB", "BGR")
        or pad not in ("center", "top-left")
    ):
        raise ConfigError(
            f"image settings resize={resize!r}, interpolation={interpolation!r}, color={color!r},"
            f" pad={pad!r}: use resize {resize_modes}, interpolation {_FILTERS}, color RGB or "
            "BGR, pad center or top-left"
        )

    shorter = table.get("shorter_side")
    return ImageSpec(
        height=height,
        width=width,
        mean=tuple(float(v) for v in table.get("mean", IMAGENET_MEAN)),
        std=tuple(float(v) for v in table.get("std", IMAGENET_STD)),
        color=color,  # type: ignore[arg-type]  # checked above
        resize=resize,  # type: ignore[arg-type]
        shorter_side=int(shorter) if shorter else None,
        interpolation=interpolation,  # type: ignore[arg-type]
        pad=pad,  # type: ignore[arg-type]
    )


def _size(value: Any) -> tuple[int, int] | None:
    if isinstance(value, dict) and "height" in value and "width" in value:
        return int(value["height"]), int(value["width"])
    if isinstance(value, int):
        return value, value
    return None


def spec_from_processor(path: Path) -> ImageSpec:
    """An ``ImageSpec`` from a Hugging Face ``preprocessor_config.json`` (ViT: resize to a
    fixed size; ConvNeXt: shortest edge / crop_pct, then center crop; MobileNet: shortest edge,
    then center crop), with rescaling folded into ``mean``/``std`` on 0-255 values."""
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    size = config.get("size", {})
    fixed = _size(size)
    shortest = size.get("shortest_edge") if isinstance(size, dict) else None
    crop = _size(config.get("crop_size")) if config.get("do_center_crop") else None
    if fixed is not None and crop is None:
        height, width = fixed
        resize, shorter = "stretch", None
    elif shortest and "crop_pct" in config:  # ConvNeXt
        height = width = int(shortest)
        if shortest < 384:
            resize, shorter = "shorter-side", int(shortest / float(config["crop_pct"]))
        else:
            resize, shorter = "stretch", None
    elif shortest and crop is not None:
        (height, width), resize, shorter = crop, "shorter-side", int(shortest)
    elif fixed is not None and crop is not None:
        (height, width), resize, shorter = crop, "shorter-side", min(fixed)
    else:
        raise ConfigError(f"{path}: cannot tell the image size from size={size!r}")
    scale = float(config.get("rescale_factor", 1 / 255)) if config.get("do_rescale", True) else 1
    if config.get("do_normalize", True):
        mean = tuple(float(m) / scale for m in config.get("image_mean", (0.5, 0.5, 0.5)))
        std = tuple(float(s) / scale for s in config.get("image_std", (0.5, 0.5, 0.5)))
    else:
        mean, std = (0.0, 0.0, 0.0), (1 / scale,) * 3
    return ImageSpec(
        height=height,
        width=width,
        mean=mean,
        std=std,
        resize=resize,  # type: ignore[arg-type]  # one of the literals above
        shorter_side=shorter,
        interpolation=_RESAMPLE.get(int(config.get("resample", 2)), "bilinear"),  # type: ignore[arg-type]
    )
