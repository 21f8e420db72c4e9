"""Images for calibration and for the accuracy gate of image classifiers.

The built-in set is made of real photos that ship in a package: scikit-learn's two sample
images (``china.jpg``, a temple, and ``flower.jpg``, a flower; 640 x 427 each). Each split is
a fixed, seeded list of square crops, half of them mirrored, resized to the model's input:

- ``calibration``: crops of 30-55 % of the shorter side (parts of a scene);
- ``gate``: the two whole center squares (and their mirrors), then crops of 55-100 %.

The two splits never share a crop (their sizes do not overlap), but they come from the same two
photos, and nothing here has a label: the gate measures agreement with the fp32 model, not
accuracy. See docs/vision.md for what that can and cannot show.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np

from edgeinfer.errors import ConfigError, MissingDependencyError

__all__ = ["ImageSplit", "builtin_images", "read_images"]

ImageSplit = Literal["calibration", "gate"]
_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")
# crop side as a fraction of the photo's shorter side, per split (disjoint ranges)
_CROP_RANGE = {"calibration": (0.30, 0.55), "gate": (0.55, 1.0)}
_SEED = {"calibration": 1, "gate": 2}


def _photos() -> list[np.ndarray]:
    try:
        from sklearn.datasets import load_sample_images
    except ImportError as exc:
        raise MissingDependencyError("scikit-learn", "export") from exc
    return [np.asarray(img, dtype=np.uint8) for img in load_sample_images().images]


def _resize(square: np.ndarray, size: int) -> np.ndarray:
    """A uint8 [s, s, 3] square to [size, size, 3], bilinear with antialiasing (PIL)."""
    from PIL import Image

    img = Image.fromarray(np.ascontiguousarray(square)).resize(
        (size, size), Image.Resampling.BILINEAR
    )
    return np.asarray(img, dtype=np.uint8)


def builtin_images(split: ImageSplit, count: int, *, size: int) -> np.ndarray:
    """``count`` views of the built-in photos for ``split``: uint8 RGB [count, size, size, 3]."""
    if count < 1:
        raise ConfigError(f"count must be >= 1, got {count}")
    photos = _photos()
    rng = np.random.default_rng(_SEED[split])
    low, high = _CROP_RANGE[split]
    views = []
    for index in range(count):
        photo = photos[index % len(photos)]
        h, w, _ = photo.shape
        short = min(h, w)
        if split == "gate" and index < 2 * len(photos):  # the whole scenes first
            side, y, x = short, (h - short) // 2, (w - short) // 2
            flip = index >= len(photos)
        else:
            side = int(rng.integers(int(low * short), int(high * short) + 1))
            y = int(rng.integers(0, h - side + 1))
            x = int(rng.integers(0, w - side + 1))
            flip = bool(rng.random() < 0.5)
        crop = photo[y : y + side, x : x + side]
        views.append(_resize(crop[:, ::-1] if flip else crop, size))
    return np.stack(views)


def _load_file(path: Path, size: int) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            rgb = np.asarray(img.convert("RGB"), dtype=np.uint8)
    except (OSError, UnidentifiedImageError) as exc:
        raise ConfigError(f"{path} is not a readable image: {exc}") from exc
    h, w, _ = rgb.shape
    short = min(h, w)
    y, x = (h - short) // 2, (w - short) // 2
    return _resize(rgb[y : y + short, x : x + short], size)


def read_images(path: Path, *, size: int) -> np.ndarray:
    """Images from ``path``: a ``.npy`` file holding uint8 RGB [N, size, size, 3], one image
    file, or a folder of ``.jpg``/``.png`` files (center square, resized to ``size``)."""
    path = Path(path)
    if path.suffix == ".npy":
        array: Any = np.load(path, allow_pickle=False)
        if array.dtype != np.uint8 or array.ndim != 4 or array.shape[1:] != (size, size, 3):
            raise ConfigError(
                f"{path} must hold uint8 RGB images [N, {size}, {size}, 3], got "
                f"{array.dtype} {list(array.shape)}"
            )
        return np.asarray(array)
    if path.is_file():
        return _load_file(path, size)[None]
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in _SUFFIXES)
        if not files:
            raise ConfigError(f"{path} holds no {'/'.join(_SUFFIXES)} images")
        return np.stack([_load_file(p, size) for p in files])
    raise ConfigError(f"image set {path} does not exist (a folder, an image or a .npy file)")
