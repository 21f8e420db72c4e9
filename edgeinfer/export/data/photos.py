"""Images for calibration and for the accuracy gate of image classifiers.

The built-in set is made of real photos that ship inside PyPI packages, read from their files
(the packages are never imported), each public domain or CC0 unless noted:

- scikit-learn: ``china.jpg`` (a temple), ``flower.jpg`` (CC BY 2.0, Flickr);
- matplotlib: ``grace_hopper.jpg`` (a portrait, US Navy);
- scikit-image: ``astronaut``, ``camera`` (a cameraman), ``chelsea`` (a cat), ``coffee``,
  ``rocket``, ``hubble_deep_field``, ``retina``, ``ihc`` (stained tissue), ``brick``, ``grass``,
  ``gravel``, ``coins``, ``cell``, ``text`` (printed and handwritten text).

Calibration and gate use **different photos** (``_PHOTOS``), so the gate never measures on a
scene the quantizer saw. Each split is a fixed, seeded list of square views across scale and
position — the whole scene first, then crops of ``_CROP_RANGE`` of the shorter side anywhere in
it, half of them mirrored — resized and cropped as the package's ``ImageSpec`` says (the same
code the runtime runs: ``runtime.pictures.fit``). With ``rotate``, view i is turned by i x 90
degrees (orientation classifiers). Nothing here has a label: the gate measures agreement with
the fp32 model, not accuracy (docs/vision.md).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edgeinfer.errors import ConfigError, MissingDependencyError
from edgeinfer.package_io import ImageSpec
from edgeinfer.runtime.kinds.pictures import fit, pil

__all__ = ["ImageSplit", "builtin_images", "photos", "read_images", "split_images"]

ImageSplit = Literal["calibration", "tune", "gate"]
_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")
# (package, folder inside it, file) of each photo, by split: no photo is in both.
_PHOTOS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "calibration": (
        ("sklearn", "datasets/images", "flower.jpg"),
        ("skimage", "data", "camera.png"),
        ("skimage", "data", "brick.png"),
        ("skimage", "data", "grass.png"),
        ("skimage", "data", "cell.png"),
    ),
    # chooses what calibration cannot: the method, the nodes kept in float (sensitivity)
    "tune": (
        ("skimage", "data", "motorcycle_left.png"),
        ("skimage", "data", "clock_motion.png"),
        ("skimage", "data", "moon.png"),
        ("skimage", "data", "microaneurysms.png"),
        ("skimage", "data", "page.png"),
        ("matplotlib", "mpl-data/sample_data", "Minduka_Present_Blue_Pack.png"),
    ),
    "gate": (
        ("sklearn", "datasets/images", "china.jpg"),
        ("matplotlib", "mpl-data/sample_data", "grace_hopper.jpg"),
        ("skimage", "data", "astronaut.png"),
        ("skimage", "data", "chelsea.png"),
        ("skimage", "data", "coffee.png"),
        ("skimage", "data", "rocket.jpg"),
        ("skimage", "data", "hubble_deep_field.jpg"),
        ("skimage", "data", "retina.jpg"),
        ("skimage", "data", "ihc.png"),
        ("skimage", "data", "gravel.png"),
        ("skimage", "data", "coins.png"),
        ("skimage", "data", "text.png"),
    ),
}
_PIP = {"sklearn": "scikit-learn", "skimage": "scikit-image", "matplotlib": "matplotlib"}
# crop side as a fraction of the photo's shorter side, per split
_CROP_RANGE = {"calibration": (0.30, 1.0), "tune": (0.40, 1.0), "gate": (0.40, 1.0)}
_SEED = {"calibration": 1, "tune": 3, "gate": 2}


def _package_folder(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(_PIP[module], "export")
    return Path(next(iter(spec.submodule_search_locations)))


def photos(split: ImageSplit) -> list[np.ndarray]:
    """The split's photos as uint8 RGB arrays [H, W, 3] (grayscale ones as RGB)."""
    out = []
    for module, folder, name in _PHOTOS[split]:
        path = _package_folder(module) / folder / name
        if not path.is_file():
            raise MissingDependencyError(_PIP[module], "export")
        with pil().open(path) as img:
            out.append(np.asarray(img.convert("RGB"), dtype=np.uint8))
    return out


