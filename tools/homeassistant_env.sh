#!/usr/bin/env bash
# A separate virtual environment with a real Home Assistant core, for
# tests/interop/test_homeassistant_core.py, idempotently:
#   - Home Assistant pins every dependency in its own package_constraints.txt (shipped inside its
#     wheel): the wheel is downloaded first, that file read from it, and the install made under
#     it, so the core runs with the versions it was released with;
#   - 2024.3.3 is the last release that runs on Python 3.11 (2024.4 needs 3.12);
#   - the requirements of the integrations Home Assistant always sets up, and of mqtt (paho-mqtt
#     1.6.1) and mqtt_statestream, are installed here, so that it runs with --skip-pip and never
#     reaches a registry itself;
#   - josepy<2: acme (a Home Assistant dependency, through hass-nabucasa) imports josepy APIs
#     that josepy 2 removed, and the constraints file does not pin it.
# Usage: tools/homeassistant_env.sh  (then: .venv-homeassistant/bin/hass --version)
# Override the folder with EDGEINFER_HA_VENV and the version with HOMEASSISTANT_VERSION.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${EDGEINFER_HA_VENV:-.venv-homeassistant}
PY=${PYTHON:-python3}
VERSION=${HOMEASSISTANT_VERSION:-2024.3.3}

stamp="$VENV/.edgeinfer-homeassistant-setup"
if [ -f "$stamp" ] && [ "$stamp" -nt tools/homeassistant_env.sh ] && [ "$(cat "$stamp")" = "$VERSION" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
wheels="$VENV/wheels"
mkdir -p "$wheels"
"$VENV/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
  "homeassistant==$VERSION" -d "$wheels"
constraints="$VENV/package_constraints.txt"
"$VENV/bin/python" - "$wheels" "$VERSION" "$constraints" <<'PY'
import sys
import zipfile
from pathlib import Path

wheels, version, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
(wheel,) = wheels.glob(f"homeassistant-{version}-*.whl")
with zipfile.ZipFile(wheel) as archive:
    out.write_bytes(archive.read("homeassistant/package_constraints.txt"))
PY
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -c "$constraints")
"${pip[@]}" "$wheels"/homeassistant-"$VERSION"-*.whl "josepy<2"
# What Home Assistant's own installer would fetch at its first start: the requirements of the
# integrations it always sets up (bootstrap's lists) and of mqtt and mqtt_statestream, with
# their dependencies and after-dependencies (imported too), read from each manifest.json.
mapfile -t requirements < <("$VENV/bin/python" - <<'PY'
import json
from pathlib import Path

from homeassistant import bootstrap, components

root = Path(components.__file__).parent
wanted = [
    *bootstrap.CORE_INTEGRATIONS, *bootstrap.LOGGING_INTEGRATIONS,
    *bootstrap.DEFAULT_INTEGRATIONS, "mqtt", "mqtt_statestream",
]
seen, requirements = set(), set()
while wanted:
    domain = wanted.pop()
    manifest_path = root / domain / "manifest.json"
    if domain in seen or not manifest_path.is_file():
        continue
    seen.add(domain)
    manifest = json.loads(manifest_path.read_text())
    requirements.update(manifest.get("requirements", []))
    wanted.extend([*manifest.get("dependencies", []), *manifest.get("after_dependencies", [])])
print("\n".join(sorted(requirements)))
PY
)
# numpy: PyTurboJPEG (camera's requirement) imports it without declaring it.
"${pip[@]}" "${requirements[@]}" numpy
"$VENV/bin/hass" --version
echo "$VERSION" >"$stamp"
echo "homeassistant_env: ready ($VENV)"
