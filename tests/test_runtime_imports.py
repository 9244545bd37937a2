"""``import fleetenv`` stays cheap: no mcp, httpx, httpx2 or fleet-python at import time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("mcp", "httpx", "httpx2", "fleet")

PROBE = (
    "import json, sys\n"
    "{imports}\n"
    "print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy}))))\n"
)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "imports",
    ["import fleetenv", "import fleetenv.runtime", "import fleetenv.mcp"],
)
def test_import_does_not_pull_heavy_dependencies(imports: str) -> None:
    code = PROBE.format(imports=imports, heavy=list(HEAVY))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=25
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
