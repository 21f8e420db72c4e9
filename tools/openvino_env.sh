#!/usr/bin/env bash
# A separate virtual environment for the OpenVINO execution provider, idempotently:
#   - the onnxruntime-openvino wheel ships its own `onnxruntime` module (a full ORT build with
#     the OpenVINO provider compiled in), so it cannot share an environment with the plain
#     `onnxruntime` wheel: whichever is installed last overwrites the other's files;
#   - edgeinfer's runtime dependencies only (numpy, tokenizers, typer, rich): no torch, no export;
#   - edgeinfer itself through a .pth link to this checkout, so the venv always runs the current
#     code and installing it never writes build metadata into the source tree.
# Usage: tools/openvino_env.sh  (then: .venv-openvino/bin/python -m edgeinfer inspect PKG ...)
# Override the folder with EDGEINFER_OPENVINO_VENV and the wheel version with ORT_OPENVINO_VERSION.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${EDGEINFER_OPENVINO_VENV:-.venv-openvino}
PY=${PYTHON:-python3}
# 1.24.1 is the newest onnxruntime-openvino on PyPI; it bundles the OpenVINO runtime libraries.
VERSION=${ORT_OPENVINO_VERSION:-1.24.1}

stamp="$VENV/.edgeinfer-openvino-setup"
if [ -f "$stamp" ] && [ "$stamp" -nt tools/openvino_env.sh ] && [ "$(cat "$stamp")" = "$VERSION" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" "onnxruntime-openvino==$VERSION" "numpy>=1.24" "tokenizers>=0.15" "typer>=0.29" "rich>=13"
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
pwd >"$site/edgeinfer-checkout.pth"
"$VENV/bin/python" - <<'PY'
import onnxruntime as ort

providers = ort.get_available_providers()
if "OpenVINOExecutionProvider" not in providers:
    raise SystemExit(f"onnxruntime-openvino installed but the provider is missing: {providers}")
print(f"openvino_env: onnxruntime {ort.__version__}, providers {providers}")
PY
echo "$VERSION" >"$stamp"
echo "openvino_env: ready ($VENV)"
