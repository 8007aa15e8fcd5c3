"""A flow started directly (outside this folder, so without its prefect.toml) starts Prefect's
embedded server with telemetry off, unless the user set it themselves."""

from __future__ import annotations

import importlib
import os

import pytest

import flows

SETTING = "PREFECT_SERVER_ANALYTICS_ENABLED"


@pytest.mark.parametrize(("given", "seen"), [(None, "false"), ("true", "true")])
def test_flows_turn_telemetry_off_by_default(
    monkeypatch: pytest.MonkeyPatch, given: str | None, seen: str
) -> None:
    monkeypatch.delenv(SETTING, raising=False)
    if given is not None:
        monkeypatch.setenv(SETTING, given)
    importlib.reload(flows)
    assert os.environ[SETTING] == seen
