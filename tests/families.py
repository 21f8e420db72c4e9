"""Tiny random encoders of every common family, built from configs (no hub): a tokenizer
trained here on a few sentences, saved through the family's own tokenizer class (so its
tokenizer_config.json carries the family's settings), and a 2-layer model with random
weights. Used by the family export tests and tests/export/test_tokenizers.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FAMILIES = ("bert", "distilbert", "roberta", "xlm-roberta", "deberta-v2", "modernbert")
# Model inputs of at most this many tokens (every family's window, so truncation is tested).
WINDOW = 64
TEXTS = [
    "The bank raised interest rates again on Tuesday.",
    "Pump 4 reports high vibration; maintenance was called.",
    "Héllo wörld: accents, CAPITALS and   extra spaces!",
    "A small model runs on the edge device in a few milliseconds.",
    "Rain is expected tomorrow across the northern hills and valleys.",
    "The striker scored twice before half time, and the crowd cheered.",
    "Quarterly profits fell by 3.5 percent, the company said in a statement.",
    "émigré café naïve coöperate résumé",
    "Sensors on the conveyor measure temperature, speed and load every second.",
    "New phones ship with faster chips and longer battery life this year.",
] * 3
LONG = " ".join(TEXTS)  # longer than WINDOW tokens: truncated by the model's window


def _train(family: str) -> Any:
    """A tokenizers.Tokenizer of the family's kind, trained on TEXTS."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    if family in ("bert", "distilbert"):
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        trainer = trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials)
        tok.train_from_iterator(TEXTS, trainer)
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
        )
        tok.decoder = decoders.WordPiece()
        return tok
    if family in ("roberta", "modernbert"):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        specials = (
            ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
            if family == "roberta"
            else ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        )
        trainer = trainers.BpeTrainer(
            vocab_size=500,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        tok.train_from_iterator(TEXTS, trainer)
        if family == "roberta":
            tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
        else:
            tok.post_processor = processors.TemplateProcessing(
                single="[CLS] $A [SEP]",
                pair="[CLS] $A [SEP] $B [SEP]",
                special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
            )
        return tok
    # xlm-roberta, deberta-v2: sentencepiece-like unigram with a metaspace
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC()])
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    specials = (
        ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        if family == "xlm-roberta"
        else ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
    )
    trainer = trainers.UnigramTrainer(
        vocab_size=300, special_tokens=specials, unk_token=specials[3]
    )
    tok.train_from_iterator(TEXTS, trainer)
    if family == "xlm-roberta":
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>",
            pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", 0), ("</s>", 2)],
        )
    else:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", 1), ("[SEP]", 2)],
        )
    return tok


def _fast_tokenizer(family: str, tok: Any) -> Any:
    """The family's transformers tokenizer class around ``tok``, with the settings a real
    checkpoint's tokenizer_config.json carries."""
    import transformers as tf

    common: dict[str, Any] = {"tokenizer_object": tok, "model_max_length": WINDOW}
    if family == "bert":
        return tf.BertTokenizerFast(**common, do_lower_case=True)
    if family == "distilbert":  # a BERT tokenizer: it emits token_type_ids DistilBERT lacks
        return tf.BertTokenizerFast(**common, do_lower_case=True)
    if family == "roberta":  # add_prefix_space: a setting tokenizer.json alone does not hold
        return tf.RobertaTokenizerFast(**common, add_prefix_space=True)
    if family == "xlm-roberta":
        return tf.XLMRobertaTokenizerFast(**common)
    if family == "deberta-v2":
        return tf.DebertaV2TokenizerFast(**common, do_lower_case=False)
    return tf.PreTrainedTokenizerFast(
        **common,
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        unk_token="[UNK]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "attention_mask"],
    )


def _config(family: str, vocab: int, labels: int | None) -> Any:
    import transformers as tf

    size: dict[str, Any] = {"vocab_size": vocab}
    if labels is not None:
        size["num_labels"] = labels  # no id2label names: the package says LABEL_i
    if family == "distilbert":
        return tf.DistilBertConfig(
            dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=WINDOW, **size
        )
    if family == "modernbert":
        return tf.ModernBertConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=WINDOW,
            pad_token_id=0,
            cls_token_id=2,
            sep_token_id=3,
            bos_token_id=2,
            eos_token_id=3,
            global_attn_every_n_layers=2,
            local_attention=16,
            **size,
        )
    common = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        **size,
    )
    if family == "bert":
        return tf.BertConfig(max_position_embeddings=WINDOW, **common)
    if family == "deberta-v2":
        return tf.DebertaV2Config(max_position_embeddings=WINDOW, pad_token_id=0, **common)
    cls = tf.RobertaConfig if family == "roberta" else tf.XLMRobertaConfig
    # RoBERTa's positions start after the padding index: WINDOW tokens need WINDOW + 2 rows.
    return cls(max_position_embeddings=WINDOW + 2, pad_token_id=1, bos_token_id=0,
               eos_token_id=2, **common)  # fmt: skip


def build(family: str, folder: Path, *, labels: int | None = None, seed: int = 0) -> Path:
    """Save a tiny random ``family`` model (a classifier with ``labels`` classes, else a bare
    encoder) with its tokenizer into ``folder``; returns ``folder``."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    trained = _train(family)
    tokenizer = _fast_tokenizer(family, trained)
    config = _config(family, len(tokenizer), labels)
    auto = tf.AutoModelForSequenceClassification if labels else tf.AutoModel
    model = auto.from_config(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # tokenizer.json as trained: the class's settings (RoBERTa's add_prefix_space) live only
    # in tokenizer_config.json, as in checkpoints whose tokenizer.json predates them.
    trained.save(str(folder / "tokenizer.json"))
    return folder


def build_vit(folder: Path, *, labels: int = 3, seed: int = 0) -> Path:
    """A tiny random ViT image classifier (32x32 pictures, 8x8 patches) with its image
    processor config (resize to 32x32, mean and std 0.5), saved into ``folder``."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    config = tf.ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=labels,
    )
    model = tf.ViTForImageClassification(config).eval()
    with torch.no_grad():  # a random head is unsure of everything: make it decided
        model.classifier.weight.mul_(40.0)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tf.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder
