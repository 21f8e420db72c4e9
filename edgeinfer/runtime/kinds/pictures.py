"""Pictures as callers hold them -> uint8 RGB [N, H, W, 3] at the package's size.

An image package's manifest says how a picture is resized and cropped (``io.image``:
``resize``, ``shorter_side``, ``interpolation``); this module does exactly that, so a device
feeds the graph what the export's gate measured. Accepted: image file paths, Pillow images,
uint8 RGB arrays of any size ([H, W, 3] or [N, H, W, 3]) and lists of those. Arrays already
at the package's size need nothing else; everything else needs Pillow (the ``images`` extra).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from edgeinfer.errors import InputError, MissingDependencyError
from edgeinfer.package_io import ImageSpec

__all__ = [
    "MAX_PIXELS",
    "as_pil",
    "fit",
    "is_picture",
    "items",
    "letterbox",
    "pictures_to_batch",
    "pil",
]

# Decoded pixels per picture at most (a 4096 x 4096 frame): a decompression bomb is refused
# before it is decoded.
MAX_PIXELS: Final = 4096 * 4096


def pil() -> Any:
    """Pillow's ``Image`` module; ``MissingDependencyError`` with the pip line without it."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise MissingDependencyError("pillow", "images") from exc
    return Image


def _is_pil(value: Any) -> bool:
    return type(value).__module__.startswith("PIL.")


def is_picture(value: Any) -> bool:
    """Whether ``value`` is one picture in a form other than an array: a path or a Pillow image."""
    return isinstance(value, (str, Path)) or _is_pil(value)


def _filter(image: ImageSpec) -> Any:
    resampling = pil().Resampling
    return {
        "bilinear": resampling.BILINEAR,
        "bicubic": resampling.BICUBIC,
        "lanczos": resampling.LANCZOS,
    }[image.interpolation]


def letterbox(w: int, h: int, image: ImageSpec) -> tuple[float, int, int]:
    """A ``w`` x ``h`` picture letterboxed into the graph's size: (scale, left, top)."""
    scale = min(image.width / w, image.height / h)
    if image.pad == "top-left":
        return scale, 0, 0
    left = (image.width - round(w * scale)) // 2
    top = (image.height - round(h * scale)) // 2
    return scale, left, top


def fit(picture: Any, image: ImageSpec) -> np.ndarray:
    """A Pillow image resized and cropped as ``image`` says: uint8 RGB [height, width, 3]."""
    picture = picture.convert("RGB")
    w, h = picture.size
    height, width = image.height, image.width
    if image.resize == "letterbox":
        scale, left, top = letterbox(w, h, image)
        new_w, new_h = round(w * scale), round(h * scale)
        canvas = np.full((height, width, 3), image.fill, np.uint8)
        resized = np.asarray(picture.resize((new_w, new_h), _filter(image)), np.uint8)
        canvas[top : top + new_h, left : left + new_w] = resized
        return canvas
    if image.resize == "stretch":
        box = (0.0, 0.0, float(w), float(h))
    elif image.resize == "shorter-side":
        shorter = image.shorter_side or min(height, width)
        scale = shorter / min(w, h)  # picture pixels -> resized pixels
        new_w, new_h = max(width, round(w * scale)), max(height, round(h * scale))
        picture = picture.resize((new_w, new_h), _filter(image))
        left, top = (new_w - width) // 2, (new_h - height) // 2
        return np.asarray(picture.crop((left, top, left + width, top + height)), np.uint8)
    else:  # "crop": the largest center region of the graph's aspect ratio
        scale = min(w / width, h / height)
        crop_w, crop_h = min(width * scale, w), min(height * scale, h)
        left, top = max((w - crop_w) / 2, 0.0), max((h - crop_h) / 2, 0.0)
        box = (left, top, left + crop_w, top + crop_h)
    resized = picture.resize((width, height), _filter(image), box=box)
    return np.asarray(resized, dtype=np.uint8)


def _open(path: str | Path) -> Any:
    image_mod = pil()
    try:
        with image_mod.open(path) as picture:
            if picture.width * picture.height > MAX_PIXELS:
                raise InputError(
                    f"{path} is {picture.width}x{picture.height}; at most {MAX_PIXELS} pixels"
                )
            picture.load()
            return picture.copy()
    except InputError:
        raise
    except FileNotFoundError as exc:
        raise InputError(f"image file {path} does not exist") from exc
    except Exception as exc:  # Pillow raises many types on unreadable files
        raise InputError(f"{path} is not a readable image: {type(exc).__name__}: {exc}") from exc


def items(images: Any) -> list[Any]:
    """One picture or many (a list, a tuple, a uint8 [N, H, W, 3] batch) as a list of
    pictures; ``InputError`` for none."""
    batch = isinstance(images, np.ndarray) and images.ndim == 4  # uint8 [N, H, W, 3]
    found = list(images) if batch or isinstance(images, (list, tuple)) else [images]
    if not found:
        raise InputError("expected at least one image")
    return found


def as_pil(item: Any, index: int) -> Any:
    """One picture (a file path, a Pillow image, a uint8 RGB array [H, W, 3]) as a Pillow
    image at its own size."""
    if isinstance(item, (str, Path)):
        return _open(item)
    if _is_pil(item):
        return item
    array = np.asarray(item) if isinstance(item, np.ndarray) else None
    if array is None or array.dtype != np.uint8 or array.ndim != 3 or array.shape[-1] != 3:
        raise InputError(
            f"image {index} must be a file path, a Pillow image or a uint8 RGB array "
            f"[H, W, 3], got {type(item).__name__}"
            + (f" {array.dtype} {list(array.shape)}" if array is not None else "")
        )
    if array.shape[0] * array.shape[1] > MAX_PIXELS or 0 in array.shape:
        raise InputError(f"image {index} is {list(array.shape)}; too large or empty")
    return pil().fromarray(np.ascontiguousarray(array))


def _one(item: Any, image: ImageSpec, index: int) -> np.ndarray:
    """One picture as uint8 RGB [height, width, 3]."""
    if isinstance(item, np.ndarray) and item.dtype == np.uint8 and item.ndim == 3:
        if item.shape[:2] == (image.height, image.width) and item.shape[-1] == 3:
            return item
    return fit(as_pil(item, index), image)


def pictures_to_batch(pictures: Any, *, image: ImageSpec) -> np.ndarray:
    """uint8 RGB [N, height, width, 3] from one picture or a sequence of pictures (paths,
    Pillow images, uint8 RGB arrays of any size; a uint8 [N, H, W, 3] array as a batch).

    Raises:
        InputError: a picture that cannot be read, is too large or has the wrong form.
        MissingDependencyError: a file, a Pillow image or a resize without Pillow installed.
    """
    if isinstance(pictures, np.ndarray) and pictures.dtype == np.uint8 and pictures.ndim == 4:
        items: Sequence[Any] = list(pictures)
    elif isinstance(pictures, np.ndarray) or is_picture(pictures):
        items = [pictures]
    elif isinstance(pictures, Sequence) and pictures:
        items = pictures
    else:
        raise InputError("expected at least one image")
    out = np.empty((len(items), image.height, image.width, 3), np.uint8)  # written in place
    for i, item in enumerate(items):
        out[i] = _one(item, image, i)
    return out
