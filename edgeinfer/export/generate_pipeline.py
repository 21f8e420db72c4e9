"""``edgeinfer export`` for decoders: source -> fp32 graph -> parity -> quantized variants ->
quality gate (perplexity, next-token agreement) and speed -> package.

Every variant is measured (size, perplexity, agreement with fp32, decode tokens/s) and listed in
the report; the fastest variant that passes the gate ships.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import AccuracyGateError, SlowerQuantizationError
from edgeinfer.export import calibrate, decoder, decoder_embed, lm, package, quantize

if TYPE_CHECKING:
    from edgeinfer.export.pipeline import _Run

__all__ = [
    "DEFAULT_VARIANTS",
    "GATE_MAX_PPL_INCREASE",
    "GATE_MIN_AGREEMENT",
    "VARIANTS",
    "export_generate",
]

GATE_MAX_PPL_INCREASE = 0.03  # perplexity at most +3 % over the fp32 graph on held text
GATE_MIN_AGREEMENT = 0.95  # greedy next-token agreement with the fp32 graph
# KV for 2048 tokens of SmolLM2-135M is 94 MB fp32: the context a small device can afford;
# the model's own window (8192) is recorded in the manifest as source_context_length.
MAX_PACKAGE_CONTEXT = 2048
HELD_TOKENS = 256  # tokens per held text: long enough for perplexity, short enough to run fast
MAX_HELD_TEXTS = 32  # 32 x 256 tokens ~ 8k positions: agreement resolved to ~0.1 %
SPEED_TOKENS = 32  # decode steps timed per variant
SPEED_TIE = 0.95  # variants decoding within 5 % of the fastest count as equally fast

_HEAD = "/lm_head/MatMul"


def _edge_layers(layers: int) -> list[str]:
    """Every MatMul of the first and the last decoder layer (the most sensitive ones)."""
    names = ("attn/qkv_proj", "attn/o_proj", "mlp/gate_proj", "mlp/up_proj", "mlp/down_proj")
    return [f"/model/layers.{i}/{n}/MatMul" for i in (0, layers - 1) for n in names]


def _int8_fp32_head_edges(fp32: Path, out: Path) -> None:
    import onnx

    names = {n.name for n in onnx.load(str(fp32), load_external_data=False).graph.node}
    layers = sum(1 for n in names if n.endswith("/attn/GroupQueryAttention"))
    quantize.quantize_weight_only(fp32, out, bits=8, exclude=[_HEAD, *_edge_layers(layers)])


def _int8_exact_head(fp32: Path, out: Path) -> None:
    mid = out.with_suffix(".body.onnx")
    quantize.quantize_weight_only(fp32, mid, bits=8, exclude=[_HEAD])
    quantize.quantize_weight_only(mid, out, bits=8, include=[_HEAD], accuracy_level=1)


def _int4_int8_head(fp32: Path, out: Path) -> None:
    mid = out.with_suffix(".int4.onnx")
    quantize.quantize_weight_only(fp32, mid, bits=4, exclude=[_HEAD])
    quantize.quantize_weight_only(mid, out, bits=8, include=[_HEAD])


def _int8_embed(build: Callable[[Path, Path], None]) -> Callable[[Path, Path], None]:
    """``build``, then the embedding table in 8-bit blocks (shared with an 8-bit tied head)."""

    def run(fp32: Path, out: Path) -> None:
        mid = out.with_suffix(".fp32-embed.onnx")
        build(fp32, mid)
        decoder_embed.quantize_embedding(mid, out)
        for name in [mid.name, *package.external_data_files(mid)]:
            (mid.parent / name).unlink()  # a large model's intermediate graph: gigabytes

    return run


# name -> (builder, manifest quantization description)
VARIANTS: dict[str, tuple[Callable[[Path, Path], None], dict[str, Any]]] = {
    "int8-dynamic": (
        lambda a, b: quantize.quantize_decoder_dynamic(a, b, exclude=[_HEAD]),
        {"mode": "int8-dynamic", "per_channel": True, "weights": "uint8", "excluded": [_HEAD]},
    ),
    "int8-weight-only": (
        lambda a, b: quantize.quantize_weight_only(a, b, bits=8),
        {"mode": "matmulnbits", "bits": 8, "block_size": 32, "accuracy_level": 4},
    ),
    "int8-weight-only-exact-head": (
        _int8_exact_head,
        {"mode": "matmulnbits", "bits": 8, "block_size": 32, "lm_head_accuracy_level": 1},
    ),
    "int8-weight-only-exact": (
        lambda a, b: quantize.quantize_weight_only(a, b, bits=8, accuracy_level=1),
        {"mode": "matmulnbits", "bits": 8, "block_size": 32, "accuracy_level": 1},
    ),
    "int8-weight-only-fp32-head": (
        lambda a, b: quantize.quantize_weight_only(a, b, bits=8, exclude=[_HEAD]),
        {"mode": "matmulnbits", "bits": 8, "block_size": 32, "excluded": [_HEAD]},
    ),
    "int8-weight-only-fp32-head-edges": (
        _int8_fp32_head_edges,
        {"mode": "matmulnbits", "bits": 8, "block_size": 32, "excluded": "lm_head, layers 0, -1"},
    ),
    # The embedding table in 8-bit blocks too (llama.cpp's Q8_0 layout): the package shrinks
    # by 3/4 of the table (Gemma 3 270M: 977 -> 306 MB), decode speed unchanged.
    "int8-weight-only-int8-embed": (
        _int8_embed(lambda a, b: quantize.quantize_weight_only(a, b, bits=8)),
        {"mode": "matmulnbits", "bits": 8, "block_size": 32, "embedding": "int8 blocks"},
    ),
    "int8-weight-only-fp32-head-edges-int8-embed": (
        _int8_embed(_int8_fp32_head_edges),
        {
            "mode": "matmulnbits",
            "bits": 8,
            "block_size": 32,
            "excluded": "lm_head, layers 0, -1",
            "embedding": "int8 blocks",
        },
    ),
    "int4-weight-only-int8-head": (
        _int4_int8_head,
        {"mode": "matmulnbits", "bits": 4, "lm_head_bits": 8, "block_size": 32},
    ),
    "int4-weight-only": (
        lambda a, b: quantize.quantize_weight_only(a, b, bits=4),
        {"mode": "matmulnbits", "bits": 4, "block_size": 32, "symmetric": True},
    ),
}


# Tried when no variants are named: the int8-embedding ones are asked for by name (a recipe),
# so that a default export chooses as it did before they existed.
DEFAULT_VARIANTS = tuple(name for name in VARIANTS if not name.endswith("-int8-embed"))


def _session(graph: Path, threads: int | None) -> Any:
    import onnxruntime as ort

    from edgeinfer.runtime.session import session_options

    options = session_options(RuntimeConfig(threads=threads, spin_wait=False))
    return ort.InferenceSession(
        str(graph), sess_options=options, providers=["CPUExecutionProvider"]
    )


def _decode_speed(folder: Path, prompt: list[int], threads: int | None) -> float:
    """Greedy decode tokens/s of a staged package through the runtime's own loop."""
    from edgeinfer.manifest import Manifest
    from edgeinfer.runtime.generate import Generator

    gen = Generator(
        folder,
        Manifest.read(folder),
        config=RuntimeConfig(threads=threads, spin_wait=False),
        context_length=len(prompt) + SPEED_TOKENS + 1,
    )
    token = int(np.argmax(gen.prefill(prompt)))
    started = time.perf_counter()
    for position in range(len(prompt), len(prompt) + SPEED_TOKENS):
        token = int(np.argmax(gen.decode_one_token(token, position)))
    return SPEED_TOKENS / (time.perf_counter() - started)


