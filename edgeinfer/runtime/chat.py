"""Chat prompts: a package's structured chat format (the manifest's form of the model's jinja
template, checked against it at export) rendered without jinja on the device."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from edgeinfer.errors import InputError

__all__ = ["Prompt", "fill_message", "render_chat"]

Prompt = str | Sequence[Mapping[str, str]]
_PLACEHOLDER = re.compile(r"\{role\}|\{content\}")


def render_chat(chat_format: Mapping[str, Any], messages: Sequence[Mapping[str, str]]) -> str:
    """Render ``messages`` with a package's structured ``chat_format`` (the manifest's form of
    the model's jinja template, checked against it at export) plus the generation prompt."""
    if not messages:
        raise InputError("messages must hold at least one message")
    parts = [str(chat_format["prefix"])]
    if messages[0].get("role") != "system" and chat_format.get("default_system") is not None:
        messages = [{"role": "system", "content": chat_format["default_system"]}, *messages]
    for message in messages:
        if not isinstance(message.get("content"), str) or not message.get("role"):
            raise InputError("each message needs a 'role' and a string 'content'")
        parts.append(fill_message(str(chat_format["message"]), message["role"], message["content"]))
    parts.append(str(chat_format["generation_prompt"]))
    return "".join(parts)


def fill_message(pattern: str, role: str, content: str) -> str:
    """``pattern`` with ``{role}`` and ``{content}`` replaced in one pass (a content holding
    "{role}" stays as it is)."""
    fields = {"{role}": role, "{content}": content}
    return _PLACEHOLDER.sub(lambda m: fields[m.group(0)], pattern)
