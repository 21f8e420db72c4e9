"""Click captchas for the calibration and gate of a captcha character detector (a recipe's
``[data] views = "click-captchas"``): what such a detector meets, which the built-in photos
alone are not (ddddocr's detector finds nothing on 10 of 12 of them, and a gate of no
detections cannot fail).

Each picture is a 340 x 170 crop of one of the split's photos (``photos.py``: calibration and
gate never share a scene) with 3 to 5 capital letters and digits of 28-44 px, each turned by
up to 35 degrees, in a random colour with a white rim, drawn with Pillow's own font (Aileron,
inside the Pillow wheel) unless another is given. Seeded: the same split and seed give the
same pictures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import ConfigError
from edgeinfer.export.data.photos import ImageSplit, photos
from edgeinfer.package_io import ImageSpec
from edgeinfer.runtime.kinds.pictures import fit

__all__ = ["captcha_views", "click_captchas"]

_GLYPHS = "ABCDEFGHJKLMNPQRSTUVWXYZ2345678"  # no I, O, 0, 1: a captcha's usual alphabet
_SIZE = (340, 170)  # a click captcha's usual picture (width, height)
_SEED = {"calibration": 1, "gate": 2}


def click_captchas(
    split: ImageSplit, count: int, *, seed: int | None = None, font: Path | None = None
) -> list[Any]:
    """``count`` click-captcha pictures (Pillow RGB images) on the split's photos."""
    from PIL import Image, ImageDraw, ImageFont

    if count < 1:
        raise ConfigError(f"count must be >= 1, got {count}")
    rng = np.random.default_rng(_SEED[split] if seed is None else seed)
    backs = photos(split)
    width, height = _SIZE
    pictures = []
    for index in range(count):
        back = backs[index % len(backs)]
        x0 = int(rng.integers(0, max(1, back.shape[1] - width)))
        y0 = int(rng.integers(0, max(1, back.shape[0] - height)))
        picture = Image.fromarray(back).crop((x0, y0, x0 + width, y0 + height)).resize(_SIZE)
        for slot in range(int(rng.integers(3, 6))):
            size = int(rng.integers(28, 44))
            face = (
                ImageFont.truetype(str(font), size) if font else ImageFont.load_default(size=size)
            )
            glyph = Image.new("RGBA", (size + 10, size + 10), (0, 0, 0, 0))
            colour = (*(int(c) for c in rng.integers(0, 255, 3)), 255)
            letter = _GLYPHS[int(rng.integers(len(_GLYPHS)))]
            ImageDraw.Draw(glyph).text((5, 0), letter, font=face, fill=colour, stroke_width=1,
                                       stroke_fill=(255, 255, 255, 255))  # fmt: skip
            glyph = glyph.rotate(float(rng.uniform(-35, 35)), expand=True)
            left = int(20 + slot * 62 + rng.integers(-8, 8))
            top = int(rng.integers(10, height - glyph.size[1]))
            picture.paste(glyph, (left, top), glyph)
        pictures.append(picture)
    return pictures


def captcha_views(split: ImageSplit, count: int, *, size: ImageSpec) -> np.ndarray:
    """``count`` click captchas as a package's pictures: uint8 RGB [count, H, W, 3], resized
    as ``size`` says (the runtime's ``pictures.fit``)."""
    return np.stack([fit(picture, size) for picture in click_captchas(split, count)])
