"""The golden run (tests/golden/golden_run.py) gives the same rows and final weights, bit for
bit, as the digest recorded before the house was rebuilt by role: moving code between rooms
changed no behaviour."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.golden.golden_run import RECORDED, run_golden

pytestmark = pytest.mark.slow


def test_golden_run_is_bit_identical(tmp_path: Path) -> None:
    recorded = json.loads(RECORDED.read_text())
    now = run_golden(tmp_path)
    assert now["checkpoint"] == recorded["checkpoint"]
    for part, columns in recorded["rows"].items():
        moved = [name for name, value in columns.items() if now["rows"][part][name] != value]
        assert moved == [], f"{part}: these step-row columns changed: {moved}"
    assert now["rows"].keys() == recorded["rows"].keys()
    moved = [name for name, value in recorded["weights"].items() if now["weights"][name] != value]
    assert moved == [], f"final weights changed in: {moved}"
