"""Gemma 3 270M's light tokenizer (SentencePiece ``tokenizer.model``) beside its
``tokenizer.json`` in ``tokenizers`` and llama.cpp: the same ids, the memory each holds once
loaded, encode and decode speed.

Both tokenizers are built as the export builds them (``prepare_decoder_tokenizer`` on the
``gemma3-270m`` recipe's GGUF). Texts: the export's chat probes and 100 dialogue texts rendered
through the GGUF's chat template, or Gemma's turn markup when it has none (the conversations),
and 200 held BBC texts (the ones the export never calibrates on). llama.cpp's ids come from
its server's ``/tokenize`` (the ``xllamacpp`` wheel) with special tokens parsed, as the
runtime does. Memory: one process per tokenizer, RSS and RssAnon after loading minus before
(the library imported, heap trimmed with ``release_heap`` both times), and the peak (VmHWM)
of the load. Speed: rounds interleaved across the two tokenizers, the median.

    python benchmarks/light_tokenizer.py [--gguf FILE.gguf] [--held 200] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROUNDS = 9  # timed passes over the held texts; the median is reported
# Gemma's turn markup, for a GGUF without a chat template (the 270M base model has none)
GEMMA_TURNS = {
    "prefix": "",
    "message": "<start_of_turn>{role}\n{content}<end_of_turn>\n",
    "default_system": None,
    "generation_prompt": "<start_of_turn>model\n",
}


def _status() -> dict[str, int]:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "RssAnon", "VmHWM")}


def _memory(kind: str, path: str) -> dict[str, float]:
    """(in a fresh process) what loading one tokenizer adds to RSS and RssAnon, MiB."""
    from edgeinfer.runtime import memory
    from edgeinfer.runtime.generate import lm_tokenizer

    cls = lm_tokenizer.SentencePieceTokenizer if kind == "light" else lm_tokenizer.JsonTokenizer
    __import__("sentencepiece" if kind == "light" else "tokenizers")
    memory.release_heap()
    before = _status()
    tok = cls(Path(path))
    memory.release_heap()
    after = _status()
    assert tok.encode("hello")
    mib = 2**20
    return {
        "rss_mib": round((after["VmRSS"] - before["VmRSS"]) / mib, 1),
        "rss_anon_mib": round((after["RssAnon"] - before["RssAnon"]) / mib, 1),
        "peak_mib": round((after["VmHWM"] - before["VmRSS"]) / mib, 1),
    }


def _measure_memory(kind: str, path: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--memory", kind, str(path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, float] = json.loads(out)
    return result


def _llamacpp_ids(gguf: Path, texts: list[str]) -> list[list[int]]:
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(gguf)
    params.n_ctx = 512  # only tokenizing
    server = xllamacpp.Server(params)
    url = server.listening_address.rstrip("/") + "/tokenize"
    ids = []
    for text in texts:
        body = {"content": text, "add_special": False, "parse_special": True}
        request = urllib.request.Request(
            url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request) as reply:
            ids.append(list(json.loads(reply.read())["tokens"]))
    return ids


def _speed(tokenizers: dict[str, Any], texts: list[str]) -> dict[str, dict[str, float]]:
    """µs per token of each tokenizer: encode (text -> ids), decode (ids -> text) and
    streaming (one ``decode_step`` per id); rounds interleaved across the tokenizers (a busy
    machine slows them alike), the median of each."""
    ids = {name: [tok.encode(t) for t in texts] for name, tok in tokenizers.items()}

    def stream(tok: Any, rows: list[list[int]]) -> None:
        for row in rows:
            step = tok.decode_step()
            for token in row:
                step(token)

    work = {
        "encode": lambda tok, rows: [tok.encode(t) for t in texts],
        "decode": lambda tok, rows: [tok.decode(r) for r in rows],
        "stream": stream,
    }
    runs: dict[tuple[str, str], list[float]] = {}
    for _ in range(ROUNDS):
        for what, run in work.items():
            for name, tok in tokenizers.items():
                started = time.perf_counter()
                run(tok, ids[name])
                runs.setdefault((name, what), []).append(time.perf_counter() - started)
    tokens = sum(len(r) for r in next(iter(ids.values())))
    return {
        name: {
            f"{what}_us_per_token": round(statistics.median(runs[name, what]) / tokens * 1e6, 3)
            for what in work
        }
        | {"tokens": tokens}
        for name in tokenizers
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", type=Path, help="a llama (SentencePiece) GGUF; default: Gemma 3")
    parser.add_argument("--held", type=int, default=200, help="held BBC texts")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--memory", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory:
        print(json.dumps(_memory(*args.memory)))
        return 0

    from edgeinfer.export.data.domains import dialogue_texts
    from edgeinfer.export.data.text import builtin_text
    from edgeinfer.export.decoder.chat_template import PROBES
    from edgeinfer.export.decoder.light_tokenizer import LIGHT_TOKENIZER_NAME
    from edgeinfer.export.decoder.lm import prepare_decoder_tokenizer
    from edgeinfer.export.recipes import find
    from edgeinfer.export.source import Source
    from edgeinfer.runtime.generate.chat import render_chat
    from edgeinfer.runtime.generate.lm_tokenizer import JsonTokenizer, SentencePieceTokenizer

    work = Path(tempfile.mkdtemp(prefix="light-tokenizer-"))
    if args.gguf:
        gguf = args.gguf
    else:
        recipe = find("gemma3-270m")
        assert recipe is not None
        gguf = next(recipe.locate(work).glob("*.gguf"))
    source = Source(name=gguf.stem, path=gguf.parent, config={}, max_seq_len=0, gguf_file=gguf.name)
    info = prepare_decoder_tokenizer(source, work / "tokenizer.json")
    (work / LIGHT_TOKENIZER_NAME).write_bytes(info.sentencepiece)
    chat = info.chat_format or GEMMA_TURNS
    conversations = [render_chat(chat, m) for m in PROBES] + [
        render_chat(chat, [{"role": "user", "content": t}]) for t in dialogue_texts()[:100]
    ]
    held = builtin_text("held", args.held)
    texts = conversations + held
    json_tok = JsonTokenizer(work / "tokenizer.json")
    light = SentencePieceTokenizer(work / LIGHT_TOKENIZER_NAME)
    json_ids = [json_tok.encode(t) for t in texts]
    light_ids = [light.encode(t) for t in texts]
    llama_ids = _llamacpp_ids(gguf, texts)
    result = {
        "texts": {"conversations": len(conversations), "held": len(held)},
        "tokens": sum(len(i) for i in json_ids),
        "light_equals_json": sum(a == b for a, b in zip(light_ids, json_ids, strict=True)),
        "light_equals_llamacpp": sum(a == b for a, b in zip(light_ids, llama_ids, strict=True)),
        "decode_equal": sum(light.decode(i) == json_tok.decode(i) for i in json_ids),
        "files_mb": {
            n: round((work / n).stat().st_size / 1e6, 1)
            for n in ("tokenizer.json", LIGHT_TOKENIZER_NAME)
        },
        "memory": {
            "json": _measure_memory("json", work / "tokenizer.json"),
            "light": _measure_memory("light", work / LIGHT_TOKENIZER_NAME),
        },
        "speed": _speed({"json": json_tok, "light": light}, held),
    }
    print(json.dumps(result, indent=None if args.json else 2))
    return 0 if result["light_equals_json"] == len(texts) else 1


if __name__ == "__main__":
    sys.exit(main())
