#!/usr/bin/env bash
# Prove the runtime installs from stock wheels and computes the same answers on aarch64
# (Raspberry Pi 4/5, Jetson class), under emulation, with packages exported on this machine:
#   1. a minimal Debian arm64 userland (python3 + libstdc++6, no compiler), extracted by
#      mmdebstrap into .cache/aarch64/root-SUITE; qemu-user-static runs its interpreter directly
#      (`qemu-aarch64-static -L ROOT ROOT/usr/bin/python3`: no binfmt_misc, no chroot needed);
#   2. the runtime extra resolved for aarch64 from wheels only (`pip download --only-binary=:all:
#      --platform manylinux..._aarch64`, then `pip install --target`), twice: as pip resolves
#      `edgeinfer[cpu]` (what a user gets) and lean (only what the runtime imports);
#   3. tools/aarch64/check.py: each package run by the emulated interpreter (on the lean set) and
#      by this machine's, outputs compared, footprint (installed sizes, RSS) printed.
# Reruns reuse the root and the wheels (stamp files); only edgeinfer's own wheel is rebuilt.
#
# Usage: tools/check_aarch64.sh PKG... [--reference FP32_EMBED_PKG] [--cpu MODEL]... [--json OUT]
#   (see `.venv/bin/python tools/aarch64/check.py --help`). Exit 0 ok, 1 a comparison failed,
#   2 usage or setup error, 3 this machine cannot emulate aarch64 (no qemu and no apt-get).
# Environment: EDGEINFER_AARCH64_SUITE (default bookworm: Python 3.11, as Raspberry Pi OS and the
#   Debian 12 images), EDGEINFER_AARCH64_MIRROR, EDGEINFER_AARCH64_CACHE, EDGEINFER_VENV.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${EDGEINFER_VENV:-.venv}
SUITE=${EDGEINFER_AARCH64_SUITE:-bookworm}
MIRROR=${EDGEINFER_AARCH64_MIRROR:-}  # empty: mmdebstrap's default Debian mirror
CACHE=${EDGEINFER_AARCH64_CACHE:-.cache/aarch64}
PY="$VENV/bin/python"
log() { echo "check_aarch64: $*" >&2; }
started=$(date +%s)

[ -x "$PY" ] || { log "no $PY: run tools/setup.sh first"; exit 2; }

qemu_bin() { command -v qemu-aarch64-static || command -v qemu-aarch64 || true; }
if [ -z "$(qemu_bin)" ] || ! command -v mmdebstrap >/dev/null 2>&1; then
  if ! command -v apt-get >/dev/null 2>&1; then
    log "cannot emulate aarch64 here: qemu-aarch64-static or mmdebstrap missing and no apt-get"
    exit 3
  fi
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  log "installing qemu-user-static and mmdebstrap"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq qemu-user-static mmdebstrap >/dev/null
fi
QEMU=$(qemu_bin)
[ -n "$QEMU" ] || { log "qemu-user-static installed no qemu-aarch64 binary"; exit 3; }

# 1. The arm64 userland. extract: unpack python3, libstdc++6 (onnxruntime and numpy link it)
# and their dependencies; no maintainer script runs, so no emulation is needed to build it.
ROOT="$CACHE/root-$SUITE"
INCLUDE="python3,libstdc++6"
root_key="$SUITE ${MIRROR:-default} $INCLUDE"
if [ ! -f "$ROOT/.edgeinfer-stamp" ] || [ "$(cat "$ROOT/.edgeinfer-stamp")" != "$root_key" ]; then
  log "building the Debian $SUITE arm64 userland in $ROOT"
  rm -rf "$ROOT"
  mkdir -p "$CACHE"
  mmdebstrap --quiet --variant=extract --architectures=arm64 --include="$INCLUDE" \
    "$SUITE" "$ROOT" ${MIRROR:+"$MIRROR"} >"$CACHE/mmdebstrap.log" 2>&1 \
    || { tail -20 "$CACHE/mmdebstrap.log" >&2; exit 2; }
  echo "$root_key" >"$ROOT/.edgeinfer-stamp"
