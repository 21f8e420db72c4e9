"""Compare packages on emulated aarch64 CPUs with this machine, and print the footprint.

Run by tools/check_aarch64.sh once the arm64 root and the wheel sites are ready. For each
package, tools/aarch64/worker.py runs in this machine's interpreter and, per emulated CPU, in the
arm64 root's interpreter (`qemu-aarch64-static -L ROOT ROOT/usr/bin/python3 -S`, on the lean
wheel set only). What must hold:
  - generate: the greedy tokens are equal, or part ways only at a near-tie (NEAR_TIE_LOGITS);
  - classify: the labels are equal;
  - embed, fp32: cosine >= 0.999 for every text;
  - embed, int8: with `--reference FP32_PKG`, the aarch64 vectors pass the package's own accuracy
    gate against the fp32 reference (the int8 kernels differ between x86 AVX2 and arm64, so two
    int8 runs agree only within that gate); without it, cosine >= 0.999 as for fp32.
Exit 0 ok, 1 a comparison failed, 2 a run failed.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.bench import installed
from edgeinfer.manifest import Manifest

HERE = Path(__file__).resolve().parent
WORKER = HERE / "worker.py"
# Greedy decoding may part ways only where the two best logits are this close on both machines:
# the x86 AVX2 and Arm int8 kernels round differently (MiniLM int8 cosine between them 0.989),
# so such a step is a coin toss between them; any other difference fails the check.
NEAR_TIE_LOGITS = 0.25
MIN_COSINE = 0.999
# Cosine floors of the export's gate (edgeinfer/export/passes/validate.py): mean >= 1 - loss,
# min >= 1 - 3 * loss.
MIN_COSINE_SLACK = 3.0
# The cores of the Raspberry Pi 4 (BCM2711, Cortex-A72 r0p3: no dot product, no crypto) and of
# the Raspberry Pi 5 (BCM2712, Cortex-A76 r4p1: dot product). qemu 7.2 hands the guest this
# machine's /proc/cpuinfo (x86), on which onnxruntime's cpuinfo crashes; with -L, qemu finds
# ROOT/proc/cpuinfo first, so each CPU gets a root whose cpuinfo matches the emulated core.
CPUS: dict[str, dict[str, str]] = {
    "cortex-a72": {
        "device": "Raspberry Pi 4",
        "features": "fp asimd evtstrm crc32 cpuid",
        "variant": "0x0",
        "part": "0xd08",
        "revision": "3",
    },
    "cortex-a76": {
        "device": "Raspberry Pi 5",
        "features": "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid "
        "asimdrdm lrcpc dcpop asimddp",
        "variant": "0x4",
        "part": "0xd0b",
        "revision": "1",
    },
}
MB = 1e6


# What the emulated interpreter needs from the arm64 root. Nothing else is linked: qemu looks a
# path up in the root first, so a linked /tmp (or /home) would answer readlink("/tmp") with the
# root's own folder, and realpath() of a package under this machine's /tmp (onnxruntime's check
# of external-data paths) would end inside the root, where the package is not.
_ROOT_ENTRIES = {"bin", "etc", "lib", "lib64", "sbin", "usr"}


def cpu_root(cache: Path, root: Path, cpu: str) -> Path:
    """A root for ``cpu``: links to the system folders of ``root`` plus its own cpuinfo."""
    out = cache / f"cpu-{cpu}"
    (out / "proc").mkdir(parents=True, exist_ok=True)
    for link in out.iterdir():
        if link.is_symlink() and link.name not in _ROOT_ENTRIES:
            link.unlink()  # left by an earlier layout of this cache
    for entry in root.iterdir():
        link = out / entry.name
        if entry.name in _ROOT_ENTRIES and not link.is_symlink():
            link.symlink_to(entry.resolve())
    spec = CPUS[cpu]
    blocks = [
        f"processor\t: {i}\nBogoMIPS\t: 108.00\nFeatures\t: {spec['features']}\n"
        f"CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: {spec['variant']}\n"
        f"CPU part\t: {spec['part']}\nCPU revision\t: {spec['revision']}\n"
        for i in range(os.cpu_count() or 1)
    ]
    (out / "proc" / "cpuinfo").write_text("\n".join(blocks))
    return out


def run_worker(command: list[str], env: dict[str, str], label: str) -> dict[str, Any]:
    """Run the worker; its JSON, plus ``wall_s``."""
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-3000:])
        raise SystemExit(f"check_aarch64: {label} failed (exit {done.returncode})")
    result: dict[str, Any] = json.loads(done.stdout)
    result["wall_s"] = time.perf_counter() - started
    return result


def cosines(a: Any, b: Any) -> np.ndarray:
    """Row-wise cosine of two [N, D] arrays."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (x * y).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1)


