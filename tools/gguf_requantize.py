"""Re-quantize a GGUF file's weights to Q8_0 (or another ggml type) with the ``gguf`` package:
dequantize each tensor with gguf's own dequantizer, quantize it again, copy the metadata.

The llama.cpp baseline of ``edgeinfer bench`` must run at the bits per weight of the package it
is compared with: an int8 package (8-bit blocks of 32 with a scale) stands beside a Q8_0 GGUF.
As ``llama-quantize --pure`` does for Q8_0, every 2-D weight (the token embedding included)
becomes Q8_0 and the 1-D norms stay F32. The values are those of the source file (a Q4_K_M file
re-quantized to Q8_0 keeps its Q4 rounding), so both engines compute the same model.

A llama.cpp Q4_0 file keeps the token embedding at Q8_0 (``llama-quantize`` does for small
models): ``--type Q4_0 --keep token_embd.weight=Q8_0``.

    python tools/gguf_requantize.py IN.gguf OUT.gguf [--type Q8_0] [--keep NAME=TYPE ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def requantize(
    src: Path, dst: Path, qtype_name: str = "Q8_0", keep: dict[str, str] | None = None
) -> Path:
    """Write ``dst``: ``src`` with its 2-D weights in ``qtype_name`` (tensors named in ``keep``
    in the type given there)."""
    import gguf
    from gguf.quants import dequantize, quantize

    qtype = gguf.GGMLQuantizationType[qtype_name]
    types = {k: gguf.GGMLQuantizationType[v] for k, v in (keep or {}).items()}
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(str(dst), arch=arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        value = field.contents()
        if field.name == gguf.Keys.General.FILE_TYPE:
            value = int(gguf.LlamaFileType[f"MOSTLY_{qtype_name}"])
        main = field.types[0]
        sub = field.types[-1] if main == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, main, sub_type=sub)
    for tensor in reader.tensors:
        weights = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)  # [rows, cols]
        wanted = types.get(tensor.name, qtype)
        if weights.ndim >= 2 and weights.shape[-1] % gguf.GGML_QUANT_SIZES[wanted][0] == 0:
            writer.add_tensor(tensor.name, quantize(weights, wanted), raw_dtype=wanted)
        else:  # norms and odd shapes stay float32
            writer.add_tensor(tensor.name, weights)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--type", default="Q8_0", help="ggml type name (default Q8_0)")
    parser.add_argument("--keep", nargs="*", default=[], help="NAME=TYPE: a tensor's own type")
    args = parser.parse_args()
    keep = dict(item.split("=", 1) for item in args.keep)
    print(requantize(args.src, args.dst, args.type, keep), file=sys.stdout)
