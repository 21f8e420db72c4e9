"""A decoder's quality on held text, teacher-forced: next-token agreement with the fp32 graph
and perplexity against fp32's, each with the bar its variant's gate names."""

from __future__ import annotations

from dataclasses import dataclass

from edgeinfer.export.gates.verdict import OutputScore, Verdict

__all__ = ["LMQuality", "next_token"]


@dataclass(frozen=True)
class LMQuality:
    """What one variant measured on the held text.

    ``perplexity`` is exp(mean next-token NLL); ``agreement`` the share of positions whose
    argmax equals the fp32 graph's argmax (1.0 for fp32 itself); ``min_agreement`` the lowest
    agreement of one held text; ``tokens`` the positions scored.
    """

    perplexity: float
    agreement: float
    tokens: int
    min_agreement: float = 1.0


def next_token(
    quality: LMQuality, fp32: LMQuality, *, max_ppl_increase: float, min_agreement: float
) -> Verdict:
    """Passes when agreement is at least ``min_agreement`` and perplexity within
    ``max_ppl_increase`` (a fraction) of fp32's. The perplexity score is fp32's perplexity over
    the variant's (1.0: as fp32, lower: worse), so that both read like every other score."""
    agreement = OutputScore(
        output="next_token",
        metric="next_token_agreement",
        reason="decoder: teacher-forced argmax against the fp32 graph's at every position",
        value=quality.agreement,
        count=quality.tokens,
        parity=quality.agreement == 1.0,
        floor=min_agreement,
        details={"min_text_agreement": round(quality.min_agreement, 6)},
    )
    perplexity = OutputScore(
        output="perplexity",
        metric="perplexity_ratio",
        reason="decoder: fp32's perplexity over the variant's on the held text",
        value=fp32.perplexity / quality.perplexity,
        count=quality.tokens,
        parity=quality.perplexity <= fp32.perplexity,
        floor=1.0 / (1.0 + max_ppl_increase),
        details={
            "perplexity": round(quality.perplexity, 4),
            "fp32_perplexity": round(fp32.perplexity, 4),
        },
    )
    return Verdict((agreement, perplexity), metric="next_token_agreement")
