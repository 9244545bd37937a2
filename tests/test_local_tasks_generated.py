"""The bundled tasks.json is exactly what its generator, ``_support.generate_tasks``, produces.

Ids, counts, amounts and click coordinates in the tasks are derived from the sample apps' seed
data and UI layout; this keeps the committed JSON and the generator from drifting apart.
"""

from __future__ import annotations

import json

from _support.generate_tasks import build_tasks

from fleetenv import bundled_tasks_path


def test_bundled_tasks_match_generator() -> None:
    committed = json.loads(bundled_tasks_path().read_text())
    assert build_tasks() == committed, (
        "fleetenv/core/bundled_tasks.json is out of date with tests/_support/generate_tasks.py; "
        "run `python tests/_support/generate_tasks.py` and commit the result"
    )
