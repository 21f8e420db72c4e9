"""The bridge's memory under hostile and oversized requests: VmHWM and VmRSS of a real
``edgeinfer serve`` process (its own mosquitto on loopback) before and after each attack.

    python benchmarks/hostile_memory.py --package PKG [--json out.json]

Attacks, each followed by a good request that must be answered:
1. a 200 MB request (over MQTT v5's Maximum Packet Size the bridge asks for: the broker drops it);
2. a 1 MB request (over the packet size too);
3. a 250 KB request with a bad field (parsed, answered ``bad_request``);
4. one valid request of 64 texts of ~3,900 characters (answered; runs bounded by tokens);
5. 500 fuzz-like poison messages (huge integers, wrong types, huge shapes).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from mqtt_roundtrip import bridge, client, mosquitto

from edgeinfer.bridge.wire import protocol as proto

POISON = [
    b'{"id": "p", "text": "x", "deadline_ms": 1%s}' % (b"0" * 400),
    b'{"id": "p", "image": {"format": ["jpeg"], "data": "AAAA"}}',
    b'{"id": "p", "inputs": {"x": {"dtype": "float32", "shape": [0, 9223372036854775807], '
    b'"data": ""}}}',
    b'{"id": "p", "prompt": "x", "sampling": {"temperature": 1e-39}}',
    b'{"id": "p", "text": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
]


def memory_mb(pid: int) -> dict[str, float]:
    """VmHWM (peak) and VmRSS (now) of ``pid`` in MB."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":")[0]
        if key in ("VmHWM", "VmRSS"):
            out[key] = round(int(line.split()[1]) / 1024, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", type=Path, required=True, help="a text package (MiniLM)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    model = args.package.resolve().name
    rows: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="edgeinfer-hostile-") as tmp,
        mosquitto(Path(tmp)) as broker,
        bridge(args.package, broker, 32, 2, None) as proc,
        client(broker, "hostile-bench") as device,
    ):
        device.request(model, text="warm up", attempt_timeout_s=1.0, retries=120, backoff=1.0)

        def attack(name: str, payloads: list[bytes], expect: str | None) -> None:
            before = memory_mb(proc.pid)
            codes: list[str] = []
            for payload in payloads:
                future = device.send_raw(model, payload, attempt_timeout_s=10.0)
                if expect is None:  # dropped by the broker: no reply will come
                    continue
                reply = future.result(timeout=60)
                codes.append("ok" if reply["ok"] else reply["error"]["code"])
            good = device.request(model, text="still serving?")
            after = memory_mb(proc.pid)
            rows.append(
                {
                    "attack": name,
                    "replies": sorted(set(codes)) or ["none (dropped by the broker)"],
                    "good_request_after": "ok" if good["ok"] else good["error"]["code"],
                    "before_mb": before,
                    "after_mb": after,
                }
            )

        texts = [f"reading {i} " * 350 for i in range(64)]
        attack("200 MB request", [b" " * (200 << 20)], None)
        attack("1 MB request", [b" " * (1 << 20)], None)
        attack("250 KB bad request", [b'{"id": "b", "texts": 3, "pad": "' + b"a" * 250_000 + b'"}'],
               proto.BAD_REQUEST)  # fmt: skip
        attack("64 texts x 3,900 chars", [json.dumps({"id": "t", "texts": texts}).encode()], "ok")
        attack("500 poison messages", POISON * 100, proto.BAD_REQUEST)
    out = {"rows": rows}
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
