"""Decoders for generation: source -> fp32 graph (``decoder_graph``) -> parity with PyTorch ->
quantized variants -> quality (perplexity, next-token agreement vs the fp32 graph) and decode
speed of every variant; the fastest that passes ships.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import ConfigError
from edgeinfer.export import calibrate, decoder_embed, decoder_graph, lm, package, quantize
from edgeinfer.export.builders.base import Builder
from edgeinfer.export.context import Candidate, Quality
from edgeinfer.export.options import DecoderOptions
from edgeinfer.package_io import DecoderIO

__all__ = [
    "DEFAULT_VARIANTS",
    "GATE_MAX_PPL_INCREASE",
    "GATE_MIN_AGREEMENT",
    "VARIANTS",
    "DecoderBuilder",
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
PROBE_TOKENS = 8  # decode steps per unit of the speed guard

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
        mid.unlink()  # a large model's intermediate graph is most of a gigabyte

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
    # by 3/4 of the table (Gemma 3 270M: 977 -> 330 MB), decode speed unchanged.
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


def _generator(folder: Path, threads: int | None, context_length: int) -> Any:
    from edgeinfer.manifest import Manifest
    from edgeinfer.runtime.generate import Generator

    return Generator(
        folder,
        Manifest.read(folder),
        config=RuntimeConfig(threads=threads, spin_wait=False, warmup_runs=0),
        context_length=context_length,
    )


def _decode(gen: Any, prompt: list[int], steps: int) -> None:
    """Prefill ``prompt`` and decode ``steps`` greedy tokens."""
    token = int(np.argmax(gen.prefill(prompt)))
    for position in range(len(prompt), len(prompt) + steps):
        token = int(np.argmax(gen.decode_one_token(token, position)))


def _decode_speed(folder: Path, prompt: list[int], threads: int | None) -> float:
    """Greedy decode tokens/s of a staged package through the runtime's own loop."""
    gen = _generator(folder, threads, len(prompt) + SPEED_TOKENS + 1)
    _decode(gen, prompt, 2)  # first-run allocations stay out of the timing
    token = int(np.argmax(gen.prefill(prompt)))
    started = time.perf_counter()
    for position in range(len(prompt), len(prompt) + SPEED_TOKENS):
        token = int(np.argmax(gen.decode_one_token(token, position)))
    return SPEED_TOKENS / (time.perf_counter() - started)


