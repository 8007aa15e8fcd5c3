"""The `steprl` command: train, eval, serve, serve-policy and runs, with rich progress for
rollouts and updates and `--set key=value` overrides validated by the config."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agent_core.config.load import load_config
from agent_core.config.presets import ConfigError
from agent_core.core import progress as progress_hooks
from agent_core.core.heap import settle_heap
from configs.run_config import RunConfig

if TYPE_CHECKING:
    from flows.train import TrainSummary

app = typer.Typer(help="steprl: step-level RL for multi-step LLM agents.", no_args_is_help=True)
console = Console(stderr=True)

CONFIG_HELP = "Preset name (configs/<name>.yaml) or a YAML file."
SET_HELP = "Override a config field, e.g. --set trainer.learning_rate=1e-5 (repeatable)."
RUN_HELP = (
    f"{CONFIG_HELP} Names the run of a checkpoint given by name (default calculator_grpo); "
    "the run's own recorded config.yaml is used unless --no-run-config."
)
# Prefect's error when the temporary API server a flow starts (no PREFECT_API_URL) did not answer
# within its startup timeout: a fresh Prefect home or a busy machine, most often the first run.
PREFECT_START_TIMEOUT = "Timed out while attempting to connect to ephemeral Prefect API server"
PREFECT_START_FIX = (
    "Prefect's temporary API server did not start within "
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS (20 s by default; slowest on a fresh "
    "Prefect home or a busy machine). Raise it and run again:\n"
    "  export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120\n"
    "or run against a Prefect server that is already up (prefect server start; then set "
    "PREFECT_API_URL)."
)


def _config(config: str, overrides: list[str]) -> RunConfig:
    try:
        return load_config(config, overrides)
    except ConfigError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None


def _run_config(
    config: str | None, checkpoint: str, overrides: list[str], use_recorded: bool
) -> RunConfig:
    """The config a checkpoint of a run is used with (`agent_core.config.recorded`), named
    on the console with the flags that override it."""
    from agent_core.config.recorded import run_config

    try:
        chosen = run_config(config, checkpoint, overrides, use_recorded)
    except ConfigError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    console.print(chosen.describe(), markup=False)
    return chosen.config


class RichProgress:
    """Progress bars for the phases agent_core reports (rollout episodes, update steps)."""

    def __init__(self) -> None:
        self.bars = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.tasks: dict[str, int] = {}

    def start(self, phase: str, total: int) -> None:
        self.tasks[phase] = self.bars.add_task(phase, total=total)

    def advance(self, phase: str, amount: int = 1) -> None:
        if phase in self.tasks:
            self.bars.advance(self.tasks[phase], amount)

    def finish(self, phase: str) -> None:
        task = self.tasks.pop(phase, None)
        if task is not None:
            self.bars.remove_task(task)


def _with_progress(fn, *args):
    """Run a flow with progress bars; a Prefect start that timed out ends with its fix."""
    sink = RichProgress()
    progress_hooks.set_sink(sink)
    try:
        with sink.bars:
            return fn(*args)
    except RuntimeError as exc:
        if PREFECT_START_TIMEOUT not in str(exc):
            raise
        console.print(f"{exc}\n\n{PREFECT_START_FIX}", style="red", markup=False)
        raise typer.Exit(1) from None
    finally:
        progress_hooks.set_sink(None)


@app.command()
def train(
    config: str = typer.Option("calculator_grpo", help=CONFIG_HELP),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Run the `train` flow (embedded Prefect, or PREFECT_API_URL when set)."""
    start = time.monotonic()  # the run's wall time: Prefect's and the flow's imports included
    from agent_core.config.recorded import check_rerun
    from flows.train import train as train_flow

    cfg = _config(config, set_)
    try:
        check_rerun(cfg)
    except ConfigError as exc:
        console.print(f"[red]{exc}[/red]", markup=False)
        raise typer.Exit(2) from None
    summary = _with_progress(train_flow, cfg)
    typer.echo(where_to_look(cfg, summary))
    if summary.iterations_run:
        record_run(cfg, config, set_, time.monotonic() - start)
    refuse_idle_run(cfg, summary)


