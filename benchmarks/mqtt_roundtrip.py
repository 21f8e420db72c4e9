"""MQTT bridge benchmark on loopback: overhead, store-replay throughput, and a bounded load test.

It starts its own mosquitto (a generated config, a free 127.0.0.1 port, TCP_NODELAY) and runs
``edgeinfer serve`` as a separate process, then measures:

1. **overhead**: sequential QoS 1 round trips; bridge overhead = round trip - ``compute_ms`` (the
   model call the bridge reports), p50/p99. Everything else (paho, broker, encoding, queueing,
   two network hops each way) is the overhead. Measured with JSON, and with MsgPack when
   ``msgpack`` is installed (a 384-float embedding: ~0.6 ms of JSON work vs ~0.04 ms). Also
   ``replay_round_trip_ms``: the same finished id re-sent sequentially, answered from the
   de-dup store without the worker hop or compute: the floor of the MQTT path; and
   ``handoff_queue_ms``: the reply's ``queue_ms`` (requests are sequential, so the queue is empty
   and this is the paho thread -> worker hand-off alone).
2. **answers without compute**: ``replay`` re-sends one request id, answered from the bridge's
   de-duplication store; ``cached`` (with ``--cache``, which turns on the bridge's reply cache)
   sends new ids with a text already answered: each is answered in paho's thread from the
   reply cache, without the worker hop or the model (pipelined, several connections).
   ``overhead`` also runs JSON with ``"encoding": "float32-base64"`` vectors.
3. **load**: N closed-loop clients for D seconds (default 50 for 60 s) with a 1 s deadline each;
   the bridge's RSS and queue depth are sampled every second; it stops by itself.

Usage::

    python benchmarks/mqtt_roundtrip.py --package PKG [--requests 2000] [--clients 50]
        [--seconds 60] [--json out.json] [--phases overhead,replay,cached,load] [--cache]

Without ``--package`` it exports MiniLM int8 to a temporary folder first (needs the export extra).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from edgeinfer.bench.stats import summarize
from edgeinfer.bridge import Client, Connection
from edgeinfer.bridge.wire import protocol as proto
from edgeinfer.bridge.wire.protocol import msgpack_available

LOOPBACK = "127.0.0.1"
DEVICE = "bench"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 15) -> None:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if proc.poll() is not None:
            raise RuntimeError("mosquitto exited at start")
        try:
            socket.create_connection((LOOPBACK, port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError("mosquitto did not start")


@contextmanager
def mosquitto(workdir: Path) -> Iterator[str]:
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    port = free_port()
    config = workdir / "mosquitto.conf"
    import pwd

    config.write_text(
        "\n".join(
            [
                f"user {pwd.getpwuid(os.getuid()).pw_name}",
                "set_tcp_nodelay true",
                "persistence false",
                "max_queued_messages 100000",
                "max_inflight_messages 0",
                f"listener {port} {LOOPBACK}",
                "allow_anonymous true",
            ]
        )
        + "\n"
    )
    proc = subprocess.Popen(
        [binary, "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_port(port, proc)
        yield f"mqtt://{LOOPBACK}:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def bridge(
    package: Path, broker: str, max_queue: int, threads: int, cache_dir: Path | None
) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edgeinfer",
            "serve",
            str(package),
            "--broker",
            broker,
            "--device-id",
            DEVICE,
            "--client-id",
            "bench-bridge",
            "--max-queue",
            str(max_queue),
            "--metrics-interval-s",
            "1",
            "--threads",
            str(threads),
            *(["--cache", "--cache-dir", str(cache_dir)] if cache_dir else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(60)


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def client(broker: str, name: str, fmt: str = "json") -> Client:
    return Client(
        connection=Connection(broker=broker, client_id=name), device_id=DEVICE, fmt=fmt
    ).connect()


def stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "mean": None}
    summary = summarize(values)
    return {"p50": summary.p50_ms, "p99": summary.p99_ms, "mean": summary.mean_ms}


def phase_overhead(
    broker: str, model: str, requests: int, fmt: str, encoding: str = "shortest"
) -> dict[str, Any]:
    fields = None if encoding == "shortest" else {"encoding": encoding}
    with client(broker, f"bench-seq-{fmt}-{encoding}", fmt) as c:
        # Retries on until the bridge has subscribed (its first session starts empty).
        c.request(model, text="warm up", attempt_timeout_s=1.0, retries=120, backoff=1.0)
        for i in range(50):
            c.request(model, text=f"warm up {i}")
        rtt, compute, queued = [], [], []
        for i in range(requests):
            started = time.perf_counter()
            reply = c.request(
                model, text=f"sensor reading number {i}: pressure nominal", fields=fields
            )
            rtt.append((time.perf_counter() - started) * 1e3)
            compute.append(float(reply["compute_ms"]))
            queued.append(float(reply["queue_ms"]))  # sequential: the paho -> worker hand-off
        # The same finished id, sequentially: answered from the de-dup store in paho's thread,
        # so no worker hop and no compute: the floor of the MQTT path (same reply size).
        content_type = proto.CONTENT_MSGPACK if fmt == "msgpack" else None
        payload = proto.encode({"id": "floor", "text": "floor"}, fmt=fmt)
        c.send_raw(model, payload, content_type=content_type).result(30)
        floor = []
        for _ in range(requests):
            started = time.perf_counter()
            c.send_raw(model, payload, content_type=content_type).result(30)
            floor.append((time.perf_counter() - started) * 1e3)
    overhead = [r - c_ for r, c_ in zip(rtt, compute, strict=True)]
    return {
        "format": fmt,
        "encoding": encoding,
        "requests": requests,
        "round_trip_ms": stats(rtt),
        "replay_round_trip_ms": stats(floor),
        "compute_ms": stats(compute),
        "handoff_queue_ms": stats(queued),
        "overhead_ms": stats(overhead),
    }


def _replay_worker(
    broker: str,
    model: str,
    requests: int,
    window: int,
    fmt: str,
    index: int,
    ready: Any,
    go: Any,
    results: Any,
    unique_ids: bool = False,
) -> None:
    """One load-generating process, ``window`` deep: ``requests`` re-sends of one finished id,
    or (``unique_ids``) new ids with a text already answered, for the result cache."""
    content_type = proto.CONTENT_MSGPACK if fmt == "msgpack" else None

    def payload_for(i: int) -> bytes:
        request_id = f"cached-{index}-{i}" if unique_ids else "replayed"
        return proto.encode({"id": request_id, "text": "answered once, replayed after"}, fmt=fmt)

    codes: Counter[str] = Counter()
    with client(broker, f"bench-replay-{index}", fmt) as c:
        ready.release()
        go.wait()
        inflight: list[Future[dict[str, Any]]] = []
        for i in range(requests + window):
            if i < requests:
                inflight.append(
                    c.send_raw(
                        model, payload_for(i), content_type=content_type, attempt_timeout_s=60
                    )
                )
            if inflight and (len(inflight) >= window or i >= requests):
                reply = inflight.pop(0).result(60)
                codes["ok" if reply["ok"] else reply["error"]["code"]] += 1
    results.put(dict(codes))


def phase_replay(
    broker: str,
    model: str,
    requests: int,
    fmt: str,
    processes: int = 2,
    window: int = 64,
    unique_ids: bool = False,
) -> dict[str, Any]:
    """Answers without compute from several client processes: from the bridge's de-dup store
    (one id re-sent), or with ``unique_ids`` from the runtime's result cache (new ids, one
    text: each still goes through the queue and a worker)."""
    payload = proto.encode({"id": "replayed", "text": "answered once, replayed after"}, fmt=fmt)
    content_type = proto.CONTENT_MSGPACK if fmt == "msgpack" else None
    with client(broker, "bench-replay-first", fmt) as first:  # the one computed answer
        assert first.send_raw(model, payload, content_type=content_type).result(30)["ok"]
    ctx = multiprocessing.get_context("spawn")  # no fork under paho's threads
    ready, go, results = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    per_process = requests // processes
    procs = [
        ctx.Process(
            target=_replay_worker,
            args=(broker, model, per_process, window, fmt, i, ready, go, results, unique_ids),
        )
        for i in range(processes)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.acquire()
    started = time.perf_counter()
    go.set()
    codes: Counter[str] = Counter()
    for _ in procs:
        codes.update(results.get(timeout=300))
    elapsed = time.perf_counter() - started
    for proc in procs:
        proc.join(30)
    total = per_process * processes
    return {
        "format": fmt,
        "requests": total,
        "seconds": elapsed,
        "answers_per_s": total / elapsed,
        "codes": dict(codes),
        "client_processes": processes,
        "window": window,
    }


def phase_load(
    broker: str, model: str, bridge_pid: int, clients_n: int, seconds: float
) -> dict[str, Any]:
    clients = [client(broker, f"bench-load-{i}") for i in range(clients_n)]
    stop = threading.Event()
    latencies: list[float] = []
    codes: Counter[str] = Counter()
    lock = threading.Lock()
    metrics: list[dict[str, Any]] = []
    watcher = client(broker, "bench-metrics")
    watcher._client.message_callback_add(  # the metrics topic, next to the reply topic
        f"edgeinfer/{DEVICE}/metrics", lambda c, u, m: metrics.append(json.loads(m.payload))
    )
    watcher._client.subscribe(f"edgeinfer/{DEVICE}/metrics", qos=0)

    def run(i: int, c: Client) -> None:
        n = 0
        while not stop.is_set():
            started = time.perf_counter()
            try:
                reply = c.request(
                    model,
                    text=f"client {i} reading {n}",
                    timeout_ms=1000,
                    attempt_timeout_s=5,
                    retries=1,
                    busy_wait_s=0,
                )
            except TimeoutError:
                with lock:
                    codes["client_timeout"] += 1
                continue
            elapsed = (time.perf_counter() - started) * 1e3
            code = "ok" if reply["ok"] else reply["error"]["code"]
            with lock:
                codes[code] += 1
                codes["cached"] += int(bool(reply.get("cached")))
                if reply["ok"]:
                    latencies.append(elapsed)
            n += 1
            if code == "busy":
                time.sleep(0.05)  # the bridge asked for a pause

    rss: list[float] = []
    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    while time.perf_counter() - started < seconds:
        time.sleep(1.0)
        value = rss_mb(bridge_pid)
        if value is not None:
            rss.append(value)
    stop.set()
    for t in threads:
        t.join(30)
    elapsed = time.perf_counter() - started
    for c in [*clients, watcher]:
        c.close()
    depths = [m["queue_depth"] for m in metrics]
    return {
        "clients": clients_n,
        "seconds": elapsed,
        "codes": dict(codes),
        "answers_per_s": codes["ok"] / elapsed,
        "latency_ms": stats(latencies),
        "bridge_rss_mb": {
            "first": rss[0] if rss else None,
            "max": max(rss, default=None),
            "last": rss[-1] if rss else None,
        },
        "queue_depth": {
            "max": max(depths, default=None),
            "max_queue": metrics[-1]["max_queue"] if metrics else None,
            "samples": len(depths),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", type=Path, help="package folder (default: export MiniLM)")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--max-queue", type=int, default=32)
    # One intra-op thread: the broker and the clients run on the same machine and need cores.
    parser.add_argument("--bridge-threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--phases",
        default="overhead,replay,load",
        help="comma-separated subset of overhead,replay,cached,load",
    )
    parser.add_argument(
        "--cache",
        action="store_true",
        help="serve with the result cache (needed by the cached phase)",
    )
    args = parser.parse_args(argv)

    formats = ["json"] + (["msgpack"] if msgpack_available() else [])
    with tempfile.TemporaryDirectory(prefix="edgeinfer-mqtt-bench-") as tmp:
        package = args.package
        if package is None:
            from edgeinfer.export.options import ExportOptions
            from edgeinfer.export.run import export

            package = Path(tmp) / "minilm-int8"
            export(ExportOptions(source="minilm", out=package, overwrite=True))
        model = package.resolve().name
        with (
            mosquitto(Path(tmp)) as broker,
            bridge(
                package,
                broker,
                args.max_queue,
                args.bridge_threads,
                Path(tmp) / "cache" if args.cache else None,
            ) as proc,
        ):
            phases = set(args.phases.split(","))
            with client(broker, "bench-wait") as c:  # until the bridge has subscribed
                c.request(model, text="warm up", attempt_timeout_s=1.0, retries=120, backoff=1.0)
            results: dict[str, Any] = {
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": sys.version.split()[0],
                    "load_average": os.getloadavg(),
                },
            }
            if "overhead" in phases:
                results["overhead"] = [
                    phase_overhead(broker, model, args.requests, fmt) for fmt in formats
                ] + [phase_overhead(broker, model, args.requests, "json", "float32-base64")]
            if "replay" in phases:
                results["store_replay"] = phase_replay(broker, model, args.requests, formats[-1])
            if "cached" in phases:
                results["result_cache"] = phase_replay(
                    broker, model, args.requests, formats[-1], unique_ids=True
                )
            if "load" in phases:
                results["load"] = phase_load(broker, model, proc.pid, args.clients, args.seconds)
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
