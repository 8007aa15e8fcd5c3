"""`settle_heap` sets glibc's mmap and trim thresholds at process start, leaving
each alone where the user's environment sets it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agent_core.core import heap

GLIBC = os.uname().sysname == "Linux"
SETTLE = (
    "import json; from agent_core.core.heap import settle_heap; print(json.dumps(settle_heap()))"
)


def _settled(env: dict[str, str]) -> dict[str, int]:
    """What `settle_heap` sets in a fresh process with `env` (mallopt is process-wide)."""
    out = subprocess.run(
        [sys.executable, "-c", SETTLE], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")
def test_both_settings_are_set_at_start() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    assert _settled(env) == {
        "MALLOC_MMAP_THRESHOLD_": heap.MMAP_THRESHOLD,
        "MALLOC_TRIM_THRESHOLD_": heap.TRIM_THRESHOLD,
    }


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")
def test_a_users_environment_variable_wins() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    assert _settled({**env, "MALLOC_MMAP_THRESHOLD_": "65536"}) == {
        "MALLOC_TRIM_THRESHOLD_": heap.TRIM_THRESHOLD
    }
