"""The golden run (tests/golden/golden_run.py) gives the same rows and final weights as the
recorded digest: bit for bit where the values are not the policy's floats, within the measured
rounding gap between x86 boxes where they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.golden.golden_run import RECORDED, differences, run_golden

pytestmark = pytest.mark.slow


def test_golden_run_matches_the_recorded_digest(tmp_path: Path) -> None:
    recorded = json.loads(RECORDED.read_text())
    assert differences(recorded, run_golden(tmp_path)) == []
