"""Inputs for the wheel matrix (benchmarks/byom_wheels.py), made from real files only: photos
that ship in PyPI packages (edgeinfer/export/data/photos.py), the DroidSansMono font of the
``captcha`` wheel (Apache-2.0 font, BSD-3-Clause package), BBC News text
(edgeinfer/export/data/text.py) and the files inside the downloaded wheels themselves.

Every model gets three disjoint sets: ``calibration`` (the export quantizes on it), ``held``
(the export's gate, ``--eval-data``) and ``check`` (never shown to the export: this
benchmark's own comparison of the package with the original graph).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from edgeinfer.export.data.photos import photos
from edgeinfer.export.data.text import builtin_text

Split = Literal["calibration", "held", "check"]
SPLITS: tuple[Split, ...] = ("calibration", "held", "check")
_SEEDS = {"calibration": 1, "held": 2, "check": 3}
# Backgrounds: the calibration photos for calibration, the gate photos for held and check.
_PHOTO_SPLIT = {"calibration": "calibration", "held": "gate", "check": "gate"}
_GLYPHS = "ABCDEFGHJKLMNPQRSTUVWXYZ2345678"
_CAPTCHA_SIZE = (340, 170)  # a click captcha's usual picture (width, height)


def click_captchas(font: Path, folder: Path, split: Split, *, count: int) -> Path:
    """Click-captcha pictures as ddddocr's detector meets them: 3-5 glyphs of 28-44 px,
    turned up to 35 degrees, in random colours with a white rim, on a crop of a photo."""
    rng = np.random.default_rng(_SEEDS[split])
    folder.mkdir(parents=True, exist_ok=True)
    backs = photos(_PHOTO_SPLIT[split])  # type: ignore[arg-type]
    width, height = _CAPTCHA_SIZE
    for index in range(count):
        back = backs[index % len(backs)]
        x0 = int(rng.integers(0, max(1, back.shape[1] - width)))
        y0 = int(rng.integers(0, max(1, back.shape[0] - height)))
        picture = Image.fromarray(back).crop((x0, y0, x0 + width, y0 + height))
        picture = picture.resize(_CAPTCHA_SIZE)
        for slot in range(int(rng.integers(3, 6))):
            size = int(rng.integers(28, 44))
            glyph = Image.new("RGBA", (size + 10, size + 10), (0, 0, 0, 0))
            colour = (*(int(c) for c in rng.integers(0, 255, 3)), 255)
            ImageDraw.Draw(glyph).text(
                (5, 0),
                _GLYPHS[int(rng.integers(len(_GLYPHS)))],
                font=ImageFont.truetype(str(font), size),
                fill=colour,
                stroke_width=1,
                stroke_fill=(255, 255, 255, 255),
            )
            glyph = glyph.rotate(float(rng.uniform(-35, 35)), expand=True)
            left = int(20 + slot * 62 + rng.integers(-8, 8))
            top = int(rng.integers(10, height - glyph.size[1]))
            picture.paste(glyph, (left, top), glyph)
        picture.save(folder / f"{index:03d}.png")
    return folder


def text_lines(font: Path, split: Split, *, count: int, height: int) -> list[Image.Image]:
    """Printed lines of BBC News text, 3-8 words each (so their widths differ), black on a
    light gray, ``height`` pixels tall."""
    rng = np.random.default_rng(_SEEDS[split])
    texts = builtin_text("calibration" if split == "calibration" else "held", count + 8)
    if split == "check":
        texts = texts[8:]
    lines = []
    face = ImageFont.truetype(str(font), int(height * 0.7))
    for text in texts[:count]:
        words = text.split()
        start = int(rng.integers(0, max(1, len(words) - 8)))
        line = " ".join(words[start : start + int(rng.integers(3, 9))])
        width = int(face.getlength(line)) + 16
        picture = Image.new("RGB", (width, height), (235, 235, 235))
        ImageDraw.Draw(picture).text((8, height * 0.1), line, font=face, fill=(20, 20, 20))
        lines.append(picture)
    return lines


def rec_tensor(line: Image.Image, *, height: int, mean: float, std: float) -> np.ndarray:
    """A line as PP-OCR / ddddocr recognizers take it: resized to ``height``, width kept in
    proportion, BGR (gray lines: the same), ``(value / 255 - mean) / std``: [1, C, H, W]."""
    width = max(8, round(line.width * height / line.height))
    pixels = np.asarray(line.resize((width, height), Image.Resampling.BILINEAR), np.float32)
    pixels = (pixels[:, :, ::-1] / 255.0 - mean) / std
    return np.ascontiguousarray(pixels.transpose(2, 0, 1)[None], np.float32)


def save_calls(folder: Path, name: str, arrays: list[np.ndarray]) -> Path:
    """One .npz per call (their shapes may differ), each holding one call of input ``name``."""
    folder.mkdir(parents=True, exist_ok=True)
    for index, array in enumerate(arrays):
        np.savez(folder / f"{index:03d}.npz", **{name: array[None]})
    return folder


def magika_features(path: Path, *, block: int = 4096, size: int = 1024) -> np.ndarray:
    """Magika v3's input for one file (its config: 1024 bytes from the start, 1024 from the
    end, whitespace stripped at both ends of the file's first and last 4 KiB, padded with
    token 256): int32 [2048]."""
    data = path.read_bytes()
    head = data[:block].lstrip()[:size]
    tail = data[-block:].rstrip()[-size:]
    features = np.full(2 * size, 256, np.int32)
    features[: len(head)] = np.frombuffer(head, np.uint8)
    features[2 * size - len(tail) :] = np.frombuffer(tail, np.uint8)
    return features


def magika_files(root: Path) -> dict[Split, list[Path]]:
    """The unpacked wheels' files, of every kind (Python, JSON, Markdown, images, fonts,
    sounds, ONNX, ...), dealt round-robin into the three splits by sorted path."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.stat().st_size >= 64)
    return {split: files[index::3] for index, split in enumerate(SPLITS)}