fi
PYVER=$(basename "$(ls -d "$ROOT"/usr/lib/python3.[0-9]* | sort -V | tail -1)")  # python3.11
PYNUM=${PYVER#python}

# 2. Wheels for aarch64, resolved on this machine. The same numpy, onnxruntime and tokenizers
# versions as this machine's runtime, so that a difference in outputs is the CPU's, not a version's.
WHEELS="$CACHE/wheels-$PYVER"
SITES="$CACHE/site-$PYVER"
"$PY" - >"$CACHE/constraints.txt" <<'EOF'
import importlib.metadata as md
for name in ("numpy", "onnxruntime", "tokenizers"):
    print(f"{name}=={md.version(name)}")
EOF
target=(--only-binary=:all: --implementation cp --python-version "$PYNUM"
        --abi "cp${PYNUM/./}" --platform manylinux2014_aarch64 --platform manylinux_2_28_aarch64)
pip=("$PY" -m pip --disable-pip-version-check)
wheel_key=$(cat pyproject.toml "$CACHE/constraints.txt" tools/check_aarch64.sh | sha256sum | cut -c1-16)
own="$CACHE/own-wheel"
rm -rf "$own" && mkdir -p "$own"
build_isolation=(--no-build-isolation)
"$PY" -c "import setuptools" 2>/dev/null || build_isolation=()
"${pip[@]}" wheel --quiet --no-deps "${build_isolation[@]}" -w "$own" . >"$CACHE/pip.log" 2>&1 \
  || { tail -20 "$CACHE/pip.log" >&2; exit 2; }
if [ ! -f "$SITES/.edgeinfer-stamp" ] || [ "$(cat "$SITES/.edgeinfer-stamp")" != "$wheel_key" ]; then
  log "downloading aarch64 wheels for edgeinfer[cpu] (cp${PYNUM/./})"
  rm -rf "$WHEELS" "$SITES"
  mkdir -p "$WHEELS" "$SITES"
  cp "$own"/*.whl "$WHEELS/"
  {
    # The wheel's own path: a project of the same name on the index must not stand in for it.
    "${pip[@]}" download "${target[@]}" -c "$CACHE/constraints.txt" -d "$WHEELS" \
      "$(ls "$WHEELS"/edgeinfer-*.whl)[cpu]"
    # Full: what `pip install edgeinfer[cpu]` puts on a device.
    "${pip[@]}" install "${target[@]}" --no-index --find-links "$WHEELS" --target "$SITES/full" \
      "$(ls "$WHEELS"/edgeinfer-*.whl)[cpu]"
    # Lean: only the distributions the runtime imports (the emulated runs use this set).
    "${pip[@]}" install "${target[@]}" --no-index --find-links "$WHEELS" --target "$SITES/lean" \
      --no-deps -c "$CACHE/constraints.txt" numpy onnxruntime tokenizers
  } >>"$CACHE/pip.log" 2>&1 || { grep -v "is ignored" "$CACHE/pip.log" | tail -20 >&2; exit 2; }
  echo "$wheel_key" >"$SITES/.edgeinfer-stamp"
fi
sdists=$(find "$WHEELS" -maxdepth 1 -type f ! -name '*.whl' | wc -l)
[ "$sdists" -eq 0 ] || { log "non-wheel files in $WHEELS"; exit 2; }
rm -rf "$SITES/edgeinfer"
"${pip[@]}" install --quiet --no-deps --target "$SITES/edgeinfer" "$own"/*.whl >>"$CACHE/pip.log" 2>&1 \
  || { tail -20 "$CACHE/pip.log" >&2; exit 2; }
log "setup took $(( $(date +%s) - started )) s; $("$QEMU" --version | head -1)"

# 3. Run, compare, measure.
exec "$PY" tools/aarch64/check.py --qemu "$QEMU" --root "$ROOT" --sites "$SITES" \
  --wheels "$WHEELS" --cache "$CACHE" "$@"
