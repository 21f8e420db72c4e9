"""A decoder package's io for tests that build a KV cache or a prefix store without a graph."""

from __future__ import annotations

from edgeinfer.package_io import DecoderIO


def decoder_io(*, layers: int, kv_heads: int, head_dim: int) -> DecoderIO:
    """The io of a decoder with this KV geometry (the graph fields are placeholders)."""
    return DecoderIO(
        graph="model.onnx",
        tokenizer="tokenizer.json",
        inputs=(),
        outputs=(),
        max_seq_len=64,
        num_layers=layers,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=16,
        context_length=64,
        source_context_length=64,
        kv_layout="shared-buffer",
        past_names=tuple((f"past.{i}.key", f"past.{i}.value") for i in range(layers)),
        present_names=tuple((f"present.{i}.key", f"present.{i}.value") for i in range(layers)),
        stop_token_ids=(0,),
    )