def _spec(size: int | ImageSpec) -> ImageSpec:
    if isinstance(size, ImageSpec):
        return size
    return ImageSpec(height=size, width=size, mean=(0.0,) * 3, std=(1.0,) * 3)


def builtin_images(
    split: ImageSplit, count: int, *, size: int | ImageSpec, rotate: bool = False
) -> np.ndarray:
    """``count`` views of the split's photos: uint8 RGB [count, H, W, 3], made as ``size`` (a
    package's ``ImageSpec``, or a side in pixels) says; turned by i x 90 degrees with
    ``rotate``."""
    if count < 1:
        raise ConfigError(f"count must be >= 1, got {count}")
    spec = _spec(size)
    scenes = photos(split)
    rng = np.random.default_rng(_SEED[split])
    low, high = _CROP_RANGE[split]
    views = np.empty((count, spec.height, spec.width, 3), np.uint8)
    for index in range(count):
        photo = scenes[index % len(scenes)]
        h, w, _ = photo.shape
        short = min(h, w)
        if index < 2 * len(scenes):  # the whole scenes first, then their mirrors
            side, y, x = short, (h - short) // 2, (w - short) // 2
            flip = index >= len(scenes)
        else:
            side = int(rng.integers(int(low * short), int(high * short) + 1))
            y = int(rng.integers(0, h - side + 1))
            x = int(rng.integers(0, w - side + 1))
            flip = bool(rng.random() < 0.5)
        crop = photo[y : y + side, x : x + side]
        crop = crop[:, ::-1] if flip else crop
        if rotate:
            crop = np.rot90(crop, k=index % 4)
        views[index] = fit(pil().fromarray(np.ascontiguousarray(crop)), spec)
    return views


def _load_file(path: Path, spec: ImageSpec) -> np.ndarray:
    from PIL import UnidentifiedImageError

    try:
        with pil().open(path) as img:
            return fit(img, spec)
    except (OSError, UnidentifiedImageError) as exc:
        raise ConfigError(f"{path} is not a readable image: {exc}") from exc


def read_images(path: Path, *, size: int | ImageSpec) -> np.ndarray:
    """Images from ``path``: a ``.npy`` file holding uint8 RGB [N, H, W, 3] at the package's
    size, one image file, or a folder of ``.jpg``/``.png`` files (resized and cropped as
    ``size`` says, as the runtime will)."""
    path, spec = Path(path), _spec(size)
    if path.suffix == ".npy":
        array: Any = np.load(path, allow_pickle=False)
        shape = (spec.height, spec.width, 3)
        if array.dtype != np.uint8 or array.ndim != 4 or array.shape[1:] != shape:
            raise ConfigError(
                f"{path} must hold uint8 RGB images [N, {shape[0]}, {shape[1]}, 3], got "
                f"{array.dtype} {list(array.shape)}"
            )
        return np.asarray(array)
    if path.is_file():
        return _load_file(path, spec)[None]
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in _SUFFIXES)
        if not files:
            raise ConfigError(f"{path} holds no {'/'.join(_SUFFIXES)} images")
        return np.stack([_load_file(p, spec) for p in files])
    raise ConfigError(f"image set {path} does not exist (a folder, an image or a .npy file)")


def split_images(views: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(calibration, held) from one set of a user's images: the last quarter held out."""
    if len(views) < 2:
        raise ConfigError(
            "the calibration images hold one image: nothing can be held out for the gate; "
            "pass more images or --eval-data"
        )
    held = max(1, len(views) // 4)
    return views[:-held], views[-held:]