def pages(font: Path, split: Split, *, count: int) -> list[Image.Image]:
    """Document pages of BBC News text: a title, then paragraphs in one or two columns, at
    sizes that differ from page to page (multiples of 32 pixels, as DB text detectors take)."""
    rng = np.random.default_rng(_SEEDS[split])
    texts = builtin_text("calibration" if split == "calibration" else "held", 2 * count + 8)
    if split == "check":
        texts = texts[8:]
    result = []
    for index in range(count):
        width, height = 32 * int(rng.integers(14, 22)), 32 * int(rng.integers(16, 26))
        page = Image.new("RGB", (width, height), (250, 250, 248))
        draw = ImageDraw.Draw(page)
        title = ImageFont.truetype(str(font), int(rng.integers(26, 34)))
        body = ImageFont.truetype(str(font), int(rng.integers(13, 18)))
        words = texts[2 * index].split()
        draw.text((24, 20), " ".join(words[:4]), font=title, fill=(10, 10, 10))
        columns = int(rng.integers(1, 3))
        column_w = (width - 48) // columns
        chars = max(8, int(column_w / body.getlength("n")))
        words = texts[2 * index + 1].split() + words
        y, column = 80, 0
        line: list[str] = []
        for word in words:
            if len(" ".join([*line, word])) > chars:
                draw.text((24 + column * column_w, y), " ".join(line), font=body, fill=(30, 30, 30))
                line, y = [], y + int(body.size * 1.5)
                if y > height - 40:
                    column, y = column + 1, 80
                    if column == columns:
                        break
            line.append(word)
        result.append(page)
    return result


def page_tensor(page: Image.Image, *, size: tuple[int, int] | None = None) -> np.ndarray:
    """A page as Paddle's detectors take it: resized to ``size`` (height, width) if given,
    BGR, ImageNet's mean and std on 0-1 values: [1, 3, H, W]."""
    if size is not None:
        page = page.resize((size[1], size[0]), Image.Resampling.BILINEAR)
    pixels = np.asarray(page, np.float32)[:, :, ::-1] / 255.0
    pixels = (pixels - (0.406, 0.456, 0.485)) / (0.225, 0.224, 0.229)
    return np.ascontiguousarray(pixels.transpose(2, 0, 1)[None], np.float32)