def export_generate(run: _Run, partial: Path) -> None:
    """The generate export, staged into ``partial`` and committed to ``run.options.out``."""
    from tokenizers import Tokenizer

    options, work, source = run.options, run.work, run.source
    tokenizer = work / package.TOKENIZER_NAME
    context = min(source.max_seq_len, MAX_PACKAGE_CONTEXT)
    with run.stage("convert"):
        model = lm.load_decoder(source)
        geo = decoder.DecoderGeometry.from_config(source.config, context_length=context)
        context = geo.context_length  # rope scaling may stop a package at the original length
        fp32 = work / "fp32.onnx"
        decoder.build_graph(lm.state_numpy(model), geo, fp32)
        tok_info = lm.prepare_decoder_tokenizer(source, tokenizer)
    io = {
        **decoder.io_fields(geo),
        "max_seq_len": context,
        "source_context_length": source.max_seq_len,
        "stop_token_ids": tok_info["stop_token_ids"],
        "add_bos_token": tok_info["add_bos_token"],
        "chat_format": tok_info["chat_format"],
        "chat_template": tok_info["chat_template"],
    }
    texts = (
        calibrate.read_text_file(options.eval_data)
        if options.eval_data
        else calibrate.builtin_text("held", min(options.held_count, MAX_HELD_TEXTS))
    )
    tok = Tokenizer.from_file(str(tokenizer))
    bos = [tok_info["tokens"]["bos"]] if tok_info["add_bos_token"] else []  # as transformers
    held = [
        (bos + ids)[: min(HELD_TOKENS, context)]
        for ids in (tok.encode(t, add_special_tokens=False).ids for t in texts)
    ]
    held = [ids for ids in held if len(ids) > 1]
    with run.stage("parity"):
        result = lm.parity(model, _session(fp32, options.threads), io, held[:2])
        run.report.variants["fp32"] = {"parity": {k: round(v, 6) for k, v in result.items()}}
        del model
    graphs = {"fp32": fp32}
    quant_info: dict[str, dict[str, Any]] = {"fp32": {"mode": "none"}}
    if options.quantize != "none":
        with run.stage("quantize"):
            for name in options.variants or DEFAULT_VARIANTS:
                build, info = VARIANTS[name]
                graphs[name] = work / f"{name}.onnx"
                build(fp32, graphs[name])
                quant_info[name] = info
    measured: dict[str, lm.LMQuality] = {}
    with run.stage("gate"):
        reference: list[np.ndarray] | None = None
        for name, graph in graphs.items():
            quality, argmax = lm.quality(_session(graph, options.threads), io, held, reference)
            reference = reference or argmax
            measured[name] = quality
            folder = work / "candidates" / name
            package.stage(
                folder,
                graph=graph,
                tokenizer=tokenizer,
                fields=run_fields(run, name, quant_info[name], io, tok_info, {}),
            )
            speed = _decode_speed(folder, held[0][:32], options.threads)
            passed = quality.passes(
                measured["fp32"],
                max_ppl_increase=GATE_MAX_PPL_INCREASE,
                min_agreement=GATE_MIN_AGREEMENT,
            )
            run.report.variants.setdefault(name, {}).update(
                precision=name,
                # The CLI's summary line reads accuracy.metric/mean/min, as for other tasks.
                accuracy={
                    "metric": "next_token_agreement",
                    "mean": round(quality.agreement, 6),
                    "min": round(quality.min_agreement, 6),
                    "perplexity": round(quality.perplexity, 4),
                    "passed": passed,
                },
                bytes=graph.stat().st_size,
                perplexity=round(quality.perplexity, 4),
                agreement=round(quality.agreement, 4),
                tokens_per_s=round(speed, 2),
                passed=passed,
            )
        chosen = _choose(run, measured)
    with run.stage("package"):
        run.report.chosen = chosen
        accuracy = {
            "metric": "perplexity+next_token_agreement",
            "reference": "onnx-fp32 (parity with pytorch-fp32 checked)",
            "eval_data": str(options.eval_data) if options.eval_data else "builtin:bbc-news-held",
            "held_tokens": measured["fp32"].tokens,
            "gate": {
                "max_perplexity_increase": GATE_MAX_PPL_INCREASE,
                "min_agreement": GATE_MIN_AGREEMENT,
            },
            "fp32": {"perplexity": measured["fp32"].perplexity},
            "value": {
                "perplexity": measured[chosen].perplexity,
                "agreement": measured[chosen].agreement,
            },
        }
        report_bytes = (json.dumps(run.report.to_dict(), indent=2) + "\n").encode()
        package.stage(
            partial,
            graph=graphs[chosen],
            tokenizer=tokenizer,
            fields=run_fields(run, chosen, quant_info[chosen], io, tok_info, accuracy),
            extra_files={"report.json": report_bytes},
        )
        package.commit(partial, Path(options.out), overwrite=options.overwrite)