def refuse_idle_run(config: RunConfig, summary: TrainSummary) -> None:
    """Say which iterations of this command trained nothing (no optimizer step) and why; a
    run none of whose iterations ever trained anything (this command's and those an earlier
    command ran: a resumed run that trained before does not) exits 1."""
    from agent_core.run.report import idle_message, idle_updates

    idle = idle_updates(summary.run_dir, summary.iterations_run)
    if not idle:
        return
    console.print(idle_message(idle), markup=False)
    every = list(range(1, max(summary.iterations_run) + 1))
    if len(idle_updates(summary.run_dir, every)) == len(every):
        console.print(
            f"steprl run '{config.run.name}' trained nothing: no iteration's update took an "
            "optimizer step (above: why, and the fixes)",
            style="red",
            markup=False,
        )
        raise typer.Exit(1)


def record_run(config: RunConfig, preset: str, overrides: list[str], wall_s: float) -> None:
    """Write the run's results record into its folder (`python -m bench.results add` files it
    into docs/results.md): its setting is the preset's name."""
    from agent_core.run.run_record import write_run_record

    setting = Path(preset).stem if preset.endswith((".yaml", ".yml")) else preset
    command = ["steprl", "train", "--config", preset]
    command += [word for override in overrides for word in ("--set", override)]
    path = write_run_record(config, setting, shlex.join(command), wall_s)
    typer.echo(f"results record: {path}")


