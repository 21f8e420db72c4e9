"""Generation on a device: the runtime's generate path loads no export-only package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

FORBIDDEN = ("torch", "transformers", "optimum", "onnx", "jinja2")


def test_generating_imports_no_export_packages(fast_decoder: Path) -> None:
    code = (
        "import sys\n"
        "from edgeinfer.config import RuntimeConfig\n"
        "from edgeinfer.manifest import Manifest\n"
        "from edgeinfer.runtime.generate import Generator\n"
        f"p = {str(fast_decoder)!r}\n"
        "g = Generator(p, Manifest.read(p), config=RuntimeConfig(threads=1), context_length=64)\n"
        "g.generate([{'role': 'user', 'content': 'hi'}], max_new_tokens=3)\n"
        f"print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