def _choose(run: _Run, measured: dict[str, lm.LMQuality]) -> str:
    """The fastest quantized variant that passes the gate (the most accurate among those
    within 5 % of the fastest); fp32 when none is asked for; with ``keep_best`` fp32 when none
    passes."""
    variants = run.report.variants
    quantized = [n for n in measured if n != "fp32"]
    if not quantized:
        return "fp32"
    passing = [n for n in quantized if variants[n]["passed"]]
    if not passing:
        summary = ", ".join(
            f"{n}: ppl {variants[n]['perplexity']} (fp32 {variants['fp32']['perplexity']}), "
            f"agreement {variants[n]['agreement']}"
            for n in quantized
        )
        message = f"no quantized variant passes the gate ({summary})"
        if run.options.keep_best:
            run.report.warnings.append(f"{message}; --keep-best kept fp32")
            return "fp32"
        raise AccuracyGateError(message + "; pass --keep-best to ship fp32")
    fastest = max(float(variants[n]["tokens_per_s"]) for n in passing)
    # Speeds within 5 % are timing noise on a busy machine: take the more accurate of those.
    close = [n for n in passing if variants[n]["tokens_per_s"] >= SPEED_TIE * fastest]
    best = max(close, key=lambda n: float(variants[n]["agreement"]))
    speedup = variants[best]["tokens_per_s"] / variants["fp32"]["tokens_per_s"]
    variants[best]["speedup_vs_fp32"] = round(speedup, 3)
    if speedup < 1.0:
        slower = f"{best} decodes slower than fp32 on this machine ({speedup:.2f}x)"
        if not run.options.force_quantize:
            raise SlowerQuantizationError(f"{slower}; pass --force-quantize to ship it anyway")
        run.report.warnings.append(f"{slower}; shipped anyway (--force-quantize)")
    return best


def run_fields(
    run: _Run,
    precision: str,
    quantization: dict[str, Any],
    io: dict[str, Any],
    tok_info: dict[str, Any],
    accuracy: dict[str, Any],
) -> dict[str, Any]:
    """The manifest fields of a generate package."""
    from edgeinfer.export.pipeline import _versions

    return {
        "name": run.source.name,
        "task": "generate",
        "source": run.source_info,
        "created_by": _versions(),
        "target": run.options.target,
        "precision": precision,
        "quantization": quantization,
        "providers": list(run.quant.providers),
        "io": io,
        "tokens": tok_info["tokens"],
        "accuracy": accuracy,
    }
