"""The export's speed guard, repeated: the same small encoder exported N times with dynamic
int8, each time timed against fp32 by the guard (paired interleaved runs, a 99 % bootstrap
interval, refused only when slower with confidence by more than 5 %). Prints each export's
verdict, ratio and interval, and whether every verdict was the same.

    python benchmarks/speed_guard_repeat.py [--runs 10] [--layers 4 --hidden 256] [--json]

The encoder is a BERT built from a config (random weights; 4 layers of hidden 256 by default,
where int8 is clearly faster; 2 layers of hidden 64 make int8 and fp32 nearly tie) with
MiniLM's tokenizer (the minilm recipe's files), so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)


def small_bert(folder: Path, *, layers: int, hidden: int) -> Path:
    import torch
    from transformers import BertConfig, BertModel

    from edgeinfer.export.source import resolve_source

    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=4 * hidden,
    )
    BertModel(config).save_pretrained(folder)
    minilm = resolve_source("minilm").path
    for name in TOKENIZER_FILES:
        shutil.copy(minilm / name, folder / name)
    return folder


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from edgeinfer.errors import SlowerQuantizationError
    from edgeinfer.export.options import ExportOptions
    from edgeinfer.export.run import export

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        source = small_bert(Path(tmp) / "bert", layers=args.layers, hidden=args.hidden)
        for run in range(args.runs):
            options = ExportOptions(
                source=str(source), out=Path(tmp) / f"pkg-{run}", quantize="int8", held_count=48
            )
            try:
                report = export(options).to_dict()
                verdict = f"shipped {report['chosen']}"
            except SlowerQuantizationError as exc:
                report, verdict = exc.report or {}, "refused: int8 slower"
            speed = report.get("variants", {}).get("int8", {}).get("speed", {})
            rows.append({"run": run, "verdict": verdict, **speed})
            low, high = speed.get("interval", [0, 0])
            sys.stderr.write(
                f"export {run}: {verdict:<22} {speed.get('speedup_vs_fp32', 0):.3f}x "
                f"[{low:.3f}, {high:.3f}] ({speed.get('ms', 0):.2f} vs "
                f"{speed.get('fp32_ms', 0):.2f} ms)\n"
            )
    same = len({r["verdict"] for r in rows}) == 1
    if args.json:
        sys.stdout.write(json.dumps({"exports": rows, "same_verdict": same}, indent=2) + "\n")
    else:
        sys.stdout.write(f"same verdict on all {len(rows)} exports: {same}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
