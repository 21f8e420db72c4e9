"""Chat prompts: a package's chat format rendered on the device exactly as transformers'
``apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`` renders the
model's template (checked at export on several conversations).

Two forms in the manifest's ``chat_format``:

- structured (``prefix``, a per-message ``message`` pattern with ``{role}``/``{content}``,
  ``default_system``, ``generation_prompt``): rendered without jinja, for the templates that are
  one pattern per message (ChatML and the like);
- ``{"jinja": template, "context": {bos_token, eos_token, ...}}``: every other template (role-
  dependent markers, trimmed content, BOS from ``{{ bos_token }}``), rendered with jinja2 in
  transformers' environment: a sandbox with ``trim_blocks``/``lstrip_blocks``, loop controls,
  ``raise_exception``, ``strftime_now``, a ``tojson`` that keeps non-ASCII, and the tokenizer's
  special tokens. jinja2 is then needed on the device (``pip install 'edgeinfer[chat]'``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from edgeinfer.errors import InputError, MissingDependencyError

__all__ = ["Prompt", "fill_message", "render_chat", "render_jinja"]

Prompt = str | Sequence[Mapping[str, str]]
_PLACEHOLDER = re.compile(r"\{role\}|\{content\}")


def render_chat(chat_format: Mapping[str, Any], messages: Sequence[Mapping[str, str]]) -> str:
    """Render ``messages`` with a package's ``chat_format`` plus the generation prompt."""
    if not messages:
        raise InputError("messages must hold at least one message")
    for message in messages:
        if not isinstance(message.get("content"), str) or not message.get("role"):
            raise InputError("each message needs a 'role' and a string 'content'")
    if "jinja" in chat_format:
        return render_jinja(
            str(chat_format["jinja"]),
            messages,
            context=chat_format.get("context") or {},
            add_generation_prompt=True,
        )
    parts = [str(chat_format["prefix"])]
    if messages[0].get("role") != "system" and chat_format.get("default_system") is not None:
        messages = [{"role": "system", "content": chat_format["default_system"]}, *messages]
    for message in messages:
        parts.append(fill_message(str(chat_format["message"]), message["role"], message["content"]))
    parts.append(str(chat_format["generation_prompt"]))
    return "".join(parts)


def fill_message(pattern: str, role: str, content: str) -> str:
    """``pattern`` with ``{role}`` and ``{content}`` replaced in one pass (a content holding
    "{role}" stays as it is)."""
    fields = {"{role}": role, "{content}": content}
    return _PLACEHOLDER.sub(lambda m: fields[m.group(0)], pattern)


def render_jinja(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    context: Mapping[str, Any],
    add_generation_prompt: bool,
) -> str:
    """Render a jinja chat template as transformers does (its environment and globals;
    ``context`` holds the special tokens: ``bos_token``, ``eos_token``, ...).

    Raises:
        MissingDependencyError: jinja2 is not installed.
        InputError: the template refused the conversation (its ``raise_exception``).
    """
    try:
        import jinja2
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as exc:
        raise MissingDependencyError("jinja2", "chat") from exc

    class _Generation(Extension):
        """``{% generation %}...{% endgeneration %}`` (assistant-mask markers) renders its
        body, as in transformers when no mask is asked for."""

        tags = {"generation"}  # noqa: RUF012  # jinja's Extension API: a class attribute

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_body")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return str(
            env.from_string(template).render(
                messages=[dict(m) for m in messages],
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **context,
            )
        )
    except jinja2.exceptions.TemplateError as exc:
        raise InputError(f"the chat template refused these messages: {exc}") from exc
