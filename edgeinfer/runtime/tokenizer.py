"""Text to padded id arrays with the package's ``tokenizers`` file (no transformers)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from edgeinfer.errors import InputError, PackageError
from edgeinfer.manifest import Manifest
from edgeinfer.package_io import ExitSegmentsIO, TextClassifierIO, TextEncoderIO

__all__ = ["TextTokenizer"]

_DTYPES = ("int64", "int32")  # the token-id types a text graph may take


class TextTokenizer:
    """Encode batches of text into ``input_ids`` and ``attention_mask`` arrays.

    Args:
        path: the package's ``tokenizer.json``.
        max_seq_len: the longest sequence the model takes, in tokens (special tokens included).
        pad_id: the id used to pad a batch to its longest member.
        dtype: the integer dtype the graph expects.
    """

    def __init__(self, path: Path, *, max_seq_len: int, pad_id: int, dtype: np.dtype) -> None:
        from tokenizers import Tokenizer

        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on parse errors
            raise PackageError(f"cannot read tokenizer {path.name}: {exc}; re-export it") from exc
        self._tok.no_padding()
        # tokenizers truncates before adding special tokens, so [SEP]/</s> stay in place.
        self._tok.enable_truncation(max_seq_len)
        self.max_seq_len = max_seq_len
        self.pad_id = pad_id
        self.dtype = dtype

    @classmethod
    def for_package(cls, package: Path, manifest: Manifest) -> TextTokenizer:
        """The tokenizer of a text package, with the pad id and integer type its graph takes."""
        io = manifest.io
        if not isinstance(io, (TextEncoderIO, TextClassifierIO, ExitSegmentsIO)) or not (
            io.tokenizer and io.max_seq_len
        ):
            raise PackageError(f"{package.name} is a {io.kind!r} package: it takes no text")
        if io.inputs[0].dtype not in _DTYPES:
            raise PackageError(f"{package.name}: its graph takes {io.inputs[0].dtype} token ids")
        return cls(
            package / io.tokenizer,
            max_seq_len=io.max_seq_len,
            pad_id=int(manifest.tokens.get("pad") or 0),
            dtype=np.dtype(io.inputs[0].dtype),
        )

    def encode(
        self, texts: Sequence[str], *, truncate: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """Return ``input_ids`` [B, S] and ``attention_mask`` [B, S], S = the longest text.

        Args:
            texts: the batch; each must be a non-empty string.
            truncate: cut texts longer than ``max_seq_len`` (as the source model does); when
                False such a text raises ``InputError`` instead.
        """
        for text in texts:
            if not isinstance(text, str):
                raise InputError(f"expected text, got {type(text).__name__}")
        encodings = (
            self._tok.encode_batch(list(texts)) if len(texts) > 1 else [self._tok.encode(texts[0])]
        )
        if not truncate and any(e.overflowing for e in encodings):
            raise InputError(
                f"a text is longer than the {self.max_seq_len} tokens the model takes; "
                "shorten it or pass truncate=True"
            )
        seq = max(len(e.ids) for e in encodings)
        ids = np.full((len(texts), seq), self.pad_id, dtype=self.dtype)  # [B, S]
        mask = np.zeros((len(texts), seq), dtype=self.dtype)  # [B, S]
        for row, enc in enumerate(encodings):
            ids[row, : len(enc.ids)] = enc.ids
            mask[row, : len(enc.ids)] = 1
        return ids, mask