@app.command("eval")
def eval_(
    config: str | None = typer.Option(None, help=RUN_HELP),
    checkpoint: str = typer.Option("latest", help="base, latest, iter_000k or a model folder."),
    run_config: bool = typer.Option(
        True,
        help="Evaluate with the config the checkpoint's run recorded (its env, tasks, tool "
        "prompt), as it was trained; --no-run-config: the --config preset instead.",
    ),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Evaluate a checkpoint on held-out tasks (its own MLflow run)."""
    from flows.evaluate import evaluate

    cfg = _run_config(config, checkpoint, set_, run_config)
    result = _with_progress(evaluate, cfg, checkpoint)
    typer.echo(json.dumps(result.model_dump(), indent=2))


@app.command()
def serve(
    preset: list[str] = typer.Option(["calculator_grpo", "smoke"], help="Presets to deploy."),
    cron: str | None = typer.Option(None, help="Cron schedule for the train deployments."),
    interval: int | None = typer.Option(None, help="Interval schedule in seconds (train)."),
    continue_for: int = typer.Option(
        0, help="Each scheduled run adds this many iterations to the same run (0 = run.iterations)."
    ),
    servers: bool = typer.Option(True, help="Start Prefect and MLflow servers (else use env)."),
    host: str = typer.Option("127.0.0.1", help="Bind address of the servers."),
    prefect_port: int = typer.Option(4200),
    mlflow_port: int = typer.Option(5000),
    auth: str | None = typer.Option(
        None,
        envvar="STEPRL_SERVE_AUTH",
        show_default=False,
        help="user:password: both servers require HTTP basic auth (give it through the "
        "environment variable, not the command line, which other users can see).",
    ),
    allowed_host: list[str] = typer.Option(
        [], help="Another name browsers and clients use for this machine (repeatable)."
    ),
    trusted_proxy: list[str] = typer.Option(
        [],
        help="Address of a reverse proxy in front of the servers whose X-Forwarded-For "
        "headers name the client (repeatable); default: none, the connection's own address "
        "counts.",
    ),
    allow_module: list[str] = typer.Option(
        [],
        help="A module (with its submodules) whose 'module:attribute' names runs started from "
        "the UI, API or a schedule may import (repeatable); default: none, only steprl's own "
        "names.",
    ),
    data_root: list[Path] = typer.Option(
        [],
        help="A folder such runs may read task files, model folders, corpora and "
        "demonstrations from (repeatable); default: only the shipped configs/data, runs/ and "
        ".models/.",
    ),
    allow_python: list[Path] = typer.Option(
        [],
        help="A Python such runs may start vLLM with (rollout.vllm.python; repeatable); "
        "default: only .vllm-venv/bin/python when `make vllm-env` made it.",
    ),
    allow_key_env: list[str] = typer.Option(
        [],
        help="An environment variable such runs may send to a policy server as its key "
        "(rollout.remote.api_key_env; repeatable); default: none.",
    ),
    allow_base_url: list[str] = typer.Option(
        [],
        help="A server (root URL, e.g. http://127.0.0.1:8000) such runs may send rollout "
        "requests to (rollout.remote.base_url; repeatable); default: none.",
    ),
) -> None:
    """Start Prefect + MLflow servers, register deployments, run them until Ctrl-C."""
    from flows.serve import check_auth, deployment_limits_from, serve_forever

    for name in preset:
        _config(name, [])
    try:
        check_auth(auth)
        limits = deployment_limits_from(
            allow_module, data_root, allow_python, allow_key_env, allow_base_url
        )
    except ValueError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    serve_forever(
        preset,
        cron,
        interval,
        continue_for,
        servers,
        host,
        prefect_port,
        mlflow_port,
        auth,
        allowed_host,
        limits,
        trusted_proxies=trusted_proxy,
    )


def _secret(flag: str, variable: str) -> str:
    """The value of environment variable `variable` ('' when not asked for); exit 2 if empty."""
    import os

    value = os.environ.get(variable, "") if variable else ""
    if variable and not value:
        console.print(f"[red]{flag} {variable}: that variable is empty[/red]")
        raise typer.Exit(2)
    return value


@app.command("serve-policy")
def serve_policy(
    config: str | None = typer.Option(None, help=RUN_HELP),
    checkpoint: str = typer.Option("latest", help="base, latest, iter_000k or a model folder."),
    run_config: bool = typer.Option(
        True,
        help="Serve with the config the checkpoint's run recorded (tool prompt, prompt "
        "limit), as it was trained; --no-run-config: the --config preset instead.",
    ),
    host: str = typer.Option("127.0.0.1", help="Bind address."),
    port: int = typer.Option(8000, help="TCP port."),
    model_name: str = typer.Option("policy", help="Model name the server lists."),
    reload_token_env: str = typer.Option(
        "",
        help="Environment variable holding the bearer token of POST /steprl/reload (a "
        "training run with rollout.engine=remote loads each checkpoint through it); "
        "unset = reloading is refused.",
    ),
    api_key_env: str = typer.Option(
        "",
        help="Environment variable holding the API key every request must send as "
        "'Authorization: Bearer <key>' (the OpenAI SDK's api_key); unset = none.",
    ),
    allowed_host: list[str] = typer.Option(
        [], help="Another name clients use for this machine in the Host header (repeatable)."
    ),
    max_prompt_tokens: int | None = typer.Option(
        None,
        help="Longest prompt served, in tokens [default: the run's rollout.max_prompt_tokens].",
    ),
    max_prompts_per_request: int = typer.Option(256, help="Most prompts x n per request."),
    max_body_bytes: int = typer.Option(4 * 2**20, help="Largest request body (413 beyond)."),
    body_timeout_s: float = typer.Option(10.0, help="Seconds a request body may take (408)."),
    max_concurrent_requests: int = typer.Option(64, help="Requests in progress (429 beyond)."),
    max_requests_per_client: int = typer.Option(
        16, help="Requests one client has in progress (429 beyond)."
    ),
    header_timeout_s: float = typer.Option(
        10.0, help="Seconds a connection may take to send a request's headers (then closed)."
    ),
    trusted_proxy: list[str] = typer.Option(
        [],
        help="Address of a reverse proxy whose X-Forwarded-For headers name the client "
        "(repeatable); default: none, the connection's own address counts.",
    ),
    default_max_tokens: int | None = typer.Option(
        None,
        help="Tokens a chat or Responses reply may take when the request sets no max_tokens "
        "[default: --max-tokens-limit].",
    ),
    max_tokens_limit: int = typer.Option(
        4096, help="Most tokens one reply may take (a request asking more gets this many)."
    ),
    preempt_after_tokens: int = typer.Option(
        8,
        help="Tokens an engine call samples before requests that wait join it at its next "
        "step (0: they wait for its end).",
    ),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Serve a checkpoint behind an OpenAI-compatible API (/v1/chat/completions, ...)."""
    from agent_core.run.serve_policy import serve_policy as serve_checkpoint
    from agent_core.serving.service import ServerSettings

    cfg = _run_config(config, checkpoint, set_, run_config)
    try:
        settings = ServerSettings(
            model_name=model_name,
            reload_token=_secret("--reload-token-env", reload_token_env),
            api_key=_secret("--api-key-env", api_key_env),
            allowed_hosts=allowed_host,
            tool_prompt=cfg.env.tool_prompt,
            roles=dict(cfg.env.roles),  # serves model="<name>:<role>" per env.roles
            max_prompt_tokens=max_prompt_tokens or cfg.rollout.max_prompt_tokens,
            max_prompts_per_request=max_prompts_per_request,
            max_body_bytes=max_body_bytes,
            body_timeout_s=body_timeout_s,
            max_concurrent_requests=max_concurrent_requests,
            max_requests_per_client=max_requests_per_client,
            header_timeout_s=header_timeout_s,
            trusted_proxies=trusted_proxy,
            default_max_tokens=default_max_tokens,
            max_tokens_limit=max_tokens_limit,
            preempt_after_tokens=preempt_after_tokens,
        )
    except ValueError as exc:  # pydantic's ValidationError is one; it names the field
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    try:
        serve_checkpoint(cfg, checkpoint, host, port, settings)
    except FileNotFoundError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None


@app.command()
def runs(output_dir: Path = typer.Option(Path("runs"), help="Folder holding the runs.")) -> None:
    """List runs with their last complete iteration and last metrics."""
    from agent_core.run.report import run_summaries

    table = Table(
        "run", "iterations", "reward/mean", "success_rate", "eval/success_rate", "MLflow run"
    )
    for s in run_summaries(output_dir):
        m = s["metrics"]
        cells = [
            f"{m[k]:.3f}" if k in m else "-"
            for k in ("reward/mean", "success_rate", "eval/success_rate")
        ]
        table.add_row(s["name"], str(s["iterations"]), *cells, s["mlflow_run_id"] or "-")
    Console().print(table)


def where_to_look(config: RunConfig, summary: TrainSummary) -> str:
    """The closing message: what ran and where its results are."""
    metrics = json.dumps({k: round(v, 4) for k, v in summary.last_metrics.items()}, indent=2)
    held_out = ""
    if summary.held_out_success:
        rates = ", ".join(f"{k}={v:.3f}" for k, v in summary.held_out_success.items())
        held_out = f"  held-out success: {rates}\n"
    nothing = ""
    if not summary.iterations_run:
        nothing = (
            f"  nothing to run: {summary.run_dir} already holds every iteration up to "
            "run.iterations; raise run.iterations, set run.continue_for, or pick a new "
            "run.name\n"
        )
    return (
        f"\nsteprl run '{config.run.name}' finished iterations {summary.iterations_run}\n"
        f"{nothing}"
        f"  last metrics: {metrics}\n"
        f"{held_out}"
        f"  MLflow run id:   {summary.mlflow_run_id}  (experiment '{config.tracking.experiment}')\n"
        f"  MLflow UI:       mlflow ui --backend-store-uri {summary.tracking_uri}   (then open "
        f"http://127.0.0.1:5000/#/runs/{summary.mlflow_run_id}: the run itself)\n"
        f"  replay (Arrow):  {summary.run_dir}/iter_*/steps.parquet\n"
        f"  checkpoints:     {summary.run_dir}/checkpoints/ (latest -> "
        f"{summary.run_dir}/checkpoints/latest)\n"
    )


def main() -> None:
    """Entry point of the `steprl` script. Like `python -m`, it imports your own modules
    (`--set env.name=package.module:Class`) from the directory it runs in."""
    settle_heap()  # before any thread allocates: the run's phases peak lower
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    app()


if __name__ == "__main__":
    sys.exit(main())
