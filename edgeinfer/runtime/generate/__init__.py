"""Text generation on a decoder package: ``Generator`` (``generator.py``: prompts, streamed
text, the prefix KV cache) over the decoding loop (``decoding.py``: sessions, the in-place KV
cache of ``kvcache.py``, sampling, prompt lookup), with chat rendering (``chat.py``), streaming
(``streaming.py``) and the on-disk prefix store (``prefix_store.py``). docs/generation.md."""

from edgeinfer.runtime.generate.generator import Generator

__all__ = ["Generator"]
