"""The package's chat format: the model's jinja template as the runtime will render it,
checked against transformers' own rendering on several conversations.

The structured form (one pattern per message, rendered without jinja on the device) is derived
when the template is that simple; any other template ships as jinja source with the special
tokens it reads (rendered with jinja2 at run time). Either way the runtime's rendering must equal
transformers' on every probe conversation, or the export fails: never a silent difference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from edgeinfer.errors import ConversionError, InputError
from edgeinfer.runtime.generate.chat import render_chat, render_jinja

__all__ = ["PROBES", "Renderer", "chat_format", "transformers_renderer"]

# messages -> the prompt text (with the generation prompt); raises on a refused conversation
Renderer = Callable[[Sequence[Mapping[str, str]]], str]

_SYS, _USER = {"role": "system", "content": "S1"}, {"role": "user", "content": "U1"}
PROBES: list[list[dict[str, str]]] = [
    [_USER],
    [_SYS, _USER],
    [_SYS, _USER, {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"}],
    [_USER, {"role": "assistant", "content": "a {content} b"}, {"role": "user", "content": "é"}],
    [{"role": "user", "content": "  padded\n"}],  # templates that trim content
]


def transformers_renderer(template: str, context: Mapping[str, Any]) -> Renderer:
    """transformers' ``render_jinja_template`` with ``context`` (the special tokens map)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    def render(messages: Sequence[Mapping[str, str]]) -> str:
        rendered: Any = render_jinja_template(  # (rendered texts, generation indices)
            conversations=[[dict(m) for m in messages]],
            chat_template=template,
            add_generation_prompt=True,
            **context,
        )
        return str(rendered[0][0])

    return render


def chat_format(
    template: str, *, context: Mapping[str, Any] | None = None, reference: Renderer | None = None
) -> dict[str, Any]:
    """The manifest's ``chat_format`` for ``template``: structured when it is one pattern per
    message, else ``{"jinja": template, "context": context}``; checked against ``reference``
    (default: transformers' renderer with ``context``) on ``PROBES``."""
    ctx = dict(context or {})
    ref = reference or transformers_renderer(template, ctx)
    try:
        fmt = _structured(template, ctx)
        _check(fmt, ref)
        return fmt
    except ConversionError:
        fmt = {"jinja": template, "context": ctx}
        _check(fmt, ref)
        return fmt


def _check(fmt: dict[str, Any], reference: Renderer) -> None:
    """``fmt`` renders every probe as ``reference`` does (or refuses the ones it refuses)."""
    for messages in PROBES:
        try:
            expected: str | None = reference(messages)
        except Exception:  # the template's raise_exception (jinja2.TemplateError) and the like
            expected = None
        try:
            got: str | None = render_chat(fmt, messages)
        except InputError:
            got = None
        if got != expected:
            raise ConversionError(
                f"the chat template renders {messages!r} as {got!r} on the device but "
                f"{expected!r} in transformers"
            )


def _render(template: str, ctx: dict[str, Any], messages: list[dict[str, str]], gen: bool) -> str:
    try:
        return render_jinja(template, messages, context=ctx, add_generation_prompt=gen)
    except InputError as exc:
        raise ConversionError(f"the chat template refuses a probe conversation: {exc}") from exc


def _structured(template: str, ctx: dict[str, Any]) -> dict[str, Any]:
    """``prefix``, one ``message`` pattern with ``{role}``/``{content}``, ``default_system``
    and ``generation_prompt``, read off renderings of probe conversations."""
    only_sys = _render(template, ctx, [_SYS], False)
    sys_user = _render(template, ctx, [_SYS, _USER], False)
    message = sys_user[len(only_sys) :]
    if not sys_user.startswith(only_sys) or message.count("user") != 1 or message.count("U1") != 1:
        raise ConversionError("the chat template is not a fixed per-message pattern")
    pattern = message.replace("user", "{role}").replace("U1", "{content}")
    sys_part = pattern.replace("{role}", "system").replace("{content}", "S1")
    if not only_sys.endswith(sys_part):
        raise ConversionError("the chat template formats the system message differently")
    prefix = only_sys[: len(only_sys) - len(sys_part)]
    generation_prompt = _render(template, ctx, [_SYS, _USER], True)[len(sys_user) :]
    user_only = _render(template, ctx, [_USER], False)
    middle = user_only[len(prefix) : len(user_only) - len(message)]
    head, _, tail = pattern.replace("{role}", "system").partition("{content}")
    default_system = middle[len(head) : len(middle) - len(tail)] if middle else None
    return {
        "prefix": prefix,
        "message": pattern,
        "default_system": default_system,
        "generation_prompt": generation_prompt,
    }
