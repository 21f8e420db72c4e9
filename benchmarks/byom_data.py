"""Inputs for the wheel matrix (benchmarks/byom_wheels.py), made from real files only: photos
that ship in PyPI packages (edgeinfer/export/data/photos.py), the DroidSansMono font of the
``captcha`` wheel (Apache-2.0 font, BSD-3-Clause package), BBC News text
(edgeinfer/export/data/text.py) and the files inside the downloaded wheels themselves.

Every model gets three disjoint sets: ``calibration`` (the export quantizes on it), ``held``
(the export's gate, ``--eval-data``) and ``check`` (never shown to the export: this
benchmark's own comparison of the package with the original graph).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from edgeinfer.export.data.captchas import click_captchas
from edgeinfer.export.data.text import builtin_text

Split = Literal["calibration", "held", "check"]
SPLITS: tuple[Split, ...] = ("calibration", "held", "check")
_SEEDS = {"calibration": 1, "held": 2, "check": 3}


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


@dataclass
class Made:
    """Each model's data, made on first use under ``work`` and reused after."""

    font: Path
    unpacked: Path
    work: Path

    def _folder(self, *parts: str) -> tuple[Path, bool]:
        folder = self.work.joinpath(*parts)
        return folder, folder.exists()

    def captchas(self, split: Split) -> Path:
        """Click captchas (.png, edgeinfer/export/data/captchas.py with the captcha wheel's
        font), 40 per split: held and check on the gate photos with their own seeds."""
        folder, done = self._folder("captchas", split)
        if not done:
            folder.mkdir(parents=True)
            photos_of = "calibration" if split == "calibration" else "gate"
            made = click_captchas(photos_of, 40, seed=_SEEDS[split], font=self.font)
            for index, picture in enumerate(made):
                picture.save(folder / f"{index:03d}.png")
        return folder

    def lines(self, model: Literal["rec", "ddddocr"], split: Split) -> Path:
        """Text lines as tensors, one .npz per line: PP-OCR's (height 48, BGR, values in
        [-1, 1]) or ddddocr's (height 64, gray, values / 255)."""
        folder, done = self._folder("lines", model, split)
        if not done:
            height = 48 if model == "rec" else 64
            calls = []
            for line in text_lines(self.font, split, count=24, height=height):
                if model == "rec":
                    calls.append(rec_tensor(line, height=48, mean=0.5, std=0.5)[0])
                else:
                    gray = line.convert("L").convert("RGB")
                    calls.append(rec_tensor(gray, height=64, mean=0.0, std=1.0)[0, :1])
            save_calls(folder, "input1" if model == "ddddocr" else "x", calls)
        return folder

    def turned(self, split: Split) -> Path:
        """Text lines (.png) for the direction classifier, every second one turned by 180
        degrees (its name ends in -180)."""
        folder, done = self._folder("turned", split)
        if not done:
            folder.mkdir(parents=True)
            for index, line in enumerate(text_lines(self.font, split, count=24, height=48)):
                turned = index % 2 == 1
                picture = line.rotate(180) if turned else line
                picture.save(folder / f"{index:03d}-{180 if turned else 0}.png")
        return folder

    def pages(self, model: Literal["det", "layout"], split: Split) -> Path:
        """Pages as tensors, one .npz per page: at their own size (the DB text detector) or
        resized to 800 x 608 (the layout detector's fixed input)."""
        folder, done = self._folder("pages", model, split)
        if not done:
            size = (800, 608) if model == "layout" else None
            tensors = [page_tensor(p, size=size)[0] for p in pages(self.font, split, count=12)]
            save_calls(folder, "image" if model == "layout" else "x", tensors)
        return folder

    def magika(self, split: Split) -> Path:
        """Magika's features of a third of the unpacked wheels' files, one .npz."""
        path = self.work / "magika" / f"{split}.npz"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            files = magika_files(self.unpacked)[split]
            np.savez(path, bytes=np.stack([magika_features(p) for p in files]))
        return path


def direction_folder(graph: Path, folder: Path) -> Path:
    """The direction classifier as a user holds it: a folder with the graph, its two labels
    and a ``preprocessor_config.json`` (its input has no fixed size: 48 x 192, as PP-OCR
    runs it, values in [-1, 1])."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(graph, folder / graph.name)
    (folder / "labels.txt").write_text("0\n180\n")
    processor = {"size": {"height": 48, "width": 192}, "image_mean": [0.5] * 3,
                 "image_std": [0.5] * 3, "do_rescale": True, "rescale_factor": 1 / 255}  # fmt: skip
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    return folder


def external_copy(graph: Path, folder: Path) -> Path:
    """``graph`` saved with every tensor of 1 KiB or more in ``<name>.data`` beside it (its
    Constant nodes' values too: Paddle keeps its weights there)."""
    import onnx
    from onnx.external_data_helper import convert_model_to_external_data

    folder.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(graph))
    convert_model_to_external_data(model, all_tensors_to_one_file=True,
                                   location=f"{graph.name}.data", size_threshold=1024,
                                   convert_attribute=True)  # fmt: skip
    onnx.save(model, str(folder / graph.name))
    return folder / graph.name
