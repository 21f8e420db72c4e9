"""Run one package on fixed inputs and print its outputs and footprint as JSON.

tools/check_aarch64.sh runs this file twice per package, with the same arguments: in this
machine's interpreter and in the emulated aarch64 one (which has only the lean wheel set:
numpy, onnxruntime, tokenizers, edgeinfer). It uses the public runtime API, and the decoder
graph step by step for the greedy margins.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

TEXTS = (
    "hello world",
    "The bank raised rates.",
    "Rates went up at the central bank on Tuesday.",
    "A river runs through the old town, past the mill.",
    "Quantized models run fast on small devices.",
)
PROMPTS = ("The capital of France is", "List three rivers:")
NEW_TOKENS = 8  # a few greedy tokens: emulated decoding runs ~1 token/s


def greedy_margins(package: str, prompt: str, *, threads: int) -> list[float]:
    """The gap between the two best logits at each greedy step (what a near-tie looks like)."""
    from pathlib import Path

    import numpy as np

    from edgeinfer.config import RuntimeConfig
    from edgeinfer.manifest import Manifest
    from edgeinfer.runtime.generate import Generator
    from edgeinfer.runtime.generate.decoding import Decoder

    config = RuntimeConfig(threads=threads)
    manifest = Manifest.read(package)
    generator = Generator(Path(package), manifest, config=config)
    try:
        ids = generator.encode(prompt)
    finally:
        generator.close()
    decoder = Decoder(Path(package), manifest, config=config)  # the graph, step by step
    logits = np.array(decoder.prefill(ids))  # [V]
    margins = []
    for step in range(NEW_TOKENS):
        top2 = np.partition(logits, -2)[-2:]
        margins.append(float(top2[1] - top2[0]))
        logits = np.array(decoder.decode_one_token(int(np.argmax(logits)), len(ids) + step))
    return margins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("package")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    from edgeinfer.bench import footprint
    from edgeinfer.runtime import load

    libraries = footprint.memory_usage()
    model = load(args.package, threads=args.threads)
    outputs: object
    if model.task == "generate":
        outputs = [list(model.generate(p, max_new_tokens=NEW_TOKENS).token_ids) for p in PROMPTS]
    elif model.task == "classify":
        outputs = [r.label for r in model.classify(list(TEXTS))]
    else:
        outputs = model.embed(list(TEXTS)).tolist()
    serving = footprint.memory_usage()
    found = footprint.ServingFootprint(
        package=args.package,
        task=model.task,
        machine=platform.machine(),
        libraries=libraries,
        serving=serving,
        distributions=tuple(footprint.distribution_sizes(footprint.loaded_distributions())),
        breakdown=footprint.breakdown_of([args.package], libraries, serving),
    )
    if model.task == "generate":  # after the footprint: this loads a second generator
        margins = [greedy_margins(args.package, p, threads=args.threads) for p in PROMPTS]
        outputs = [{"tokens": t, "margins": m} for t, m in zip(outputs, margins, strict=True)]
    json.dump(
        {
            "python": platform.python_version(),
            "precision": model.manifest.precision,
            "outputs": outputs,
            "footprint": found.to_dict(),
        },
        sys.stdout,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
