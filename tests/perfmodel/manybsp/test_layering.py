"""The Many-BSP core knows nothing of HTTP (STYLE.md: data flows one way)."""

from __future__ import annotations

import subprocess
import sys


def test_manybsp_imports_no_http_layer() -> None:
    code = (
        "import sys, perfmodel.manybsp;"
        "bad = [m for m in ('fastapi', 'starlette', 'app') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