def judge(
    task: str, precision: str, x86: Any, arm: Any, reference: Any, loss: float | None
) -> tuple[bool, str]:
    """Whether the aarch64 outputs hold against this machine's, and the evidence in words."""
    if task == "generate":
        said, ok = [], True
        for ours, theirs in zip(x86, arm, strict=True):
            pairs = zip(ours["tokens"], theirs["tokens"], strict=False)
            step = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
            if step is None and len(ours["tokens"]) != len(theirs["tokens"]):
                step = min(len(ours["tokens"]), len(theirs["tokens"]))  # one stopped (eos)
            if step is None:
                said.append(f"equal {theirs['tokens']}")
                continue
            gap = max(ours["margins"][step], theirs["margins"][step])
            tie = gap < NEAR_TIE_LOGITS
            ok = ok and tie
            said.append(
                f"equal up to step {step}, then a {'near-tie' if tie else 'DIFFERENT choice'} "
                f"(top-2 logit gap {gap:.3f}, near-tie < {NEAR_TIE_LOGITS})"
            )
        return ok, "greedy tokens: " + "; ".join(said)
    if task == "classify":
        agree = sum(a == b for a, b in zip(x86, arm, strict=True))
        return agree == len(x86), f"labels equal {agree}/{len(x86)}"
    cos = cosines(x86, arm)
    said = f"cosine vs x86 min {cos.min():.6f} mean {cos.mean():.6f}"
    if precision == "fp32" or reference is None or loss is None:
        return bool(cos.min() >= MIN_COSINE), f"{said} (needs >= {MIN_COSINE})"
    ref_arm, ref_x86 = cosines(reference, arm), cosines(reference, x86)
    ok = ref_arm.mean() >= 1 - loss and ref_arm.min() >= 1 - MIN_COSINE_SLACK * loss
    return bool(ok), (
        f"{said}; vs fp32 reference: aarch64 mean {ref_arm.mean():.4f} min {ref_arm.min():.4f}, "
        f"x86 mean {ref_x86.mean():.4f} min {ref_x86.min():.4f} "
        f"(gate: mean >= {1 - loss:.3f}, min >= {1 - MIN_COSINE_SLACK * loss:.3f})"
    )


