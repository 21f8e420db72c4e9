"""Structured pruning of a BERT-family encoder: attention heads and FFN neurons ranked by
importance on calibration text and removed (``--prune-heads F``, ``--prune-ffn F``).

Importance is what a unit adds to the residual stream, averaged over the real tokens of the
calibration batches: for a head, the norm of its context vectors after the output projection
(its slice of ``W_O``); for an FFN neuron, its mean absolute activation times the norm of its
output weights. A unit that contributes nothing can be removed without changing the output.
Every layer loses the same number of heads and neurons: the configuration stays one number per
model (``intermediate_size``, ``pruned_heads``) and ONNX Runtime's attention fusion applies to
every layer. A short recovery distillation (``distill.train``) follows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgeinfer.errors import ConfigError
from edgeinfer.export.encoder.students.distill import Batch, encoder_layers

__all__ = ["importance", "prune"]


def importance(model: Any, batches: list[Batch]) -> tuple[Any, Any]:
    """(head importance [L, H], FFN neuron importance [L, I]) on ``batches``."""
    import torch

    layers = encoder_layers(model)
    heads = int(layers[0].attention.self.num_attention_heads)
    head_size = int(layers[0].attention.self.attention_head_size)
    head_score = torch.zeros(len(layers), heads)
    ffn_score = torch.zeros(len(layers), layers[0].intermediate.dense.out_features)
    mask: list[Any] = []  # the current batch's attention mask [B, S], for the hooks

    def on_context(index: int) -> Callable[..., None]:
        def hook(module: Any, args: tuple[Any, ...]) -> None:
            context = args[0]  # [B, S, H * d]: every head's output before W_O
            weight = module.weight  # [D, H * d]
            for h in range(heads):
                part = slice(h * head_size, (h + 1) * head_size)
                added = context[..., part] @ weight[:, part].T  # [B, S, D]
                head_score[index, h] += _token_mean(added.norm(dim=-1), mask[0])

        return hook

    def on_ffn(index: int) -> Callable[..., None]:
        def hook(module: Any, args: tuple[Any, ...]) -> None:
            active = args[0].abs()  # [B, S, I]: the neurons' activations
            per_neuron = (active * mask[0].unsqueeze(-1)).sum((0, 1)) / mask[0].sum()
            ffn_score[index] += per_neuron * module.weight.norm(dim=0)  # weight: [D, I]

        return hook

    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.attention.output.dense.register_forward_pre_hook(on_context(i)))
        handles.append(layer.output.dense.register_forward_pre_hook(on_ffn(i)))
    try:
        with torch.inference_mode():
            for batch in batches:
                mask[:] = [batch.attention_mask.float()]
                model(
                    input_ids=batch.input_ids,
                    attention_mask=batch.attention_mask,
                    token_type_ids=torch.zeros_like(batch.input_ids),
                )
    finally:
        for handle in handles:
            handle.remove()
    return head_score, ffn_score


def _token_mean(values: Any, mask: Any) -> Any:
    """Mean of ``values`` [B, S] over real tokens (``mask`` [B, S] of 0/1)."""
    return (values * mask).sum() / mask.sum()


def prune(
    model: Any, scores: tuple[Any, Any], *, heads_fraction: float, ffn_fraction: float
) -> dict[str, int]:
    """Remove the least important ``heads_fraction`` of every layer's heads and
    ``ffn_fraction`` of its FFN neurons, in place; returns what is left per layer."""

    head_score, ffn_score = scores
    layers = encoder_layers(model)
    heads, neurons = head_score.shape[1], ffn_score.shape[1]
    drop_heads = round(heads_fraction * heads)
    keep_neurons = neurons - round(ffn_fraction * neurons)
    if drop_heads >= heads or keep_neurons < 1:
        raise ConfigError("pruning must leave at least one head and one FFN neuron per layer")
    if drop_heads:
        model.prune_heads(
            {i: head_score[i].argsort()[:drop_heads].tolist() for i in range(len(layers))}
        )
    if keep_neurons < neurons:
        for i, layer in enumerate(layers):
            keep = ffn_score[i].argsort(descending=True)[:keep_neurons].sort().values
            layer.intermediate.dense = _rows(layer.intermediate.dense, keep)
            layer.output.dense = _columns(layer.output.dense, keep)
        model.config.intermediate_size = keep_neurons
    return {"heads": heads - drop_heads, "ffn": keep_neurons}


def _rows(linear: Any, keep: Any) -> Any:
    """A copy of ``linear`` producing only the outputs ``keep``."""
    import torch

    out = torch.nn.Linear(linear.in_features, len(keep))
    with torch.no_grad():
        out.weight.copy_(linear.weight[keep])
        out.bias.copy_(linear.bias[keep])
    return out


def _columns(linear: Any, keep: Any) -> Any:
    """A copy of ``linear`` reading only the inputs ``keep``."""
    import torch

    out = torch.nn.Linear(len(keep), linear.out_features)
    with torch.no_grad():
        out.weight.copy_(linear.weight[:, keep])
        out.bias.copy_(linear.bias)
    return out
