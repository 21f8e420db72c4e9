"""Camera frames to the package's input: decode JPEG/PNG, center-crop, resize (Pillow).

An image classifier takes uint8 RGB [N, H, W, 3] at the size in its manifest (``io.image``).
A frame of that size passes through untouched; any other frame (or an encoded JPEG/PNG) is
cut to the package's aspect ratio around its center and resized with a bilinear filter, the
preprocessing the export's accuracy gate used. Pillow is the optional ``images`` extra.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from edgeinfer.errors import InputError, MissingDependencyError

__all__ = ["MAX_PIXELS", "frames_to_batch"]

# Decoded pixels per image at most: a 4096 x 4096 frame; a compressed bomb is refused before
# it is decoded (the payload limit bounds only the compressed size).
MAX_PIXELS: Final = 4096 * 4096


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError as exc:
        raise MissingDependencyError("pillow", "images") from exc
    return Image


def _decode(fmt: str, data: bytes, size: tuple[int, int]) -> Any:
    """A Pillow RGB image from JPEG/PNG bytes (JPEG decoded at a reduced scale when larger)."""
    image_mod = _pil()
    try:
        img = image_mod.open(io.BytesIO(data), formats=[fmt.upper()])
        if img.width * img.height > MAX_PIXELS:
            raise InputError(
                f"image is {img.width}x{img.height}; at most {MAX_PIXELS} pixels are decoded"
            )
        img.draft("RGB", size)  # JPEG: decode at the smallest scale still >= the target
        return img.convert("RGB")
    except InputError:
        raise
    except Exception as exc:  # Pillow raises many types on bad data (OSError, SyntaxError, ...)
        raise InputError(f"not a readable {fmt} image: {type(exc).__name__}: {exc}") from exc


def _fit(img: Any, height: int, width: int) -> np.ndarray:
    """Center-crop ``img`` to height:width, then resize to [height, width, 3] uint8."""
    image_mod = _pil()
    w, h = img.size
    scale = min(w / width, h / height)
    crop_w, crop_h = round(width * scale), round(height * scale)
    left, top = (w - crop_w) // 2, (h - crop_h) // 2
    box = (left, top, left + crop_w, top + crop_h)
    resized = img.resize((width, height), image_mod.Resampling.BILINEAR, box=box)
    return np.asarray(resized, dtype=np.uint8)


def frames_to_batch(
    frames: Sequence[np.ndarray | tuple[str, bytes]], *, height: int, width: int
) -> np.ndarray:
    """uint8 RGB [N, height, width, 3] from raw [H, W, 3] arrays and (format, bytes) images.

    Raises:
        InputError: an image that cannot be read or is too large.
        MissingDependencyError: an encoded image or a resize without Pillow installed.
    """
    out = np.empty((len(frames), height, width, 3), np.uint8)  # written in place
    for i, frame in enumerate(frames):
        if isinstance(frame, np.ndarray):
            if frame.shape == (height, width, 3):
                out[i] = frame
                continue
            if frame.shape[0] * frame.shape[1] > MAX_PIXELS or 0 in frame.shape:
                raise InputError(f"image {i} is {list(frame.shape)}; too large or empty")
            out[i] = _fit(_pil().fromarray(np.ascontiguousarray(frame)), height, width)
        else:
            out[i] = _fit(_decode(frame[0], frame[1], (width, height)), height, width)
    return out