def footprint_table(sites: Path, serving: list[str]) -> tuple[list[str], dict[str, Any]]:
    """Installed sizes on aarch64: as pip resolves edgeinfer[cpu] (full) and the lean set."""
    full_path = [str(sites / "full")]
    full = installed.distribution_sizes(
        installed.requirement_closure(installed.RUNTIME_REQUIREMENT, path=full_path),
        path=full_path,
    )
    lean_path = [str(sites / "edgeinfer"), str(sites / "lean")]
    lean = {
        d.name.lower(): d for d in installed.distribution_sizes(_names(lean_path), path=lean_path)
    }
    used = {n.lower().replace("_", "-") for n in serving}
    lines = [
        "| distribution | version | pip install edgeinfer[cpu] MB | lean MB | imported |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for d in full:
        kept = lean.get(d.name.lower())
        lines.append(
            f"| {d.name} | {d.version} | {d.bytes / MB:.1f} | "
            f"{f'{kept.bytes / MB:.1f}' if kept else '—'} | "
            f"{'yes' if d.name.lower().replace('_', '-') in used else 'no'} |"
        )
    full_mb = sum(d.bytes for d in full) / MB
    lean_mb = sum(d.bytes for d in lean.values()) / MB
    lines.append(f"| **total** | | **{full_mb:.1f}** | **{lean_mb:.1f}** | |")
    data = {
        "full": [vars(d) for d in full],
        "lean": [vars(d) for d in lean.values()],
        "full_bytes": int(full_mb * MB),
        "lean_bytes": int(lean_mb * MB),
    }
    return lines, data


def _names(path: list[str]) -> list[str]:
    return [d.metadata["Name"] for d in metadata.distributions(path=path)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("packages", nargs="+", type=Path, help="packages exported on x86")
    parser.add_argument("--reference", type=Path, help="fp32 embed package to judge int8 by")
    parser.add_argument("--cpu", action="append", choices=sorted(CPUS), help="emulated core(s)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the full report here")
    parser.add_argument("--qemu", required=True)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--sites", type=Path, required=True)
    parser.add_argument("--wheels", type=Path, required=True)
    parser.add_argument("--cache", type=Path, required=True)
    args = parser.parse_args(argv)
    # Default: the Pi 5 core only; the Pi 4 core decodes ~4x slower under emulation.
    cpus = args.cpu or ["cortex-a76"]
    packages = [p.resolve() for p in args.packages]
    reference = args.reference.resolve() if args.reference else None
    if reference is not None and reference not in packages:
        packages.append(reference)

    compilers = sorted(
        p.name
        for d in ("usr/bin", "bin")
        if (args.root / d).is_dir()
        for p in (args.root / d).iterdir()
        if p.name in {"cc", "gcc", "c++", "g++", "clang", "ld"} or p.name.startswith("gcc-")
    )
    wheels = sorted(p.name for p in args.wheels.iterdir())
    print(
        f"installed from {len(wheels)} files, all wheels: "
        f"{all(w.endswith('.whl') for w in wheels)}; compilers in the arm64 root: "
        f"{', '.join(compilers) or 'none'}"
    )
    emulated_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": f"{args.sites / 'edgeinfer'}:{args.sites / 'lean'}",
        "PYTHONNOUSERSITE": "1",
        "LANG": "C.UTF-8",
    }
    results: dict[str, dict[str, Any]] = {}
    for pkg in packages:
        cmd = [str(WORKER), str(pkg), "--threads", str(args.threads)]
        results[str(pkg)] = {"x86_64": run_worker([sys.executable, *cmd], dict(os.environ), "x86")}
        for cpu in cpus:
            root = cpu_root(args.cache, args.root, cpu)
            command = [args.qemu, "-L", str(root), str(root / "usr/bin/python3"), "-S", *cmd]
            env = {**emulated_env, "QEMU_CPU": cpu}
            results[str(pkg)][cpu] = run_worker(command, env, f"{pkg.name} on {cpu}")
            sys.stderr.write(
                f"check_aarch64: {pkg.name} on {cpu}: "
                f"{results[str(pkg)][cpu]['wall_s']:.0f} s emulated\n"
            )

    ok = True
    print("\n| package | emulated CPU | result | check |\n| --- | --- | --- | --- |")
    for pkg in packages:
        runs = results[str(pkg)]
        manifest = Manifest.read(pkg)
        loss = manifest.accuracy.get("max_accuracy_loss")
        ref = results[str(reference)]["x86_64"]["outputs"] if reference is not None else None
        for cpu in cpus:
            passed, said = judge(
                manifest.task,
                manifest.precision,
                runs["x86_64"]["outputs"],
                runs[cpu]["outputs"],
                ref if pkg != reference else None,
                loss,
            )
            ok &= passed
            print(
                f"| {pkg.name} ({manifest.precision}) | {cpu} ({CPUS[cpu]['device']}) | "
                f"{said} | {'pass' if passed else 'FAIL'} |"
            )

    print("\n| package | machine | RSS serving MB | peak RSS MB | RSS after imports MB |")
    print("| --- | --- | ---: | ---: | ---: |")
    for pkg in packages:
        for machine, run in results[str(pkg)].items():
            fp = run["footprint"]
            where = "x86_64 (native)" if machine == "x86_64" else f"aarch64 {machine} (qemu)"
            print(
                f"| {pkg.name} | {where} | {fp['serving']['rss_bytes'] / MB:.0f} | "
                f"{fp['serving']['peak_rss_bytes'] / MB:.0f} | "
                f"{fp['libraries']['rss_bytes'] / MB:.0f} |"
            )

    arm_run = results[str(packages[0])][cpus[0]]
    serving = [d["name"] for d in arm_run["footprint"]["distributions"]]
    lines, sizes = footprint_table(args.sites, serving)
    print(f"\naarch64 installed size (Python {arm_run['python']}, MB = 10^6 bytes):\n")
    print("\n".join(lines))
    print(f"\naarch64 check: {'pass' if ok else 'FAIL'}")
    if args.json:
        report = {
            "passed": ok,
            "cpus": cpus,
            "results": results,
            "installed": sizes,
            "wheels": wheels,
            "compilers": compilers,
        }
        args.json.write_text(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
