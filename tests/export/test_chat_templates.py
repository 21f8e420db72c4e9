"""Chat templates render on the device exactly as transformers' ``apply_chat_template`` renders
them, text and token ids: Zephyr/TinyLlama (``eos_token``), Llama 3 and Mistral (``{{ bos_token
}}`` first), ChatML (the tiny model's), Gemma (roles renamed, system folded into the first turn);
plain prompts get BOS when the tokenizer adds one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer, processors

from edgeinfer.config import RuntimeConfig
from edgeinfer.export.decoder.lm import prepare_decoder_tokenizer
from edgeinfer.export.options import ExportOptions
from edgeinfer.export.run import export
from edgeinfer.export.source import resolve_source
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.generate import Generator
from edgeinfer.runtime.generate.chat import render_chat

ZEPHYR = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
    "{{ '<|user|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'system' %}\n"
    "{{ '<|system|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'assistant' %}\n"
    "{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n"
    "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
    "{% endfor %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] + '\n\n' %}{% set rest = messages[1:] %}"
    "{% else %}{% set system = '' %}{% set rest = messages %}{% endif %}"
    "{% for message in rest %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + (system if loop.first else '')"
    " + message['content'] + ' [/INST]' }}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{% set first_user_prefix = messages[0]['content'] + '\n\n' %}"
    "{% set loop_messages = messages[1:] %}{% else %}{% set first_user_prefix = '' %}"
    "{% set loop_messages = messages %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
# BOS first, trimmed content (so: the jinja form), only tokens the tiny model can embed.
BOS_FIRST = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] + ': ' + m['content'] | trim }}"
    "{{ eos_token + '\n' }}{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)
# name -> (template, bos, eos, add_bos_token, the template's own special tokens)
TEMPLATES: dict[str, tuple[str, str, str, bool, list[str]]] = {
    "zephyr": (ZEPHYR, "<s>", "</s>", True, ["<|user|>", "<|system|>", "<|assistant|>"]),
    "llama3": (
        LLAMA3,
        "<|begin_of_text|>",
        "<|eot_id|>",
        True,
        ["<|start_header_id|>", "<|end_header_id|>"],
    ),
    "mistral": (MISTRAL, "<s>", "</s>", True, ["[INST]", "[/INST]"]),
    "chatml": (None, "<|im_start|>", "<|im_end|>", False, []),  # type: ignore[dict-item]
    "gemma": (GEMMA, "<bos>", "<eos>", True, ["<start_of_turn>", "<end_of_turn>"]),
    "bos-first": (BOS_FIRST, "<|im_start|>", "<|im_end|>", True, []),
}
CONVERSATIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "Name three rivers."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
    [
        {"role": "system", "content": "You answer in French."},
        {"role": "user", "content": "What is the capital of Italy?"},
        {"role": "assistant", "content": "Rome."},
        {"role": "user", "content": " And of Spain? \n"},
    ],
]


def _source(tiny_source: Path, root: Path, name: str) -> Path:
    """The tiny model with ``name``'s template, special tokens and BOS rule."""
    template, bos, eos, add_bos, extra = TEMPLATES[name]
    folder = root / name
    shutil.copytree(tiny_source, folder)
    if template is None:  # the tiny model's own ChatML template
        return folder
    tok = Tokenizer.from_file(str(tiny_source / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True) for t in (bos, eos, *extra)])
    if add_bos:  # as Llama's and Gemma's tokenizer.json: BOS before every encoded text
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A",
            pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, tok.token_to_id(bos))],
        )
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "chat_template": template,
        "bos_token": bos,
        "eos_token": eos,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def templated(tiny_source: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("templates")
    return {name: _source(tiny_source, root, name) for name in TEMPLATES}


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_device_rendering_equals_transformers(
    name: str, templated: dict[str, Any], tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    folder = templated[name]
    info = prepare_decoder_tokenizer(resolve_source(str(folder)), tmp_path / "tokenizer.json")
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(str(folder))
    for messages in CONVERSATIONS:
        expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        text = render_chat(info.chat_format, messages)
        assert text == expected
        ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        assert tok.encode(text, add_special_tokens=False).ids == list(ids)
    assert info.add_bos_token == TEMPLATES[name][3]
    # only the one-pattern-per-message templates go without jinja on the device
    assert ("jinja" in info.chat_format) == (name not in ("chatml", "zephyr"))


def test_bos_template_package_prompts_match_transformers(
    templated: dict[str, Any], tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    folder = templated["bos-first"]
    out = tmp_path / "bos-first-package"
    export(ExportOptions(source=str(folder), out=out, quantize="none", held_count=2, threads=1))
    gen = Generator(out, Manifest.read(out), config=RuntimeConfig(threads=1), context_length=96)
    hf = AutoTokenizer.from_pretrained(str(folder))
    chat = CONVERSATIONS[1]
    expected = hf.apply_chat_template(chat, tokenize=True, add_generation_prompt=True)
    assert gen.encode(chat) == list(expected)
    assert gen.encode(chat)[0] == hf.bos_token_id  # the BOS {{ bos_token }} writes
    assert gen.encode("The market rose") == hf("The market rose").input_ids  # BOS added
    assert gen.generate(chat, max_new_tokens=4).prompt_tokens == len(expected)


def test_generation_config_end_of_turn_stops_generation(
    templated: dict[str, Any], tmp_path: Path
) -> None:
    folder = tmp_path / "gemma-it"
    shutil.copytree(templated["gemma"], folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    eos, end_of_turn = tok.token_to_id("<eos>"), tok.token_to_id("<end_of_turn>")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, end_of_turn]}))
    info = prepare_decoder_tokenizer(resolve_source(str(folder)), tmp_path / "tokenizer.json")
    assert {eos, end_of_turn} <= set(info.stop_token_ids)
