"""The export turns a jinja chat template into the runtime's structured form, or ships the
jinja source when the template is not one pattern per message."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edgeinfer.errors import MissingDependencyError
from edgeinfer.export.decoder.chat_template import chat_format
from edgeinfer.runtime.generate.chat import render_chat

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from build_tiny_decoder import CHAT_TEMPLATE

sys.path.pop(0)

# The export's template conversion (chat_format) imports transformers: not for the fast lane.
pytestmark = pytest.mark.slow


def test_chatml_template_becomes_a_pattern_with_default_system() -> None:
    fmt = chat_format(CHAT_TEMPLATE)
    assert fmt["message"] == "<|im_start|>{role}\n{content}<|im_end|>\n"
    assert fmt["default_system"] == "You are a tiny test model"
    assert fmt["generation_prompt"] == "<|im_start|>assistant\n"
    text = render_chat(
        fmt, [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "x"}]
    )
    assert text.startswith("<|im_start|>system\nBe brief<|im_end|>\n")


def test_role_dependent_template_ships_as_jinja() -> None:
    llama2_style = (
        "{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
        "{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
    )
    fmt = chat_format(llama2_style)
    assert fmt == {"jinja": llama2_style, "context": {}}
    assert render_chat(fmt, [{"role": "user", "content": "hi"}]) == "[INST] hi [/INST]"


def test_jinja_form_without_jinja2_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "jinja2", None)  # import jinja2 -> ImportError
    with pytest.raises(MissingDependencyError, match="edgeinfer\\[chat\\]"):
        render_chat({"jinja": "{{ messages[0]['content'] }}"}, [{"role": "user", "content": "x"}])
