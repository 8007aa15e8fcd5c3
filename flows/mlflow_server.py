"""The MLflow server `steprl serve` starts: `mlflow server` itself, whose basic-auth app is
served behind the per-client limit on failed logins (`agent_core.serving.login_limit`).
`python -m flows.mlflow_server <mlflow server options>`.
"""

from __future__ import annotations

import sys
from typing import Any

from agent_core.serving.login_limit import FailedLoginLimit

LIMITED_APP = "flows.mlflow_server:limited_basic_auth_app"


def limited_basic_auth_app() -> Any:
    """MLflow's basic-auth app (what `--app-name basic-auth` serves) behind the limit; uvicorn
    calls this factory in the server's process."""
    from mlflow.server.auth import create_app

    return FailedLoginLimit(create_app())


def main(argv: list[str] | None = None) -> None:
    """Run `mlflow server` with these options; with `--app-name basic-auth` it serves the
    limited app. MLflow finds an app by its entry point name and, for that name only, first
    creates the admin user: keeping the name and swapping the app it resolves to keeps both."""
    import mlflow.server
    from mlflow.cli import cli

    find_app = mlflow.server._find_app
    mlflow.server._find_app = lambda name: LIMITED_APP if name == "basic-auth" else find_app(name)
    cli(["server", *(sys.argv[1:] if argv is None else argv)], prog_name="mlflow")


if __name__ == "__main__":
    main()
