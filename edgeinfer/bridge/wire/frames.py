"""Camera frames to the package's input: decode JPEG/PNG, then resize and crop (Pillow).

An image classifier takes uint8 RGB [N, H, W, 3] at the size in its manifest (``io.image``).
A frame of that size passes through untouched; any other frame (or an encoded JPEG/PNG) is
resized and cropped as the manifest says (``runtime.images.fit``), the preprocessing the
export's accuracy gate used. Pillow is the optional ``images`` extra.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgeinfer.errors import InputError
from edgeinfer.package_io import ImageSpec
from edgeinfer.runtime.kinds.pictures import MAX_PIXELS, fit, pil

__all__ = ["MAX_PIXELS", "frames_to_batch", "frames_to_pictures"]


def _decode(fmt: str, data: bytes, size: tuple[int, int] | None) -> Any:
    """A Pillow RGB image from JPEG/PNG bytes (JPEG decoded at a reduced scale when larger
    than ``size``; None: at its own size)."""
    image_mod = pil()
    try:
        img = image_mod.open(io.BytesIO(data), formats=[fmt.upper()])
        if img.width * img.height > MAX_PIXELS:
            raise InputError(
                f"image is {img.width}x{img.height}; at most {MAX_PIXELS} pixels are decoded"
            )
        if size is not None:
            img.draft("RGB", size)  # JPEG: decode at the smallest scale still >= the target
        return img.convert("RGB")
    except InputError:
        raise
    except Exception as exc:  # Pillow raises many types on bad data (OSError, SyntaxError, ...)
        raise InputError(f"not a readable {fmt} image: {type(exc).__name__}: {exc}") from exc


def frames_to_batch(
    frames: Sequence[np.ndarray | tuple[str, bytes]], *, image: ImageSpec
) -> np.ndarray:
    """uint8 RGB [N, height, width, 3] from raw [H, W, 3] arrays and (format, bytes) images,
    resized and cropped as ``image`` (the package's ``io.image``) says.

    Raises:
        InputError: an image that cannot be read or is too large.
        MissingDependencyError: an encoded image or a resize without Pillow installed.
    """
    height, width = image.height, image.width
    shorter = image.shorter_side if image.resize == "shorter-side" else None
    draft = (shorter, shorter) if shorter else (width, height)  # JPEG decoded at least this big
    out = np.empty((len(frames), height, width, 3), np.uint8)  # written in place
    for i, frame in enumerate(frames):
        if isinstance(frame, np.ndarray):
            if frame.shape == (height, width, 3):
                out[i] = frame
                continue
            if frame.shape[0] * frame.shape[1] > MAX_PIXELS or 0 in frame.shape:
                raise InputError(f"image {i} is {list(frame.shape)}; too large or empty")
            out[i] = fit(pil().fromarray(np.ascontiguousarray(frame)), image)
        else:
            out[i] = fit(_decode(frame[0], frame[1], draft), image)
    return out


def frames_to_pictures(frames: Sequence[np.ndarray | tuple[str, bytes]]) -> list[Any]:
    """Each frame at its own size (a detector's boxes are in the frame's pixels): raw uint8
    RGB [H, W, 3] arrays as they are, encoded images decoded to Pillow images."""
    return [f if isinstance(f, np.ndarray) else _decode(f[0], f[1], None) for f in frames]
