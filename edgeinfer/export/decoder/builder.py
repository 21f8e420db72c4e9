"""Decoders for generation: source -> fp32 graph (``graph.py``) -> parity with PyTorch ->
quantized variants (``variants.py``) -> quality (perplexity, next-token agreement vs the
fp32 graph, against the gate of the variant's weight width) and decode speed of every variant;
the fastest that passes ships. Every graph is written with its weights in an aligned external
file (``package.externalize``), which onnxruntime maps instead of copying.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.config import RuntimeConfig, SamplingConfig
from edgeinfer.errors import ConfigError
from edgeinfer.export import package
from edgeinfer.export.builder import Builder
from edgeinfer.export.context import Candidate
from edgeinfer.export.data.text import builtin_text, read_text_file
from edgeinfer.export.decoder import lm
from edgeinfer.export.decoder.chat_template import PROBES
from edgeinfer.export.decoder.graph import DecoderGeometry, build_graph
from edgeinfer.export.decoder.light_tokenizer import LIGHT_TOKENIZER_NAME, write_light_tokenizer
from edgeinfer.export.decoder.variants import DEFAULT_VARIANTS, GATES, VARIANTS
from edgeinfer.export.gates.language import LMQuality, next_token
from edgeinfer.export.options import DecoderOptions
from edgeinfer.package_io import DecoderIO
from edgeinfer.runtime.generate.chat import render_chat

__all__ = ["GATE_MAX_PPL_INCREASE", "GATE_MIN_AGREEMENT", "DecoderBuilder"]

GATE_MAX_PPL_INCREASE = GATES[8].max_ppl_increase  # the int8 gate: +3 % perplexity at most
GATE_MIN_AGREEMENT = GATES[8].min_agreement  # and 95 % greedy next-token agreement at least
# KV for 2048 tokens of SmolLM2-135M is 94 MB fp32: the context a small device can afford;
# the model's own window (8192) is recorded in the manifest as source_context_length.
MAX_PACKAGE_CONTEXT = 2048
HELD_TOKENS = 256  # tokens per held text: long enough for perplexity, short enough to run fast
MAX_HELD_TEXTS = 32  # 32 x 256 tokens ~ 8k positions: agreement resolved to ~0.1 %
SPEED_TOKENS = 16  # decode steps timed per variant and round
SPEED_ROUNDS = 5  # interleaved rounds: the median of 5 resists a busy machine's bursts
SPEED_TIE = 0.95  # variants decoding within 5 % of the fastest count as equally fast
PROBE_TOKENS = 8  # decode steps per unit of the speed guard
LIGHT_CHECK_TEXTS = 32  # calibration texts the light tokenizer must also agree on (~30 ms)
PARITY = lm.PARITY_MAX_ABS_LOGIT
HALF_KV_PARITY = 0.25


def _session(graph: Path, threads: int | None) -> Any:
    import onnxruntime as ort

    from edgeinfer.runtime.session import session_options

    options = session_options(RuntimeConfig(threads=threads, spin_wait=False))
    return ort.InferenceSession(
        str(graph), sess_options=options, providers=["CPUExecutionProvider"]
    )


def _generator(folder: Path, threads: int | None, context_length: int) -> Any:
    from edgeinfer.manifest import Manifest
    from edgeinfer.runtime.generate.generator import Generator

    return Generator(
        folder,
        Manifest.read(folder),
        config=RuntimeConfig(threads=threads, spin_wait=False, warmup_runs=0),
        context_length=context_length,
    )


def _decode(gen: Any, prompt: list[int], steps: int) -> list[float]:
    """Greedy tokens after ``prompt`` through the engine that serves the package (``steps``
    + 1 tokens, eos not honoured); when each came (``time.perf_counter``)."""
    seq = gen.engine.submit(
        prompt, max_new_tokens=steps + 1, sampling=SamplingConfig(), stop_token_ids=frozenset()
    )
    list(seq)
    times: list[float] = seq.token_s
    return times


def _decode_speeds(
    folders: dict[str, Path], prompt: list[int], threads: int | None
) -> dict[str, float]:
    """Greedy decode tokens/s of staged packages through the path that serves them (the
    generator's engine): interleaved rounds (a busy machine slows every variant alike), the
    median of each."""
    gens = {
        name: _generator(f, threads, len(prompt) + SPEED_TOKENS + 1) for name, f in folders.items()
    }
    rates: dict[str, list[float]] = {name: [] for name in gens}
    try:
        for gen in gens.values():
            _decode(gen, prompt, 2)  # first-run allocations stay out of the timing
        for _ in range(SPEED_ROUNDS):
            for name, gen in gens.items():
                times = _decode(gen, prompt, SPEED_TOKENS)
                rates[name].append(SPEED_TOKENS / (times[-1] - times[0]))
    finally:
        for gen in gens.values():
            gen.close()
    return {name: float(np.median(r)) for name, r in rates.items()}


def _gate(name: str) -> Any:
    """The gate a candidate answers to: its variant's (fp32: the int8 gate, passed trivially)."""
    return VARIANTS[name].gate if name in VARIANTS else GATES[8]


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
            geo = DecoderGeometry.from_config(source.config, context_length=context)
            context = geo.context_length  # rope scaling may stop a package at the original length
            self.context = context
            raw_graph = work / "fp32.onnx"
            self.kv_dtype = opts.kv_dtype if opts else "float32"
            build_graph(lm.state_numpy(model), geo, raw_graph, kv_dtype=self.kv_dtype)
            fp32_files = package.externalize(raw_graph, work / "variants" / "fp32")
            fp32_graph = fp32_files[package.GRAPH_NAME]
            self.tok_info = lm.prepare_decoder_tokenizer(source, self.tokenizer)
        texts = self._held_texts()
        self.held = self._held_ids(texts)
        self.light = self._light_tokenizer(texts)
        self.io = self._io(fp32_graph, geo, context)
        fp32 = self._candidate("fp32", fp32_files, {"mode": "none"})
        with run.stage("parity"):
            result = lm.parity(
                model,
                _session(fp32_graph, run.threads),
                self.io,
                self.held[:2],
                # float16 attention moves logits by a few 1e-2 (random tiny models the most)
                max_abs_logit=HALF_KV_PARITY if self.kv_dtype == "float16" else PARITY,
            )
            run.note("fp32", parity={k: round(v, 6) for k, v in result.items()})
            del model
        fp32.requested = run.quant.mode == "none"
        run.add(fp32)
        if run.quant.mode != "none":
            with run.stage("quantize"):
                skipped = {}
                for name in variants:
                    variant, graph = VARIANTS[name], work / f"{name}.onnx"
                    reason = variant.unsuitable(raw_graph) if variant.unsuitable else None
                    if reason is not None:
                        skipped[name] = reason
                        run.note(name, skipped=reason)
                        continue
                    variant.build(raw_graph, graph)
                    files = package.externalize(graph, work / "variants" / name)
                    graph.unlink()
                    run.add(self._candidate(name, files, variant.info, requested=True))
                if len(skipped) == len(variants):
                    raise ConfigError(
                        "no requested variant applies to this model: "
                        + "; ".join(f"{k}: {v}" for k, v in skipped.items())
                        + f"; the default ones are {', '.join(DEFAULT_VARIANTS)}"
                    )
        raw_graph.unlink()
        with run.stage("measure"):
            self._measure_all()

    def _held_texts(self) -> list[str]:
        opts = self.run.options
        if opts.eval_data:
            return read_text_file(opts.eval_data)
        return builtin_text("held", min(opts.held_count, MAX_HELD_TEXTS))

    def _held_ids(self, texts: list[str]) -> list[list[int]]:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(self.tokenizer))
        info = self.tok_info
        bos = [info.tokens["bos"]] if info.add_bos_token and info.tokens["bos"] is not None else []
        held = [
            (bos + ids)[: min(HELD_TOKENS, self.context)]
            for ids in (tok.encode(t, add_special_tokens=False).ids for t in texts)
        ]
        return [ids for ids in held if len(ids) > 1]

    def _light_tokenizer(self, held: list[str]) -> Path | None:
        """The package's SentencePiece model when the source has one that tokenizes the
        export's texts (held, calibration, the chat probes rendered) as tokenizer.json."""
        model = self.tok_info.sentencepiece
        if model is None:
            return None
        chat = self.tok_info.chat_format
        texts = [
            *held,
            *builtin_text("calibration", LIGHT_CHECK_TEXTS),
            *(render_chat(chat, messages) for messages in PROBES if chat),
        ]
        path = self.run.work / LIGHT_TOKENIZER_NAME
        shipped = write_light_tokenizer(model, path, reference=self.tokenizer, texts=texts)
        return path if shipped else None

    def _io(self, graph: Path, geo: DecoderGeometry, context: int) -> DecoderIO:
        inputs, outputs = package.read_io(graph)
        fields = io_fields(geo, kv_dtype=self.kv_dtype)
        return DecoderIO(
            graph=package.GRAPH_NAME,
            tokenizer=package.TOKENIZER_NAME,
            inputs=inputs,
            outputs=outputs,
            max_seq_len=context,
            source_context_length=self.run.source.max_seq_len,
            stop_token_ids=self.tok_info.stop_token_ids,
            chat_format=self.tok_info.chat_format,
            chat_template=self.tok_info.chat_template,
            add_bos_token=self.tok_info.add_bos_token,
            num_layers=fields["num_layers"],
            num_kv_heads=fields["num_kv_heads"],
            head_dim=fields["head_dim"],
            vocab_size=fields["vocab_size"],
            context_length=fields["context_length"],
            kv_layout=fields["kv_layout"],
            past_names=tuple(tuple(p) for p in fields["past_names"]),
            present_names=tuple(tuple(p) for p in fields["present_names"]),
            kv_dtype=fields["kv_dtype"],
            logits_input=fields["logits_input"],
            argmax_output=fields["argmax_output"],
            extra_row_input=fields["extra_row_input"],
            light_tokenizer=LIGHT_TOKENIZER_NAME if self.light else None,
        )

    def _candidate(
        self,
        name: str,
        files: dict[str, Path],
        quantization: dict[str, Any],
        *,
        requested: bool = False,
    ) -> Candidate:
        """A variant: its graph files with the fp32 graph's io (quantization keeps the inputs
        and outputs)."""
        return Candidate(
            name=name,
            precision=name,
            files={**files, **self._tokenizer_files()},
            io=self.io,
            quantization=quantization,
            tokens=dict(self.tok_info.tokens),
            requested=requested,
        )

    def _tokenizer_files(self) -> dict[str, Path]:
        light = {LIGHT_TOKENIZER_NAME: self.light} if self.light else {}
        return {package.TOKENIZER_NAME: self.tokenizer, **light}

    def _measure_all(self) -> None:
        """Perplexity and agreement (teacher-forced, vs the fp32 graph), size and speed."""
        run = self.run
        reference: list[np.ndarray] | None = None
        self.qualities: dict[str, LMQuality] = {}
        for name, candidate in run.candidates.items():
            graph = candidate.files[package.GRAPH_NAME]
            session = _session(graph, run.threads)
            quality, argmax = lm.quality(session, self.io, self.held, reference)
            reference = reference or argmax
            self.qualities[name] = quality
            fp32, gate = self.qualities["fp32"], _gate(name)
            verdict = next_token(
                quality,
                fp32,
                max_ppl_increase=gate.max_ppl_increase,
                min_agreement=gate.min_agreement,
            )
            run.measured(
                candidate,
                verdict,
                f"{name}: perplexity {quality.perplexity:.4f} (fp32 {fp32.perplexity:.4f}), "
                f"next-token agreement {quality.agreement:.4f}",
                perplexity=round(quality.perplexity, 4),
            )
            tokenizers = self._tokenizer_files()
            size = sum(f.stat().st_size for n, f in candidate.files.items() if n not in tokenizers)
            run.note(name, bytes=size)
        folders = {name: run.stage_candidate(c) for name, c in run.candidates.items()}
        for name, speed in _decode_speeds(folders, self.held[0][:32], run.threads).items():
            run.note(name, tokens_per_s=round(speed, 2))

    def prefer(self, passing: list[Candidate]) -> Candidate:
        """The fastest variant; among those within 5 % of it (timing noise on a busy machine),
        the smallest package (what a small board can hold), then the most accurate."""
        variants = self.run.report.variants
        fastest = max(float(variants[c.name]["tokens_per_s"]) for c in passing)
        close = [c for c in passing if variants[c.name]["tokens_per_s"] >= SPEED_TIE * fastest]
        return min(close, key=lambda c: (variants[c.name]["bytes"], -c.measured.score))

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
                "max_perplexity_increase": _gate(chosen.name).max_ppl_increase,
                "min_agreement": _gate(chosen.name).min_agreement,
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


def io_fields(geo: DecoderGeometry, *, kv_dtype: str = "float32") -> dict[str, Any]:
    """The manifest's decoder ``io`` fields: geometry and the names ``build_graph`` gives the
    KV inputs/outputs, the logits input, the argmax output and the extra-row switch."""
    return {
        "kv_dtype": kv_dtype,
        "num_layers": geo.layers,
        "num_kv_heads": geo.kv_heads,
        "head_dim": geo.head_dim,
        "vocab_size": geo.vocab,
        "context_length": geo.context_length,
        "kv_layout": "shared-buffer",  # past and present are bound to one preallocated buffer
        "past_names": [
            [f"past_key_values.{i}.key", f"past_key_values.{i}.value"] for i in range(geo.layers)
        ],
        "present_names": [[f"present.{i}.key", f"present.{i}.value"] for i in range(geo.layers)],
        "logits_input": "logits_to_keep",
        "argmax_output": "next_tokens",
        "extra_row_input": "extra_row",
    }