class DecoderBuilder(Builder):
    """Llama-family decoders (a model folder or a GGUF file) into a ``decoder`` package."""

    name = "decoder"
    tasks = ("generate",)
    options_type = DecoderOptions

    def build(self) -> None:
        run = self.run
        opts = run.options.builder if isinstance(run.options.builder, DecoderOptions) else None
        variants = (opts.variants if opts else None) or DEFAULT_VARIANTS
        unknown = [v for v in variants if v not in VARIANTS]
        if unknown:
            raise ConfigError(f"unknown variants {unknown}: choose from {', '.join(VARIANTS)}")
        if run.quant.mode not in ("none", "int8"):
            raise ConfigError("decoders export fp32 (--quantize none) or int8 weight variants")
        source, work = run.source, run.work
        self.tokenizer = work / package.TOKENIZER_NAME
        wanted = opts.context_length if opts and opts.context_length else MAX_PACKAGE_CONTEXT
        context = min(source.max_seq_len, wanted)
        with run.stage("convert"):
            model = lm.load_decoder(source)
            geo = decoder_graph.DecoderGeometry.from_config(source.config, context_length=context)
            context = geo.context_length  # rope scaling may stop a package at the original length
            self.context = context
            fp32_graph = work / "fp32.onnx"
            decoder_graph.build_graph(lm.state_numpy(model), geo, fp32_graph)
            self.tok_info = lm.prepare_decoder_tokenizer(source, self.tokenizer)
        self.held = self._held_ids()
        self.io = self._io(fp32_graph, geo, context)
        fp32 = self._candidate("fp32", fp32_graph, {"mode": "none"})
        with run.stage("parity"):
            result = lm.parity(model, _session(fp32_graph, run.threads), self.io, self.held[:2])
            run.note("fp32", parity={k: round(v, 6) for k, v in result.items()})
            del model
        fp32.requested = run.quant.mode == "none"
        run.add(fp32)
        if run.quant.mode != "none":
            with run.stage("quantize"):
                for name in variants:
                    build, info = VARIANTS[name]
                    graph = work / f"{name}.onnx"
                    build(fp32_graph, graph)
                    run.add(self._candidate(name, graph, info, requested=True))
        with run.stage("measure"):
            self._measure_all()

    def _held_ids(self) -> list[list[int]]:
        from tokenizers import Tokenizer

        opts = self.run.options
        texts = (
            calibrate.read_text_file(opts.eval_data)
            if opts.eval_data
            else calibrate.builtin_text("held", min(opts.held_count, MAX_HELD_TEXTS))
        )
        tok = Tokenizer.from_file(str(self.tokenizer))
        info = self.tok_info
        bos = [info["tokens"]["bos"]] if info["add_bos_token"] else []  # as transformers
        held = [
            (bos + ids)[: min(HELD_TOKENS, self.context)]
            for ids in (tok.encode(t, add_special_tokens=False).ids for t in texts)
        ]
        return [ids for ids in held if len(ids) > 1]

    def _io(self, graph: Path, geo: decoder_graph.DecoderGeometry, context: int) -> DecoderIO:
        inputs, outputs = package.read_io(graph)
        fields = decoder_graph.io_fields(geo)
        return DecoderIO(
            graph=package.GRAPH_NAME,
            tokenizer=package.TOKENIZER_NAME,
            inputs=inputs,
            outputs=outputs,
            max_seq_len=context,
            source_context_length=self.run.source.max_seq_len,
            stop_token_ids=tuple(self.tok_info["stop_token_ids"]),
            chat_format=self.tok_info["chat_format"],
            chat_template=self.tok_info["chat_template"],
            add_bos_token=bool(self.tok_info["add_bos_token"]),
            num_layers=fields["num_layers"],
            num_kv_heads=fields["num_kv_heads"],
            head_dim=fields["head_dim"],
            vocab_size=fields["vocab_size"],
            context_length=fields["context_length"],
            kv_layout=fields["kv_layout"],
            past_names=tuple(tuple(p) for p in fields["past_names"]),
            present_names=tuple(tuple(p) for p in fields["present_names"]),
        )

    def _candidate(
        self, name: str, graph: Path, quantization: dict[str, Any], *, requested: bool = False
    ) -> Candidate:
        """A variant: its graph with the fp32 graph's io (quantization keeps the inputs and
        outputs)."""
        return Candidate(
            name=name,
            precision=name,
            files={package.GRAPH_NAME: graph, package.TOKENIZER_NAME: self.tokenizer},
            io=self.io,
            quantization=quantization,
            tokens=self.tok_info["tokens"],
            requested=requested,
        )

    def _measure_all(self) -> None:
        """Perplexity and agreement (teacher-forced, vs the fp32 graph), size and speed."""
        run = self.run
        reference: list[np.ndarray] | None = None
        self.qualities: dict[str, lm.LMQuality] = {}
        for name, candidate in run.candidates.items():
            graph = candidate.files[package.GRAPH_NAME]
            session = _session(graph, run.threads)
            quality, argmax = lm.quality(session, self.io, self.held, reference)
            reference = reference or argmax
            self.qualities[name] = quality
            fp32 = self.qualities["fp32"]
            passed = quality.passes(
                fp32, max_ppl_increase=GATE_MAX_PPL_INCREASE, min_agreement=GATE_MIN_AGREEMENT
            )
            speed = _decode_speed(run.stage_candidate(candidate), self.held[0][:32], run.threads)
            run.measured(
                candidate,
                Quality(
                    metric="next_token_agreement",
                    passed=passed,
                    score=quality.agreement,
                    summary=(
                        f"{name}: perplexity {quality.perplexity:.4f} (fp32 "
                        f"{fp32.perplexity:.4f}), next-token agreement {quality.agreement:.4f}"
                    ),
                    details={
                        "mean": round(quality.agreement, 6),
                        "min": round(quality.min_agreement, 6),
                        "perplexity": round(quality.perplexity, 4),
                    },
                ),
            )
            run.note(name, bytes=graph.stat().st_size, tokens_per_s=round(speed, 2))

    def prefer(self, passing: list[Candidate]) -> Candidate:
        """The fastest variant; among those within 5 % of it (timing noise on a busy machine),
        the most accurate."""
        variants = self.run.report.variants
        fastest = max(float(variants[c.name]["tokens_per_s"]) for c in passing)
        close = [c for c in passing if variants[c.name]["tokens_per_s"] >= SPEED_TIE * fastest]
        return max(close, key=lambda c: c.measured.score)

    def probe(self, candidate: Candidate) -> Callable[[], object]:
        prompt = self.held[0][:32]
        gen = _generator(self.run.stage_candidate(candidate), self.run.threads, 64)
        return lambda: _decode(gen, prompt, PROBE_TOKENS)

    def accuracy(self, chosen: Candidate) -> dict[str, Any]:
        opts, fp32 = self.run.options, self.qualities["fp32"]
        return {
            "metric": "perplexity+next_token_agreement",
            "reference": "onnx-fp32 (parity with pytorch-fp32 checked)",
            "eval_data": str(opts.eval_data) if opts.eval_data else "builtin:bbc-news-held",
            "held_tokens": fp32.tokens,
            "gate": {
                "max_perplexity_increase": GATE_MAX_PPL_INCREASE,
                "min_agreement": GATE_MIN_AGREEMENT,
            },
            "fp32": {"perplexity": fp32.perplexity},
            "value": {
                "perplexity": self.qualities[chosen.name].perplexity,
                "agreement": self.qualities[chosen.name].agreement,
            },
        }

    def smoke_inputs(self, chosen: Candidate) -> list[Any]:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(self.tokenizer))
        return [tok.decode(ids[:24]) for ids in self.held[:2]]
