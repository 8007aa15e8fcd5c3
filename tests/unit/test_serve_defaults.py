"""Servers started by steprl bind to 127.0.0.1 unless told otherwise."""

from __future__ import annotations

import inspect

from typer.testing import CliRunner

from flows import serve
from flows.cli import app


def test_python_entry_points_default_to_loopback() -> None:
    for fn in (serve.start_services, serve.serve_forever):
        assert inspect.signature(fn).parameters["host"].default == "127.0.0.1"


def test_cli_serve_defaults_to_loopback() -> None:
    help_text = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).output
    assert "127.0.0.1" in help_text
