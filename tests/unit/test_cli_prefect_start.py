"""A first run whose temporary Prefect server starts too slowly ends with the setting to raise
(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS) instead of a bare traceback; any other
error of the flow is left alone."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import flows.evaluate
import flows.train
from flows.cli import app

# What Prefect 3.9 raises from the flow call when its ephemeral server did not answer in time
# (seen with PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=1 on a busy machine).
PREFECT_ERROR = "Timed out while attempting to connect to ephemeral Prefect API server."
COMMANDS = [("train", flows.train, "train"), ("eval", flows.evaluate, "evaluate")]


@pytest.mark.parametrize(("command", "module", "flow"), COMMANDS)
def test_prefect_start_timeout_says_which_setting_to_raise(
    command: str, module, flow: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def slow_start(*args):
        raise RuntimeError(PREFECT_ERROR + " Ephemeral server process exited with code 1.")

    monkeypatch.setattr(module, flow, slow_start)
    result = CliRunner().invoke(app, [command, "--config", "smoke"], env={"COLUMNS": "300"})
    assert result.exit_code == 1, result.output
    assert PREFECT_ERROR in result.output and "Traceback" not in result.output
    assert "export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120" in result.output


def test_other_flow_errors_are_not_dressed_as_a_prefect_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args):
        raise RuntimeError("warm-up has no demonstration to learn from")

    monkeypatch.setattr(flows.train, "train", broken)
    result = CliRunner().invoke(app, ["train", "--config", "smoke"])
    assert isinstance(result.exception, RuntimeError)
    assert "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" not in result.output
