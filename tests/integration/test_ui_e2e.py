"""End to end through both UIs: `steprl serve` deployments on real Prefect and MLflow servers, a
custom `train/smoke` run submitted from the Prefect UI form in headless Chromium (a form that
shows bounds and marks only empty-able fields optional), then its run, metrics, logged model and
chat traces checked in MLflow (API and UI, which opens as model training); refill rounds shown
as task runs, a config error failing once, and a schedule made in the UI on a finished run
saying why nothing ran. Screenshots land in test-artifacts/ui-e2e/."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

from tests.conftest import RETRY_WAITS_S, RETRYABLE_STATUS, stop_process_group

CHROMIUM = "/usr/bin/chromium"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason=f"needs Debian's chromium at {CHROMIUM} (apt-get install chromium)",
    ),
]

# STACK.md's flags; playwright adds --headless and its own empty --user-data-dir
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "ui-e2e"
RUNNER_START_S = 180  # imports torch, deepspeed, transformers on a busy 2-core box
FLOW_RUN_S = 240  # the smoke run itself takes ~15-60 s
UI_TIMEOUT_MS = 30_000
RUN_NAME = f"e2e-{uuid.uuid4().hex[:8]}"  # both the Prefect flow-run name and run.name
LEARNING_RATE = "0.002"  # a second form override that must reach the flow
DIST_ENV = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}


# ---------------------------------------------------------------- servers, runner, browser


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else f"(no {path})"


def _api(served) -> str:
    return f"{served.services.prefect_url}/api"


def _wait_for(what: str, probe: Callable[[], Any], timeout_s: float, why: Callable[[], str]):
    """Poll `probe` until it returns something truthy; fail naming `what` and `why()`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = probe()
        if result:
            return result
        time.sleep(1)
    pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}\n{why()}")


def _ended(served, runner: Path, flow_run_id: str, what: str) -> dict:
    """The flow run once it has ended (completed, failed, crashed or cancelled)."""

    def ended() -> dict | None:
        flow_run = served.api("get", f"/flow_runs/{flow_run_id}").json()
        state = (flow_run.get("state") or {}).get("type")
        return flow_run if state in {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"} else None

    return _wait_for(what, ended, FLOW_RUN_S, lambda: _tail(runner))


@pytest.fixture(scope="module")
def runner(served) -> Iterator[Path]:
    """`steprl serve --preset smoke --no-servers` in the temp working directory: registers the
    deployments with the Prefect server and executes their runs (MLflow from the env)."""
    log = served.root / ".steprl" / "runner.log"
    # in-process training tests leave torch.distributed's rendezvous in os.environ (and this
    # process listening on MASTER_PORT): a flow run inheriting it fails with EADDRINUSE
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV} | {
        "PREFECT_API_URL": _api(served),
        "MLFLOW_TRACKING_URI": served.services.mlflow_url,
        "PREFECT_RUNNER_POLL_FREQUENCY": "2",  # pick up UI-created runs quickly (default 10 s)
        "PYTHONUNBUFFERED": "1",
    }
    cmd = [sys.executable, "-m", "flows.cli", "serve", "--preset", "smoke", "--no-servers"]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=served.root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its flow-run processes are stopped with it
        )
    try:

        def registered() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"the runner exited with {proc.returncode}:\n{_tail(log)}")
            response = served.api("get", "/deployments/name/train/smoke")
            return response.status_code == 200

        _wait_for("the train/smoke deployment", registered, RUNNER_START_S, lambda: _tail(log))
        yield log
    finally:
        stop_process_group(proc)


@pytest.fixture(scope="module")
def deployment(served, runner) -> dict:
    """The `train/smoke` deployment, once its runner has polled the server (status READY)."""
    deadline = time.monotonic() + 120
    while True:
        response = served.api("get", "/deployments/name/train/smoke")
        if response.status_code == 200 and response.json().get("status") == "READY":
            return response.json()
        if time.monotonic() > deadline:
            response.raise_for_status()
            pytest.fail(f"the train/smoke deployment never became READY: {response.json()}")
        time.sleep(1)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    SHOTS.mkdir(parents=True, exist_ok=True)
    for stale in SHOTS.glob("FAILED-*.png"):  # from an earlier run
        stale.unlink()
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A fresh page; on a failing test its last view is saved as FAILED-<test>.png."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    failed_before = request.session.testsfailed
    yield page
    if request.session.testsfailed > failed_before:
        with contextlib.suppress(Exception):
            page.screenshot(path=SHOTS / f"FAILED-{request.node.name}.png")
    context.close()


# ---------------------------------------------------------------- the Prefect UI


def _form_input(page: Page, *titles: str) -> Locator:
    """The input of a field of Prefect's schema form, by its section path, e.g.
    ("Rollout", "Group Size"). Fields with defaults are titled "<Title> (Optional)"."""
    scope: Page | Locator = page
    for title in titles:
        label = (
            "span[contains(@class,'schema-form-property__label') and "
            f"(normalize-space()='{title}' or normalize-space()='{title} (Optional)')]"
        )
        scope = scope.locator(
            "xpath=.//div[contains(concat(' ', normalize-space(@class), ' '), "
            f"' schema-form-property ') and ./div[contains(@class,'p-label__header')]//{label}]"
        ).first
    body = scope.locator("xpath=./div[contains(@class,'p-label__body')]")
    return body.locator("textarea, input").first


def _open_custom_run_form(page: Page, served, deployment: dict, attempts: int = 3) -> None:
    """Deployment page -> Run -> Custom run; retried from a fresh load (the SPA can be slow
    to hydrate on a busy machine)."""
    url = f"{served.services.prefect_url}/deployments/deployment/{deployment['id']}"
    for attempt in range(1, attempts + 1):
        try:
            page.goto(url, wait_until="domcontentloaded")
            page.get_by_role("button", name="Run", exact=True).click()
            page.get_by_text("Custom run", exact=True).click()
            expect(page.get_by_role("button", name="Submit", exact=True)).to_be_visible()
            expect(_form_input(page, "Run", "Name")).to_have_value("smoke")
            return
        except Exception:  # playwright's errors and expect's AssertionError
            if attempt == attempts:
                raise


def _post_from_ui(page: Page, fill: Callable[[], None], button: str, path_end: str) -> None:
    """`fill()` a form of the UI, click `button` and wait for the browser's own POST to a path
    ending `path_end`. A retryable answer (the server's 503 while its SQLite database is busy;
    the UI drops the form on any answer) is met as a user would, by filling the form again, with
    `Served.api`'s waits; any other failure fails naming the answer."""

    def posted(response) -> bool:
        return response.request.method == "POST" and response.url.endswith(path_end)

    for wait_s in (*RETRY_WAITS_S, None):
        fill()
        with page.expect_response(posted, timeout=30_000) as answer:
            page.get_by_role("button", name=button, exact=True).click()
        response = answer.value
        if response.status not in RETRYABLE_STATUS or wait_s is None:
            break
        time.sleep(wait_s)
    assert response.ok, f"the UI's POST {path_end} answered {response.status}: {response.text()}"


def _flow_runs_named(served, name: str) -> list[dict]:
    return served.flow_runs({"name": {"any_": [name]}})


def test_deployment_page_shows_the_train_deployment(page: Page, served, deployment) -> None:
    page.goto(
        f"{served.services.prefect_url}/deployments/deployment/{deployment['id']}",
        wait_until="domcontentloaded",
    )
    expect(page.get_by_role("button", name="Run", exact=True)).to_be_visible()
    expect(page.get_by_role("link", name="train").first).to_be_visible()
    expect(page.get_by_text("Ready", exact=True)).to_be_visible()  # a runner is polling
    page.screenshot(path=SHOTS / "prefect-deployment.png")


def test_ui_form_refuses_a_bad_group_size(page: Page, served, deployment) -> None:
    _open_custom_run_form(page, served, deployment)
    page.locator(".flow-run-name-input input").fill(f"{RUN_NAME}-refused")
    group_size = _form_input(page, "Rollout", "Group Size")
    expect(group_size).to_have_value("4")
    group_size.fill("0")
    page.get_by_role("button", name="Submit", exact=True).click()
    # the toast (the UI may render a second, hidden copy)
    toast = page.get_by_text("Validation failed for field 'config.rollout.group_size'").first
    expect(toast).to_be_visible()
    expect(toast).to_contain_text("minimum of 1")
    group_size.scroll_into_view_if_needed()
    page.screenshot(path=SHOTS / "prefect-form-refused.png")
    assert _flow_runs_named(served, f"{RUN_NAME}-refused") == []


def _property(page: Page, *titles: str) -> Locator:
    """The whole block of a form field (label, description, input), as `_form_input` finds it."""
    return _form_input(page, *titles).locator(
        "xpath=ancestor::div[contains(concat(' ', normalize-space(@class), ' '), "
        "' schema-form-property ')][1]"
    )


def test_ui_form_shows_bounds_and_marks_only_empty_able_fields_optional(
    page: Page, served, deployment
) -> None:
    _open_custom_run_form(page, served, deployment)
    group_size = _property(page, "Rollout", "Group Size")
    expect(group_size).to_contain_text("Allowed: ≥ 1.")
    expect(group_size).not_to_contain_text("(Optional)")  # it may not be left empty
    expect(_property(page, "Trainer", "Learning Rate")).to_contain_text("Allowed: > 0.0.")
    agent = page.get_by_text("Agent (Optional)", exact=True).first  # empty = no agent function
    expect(agent).to_be_visible()
    expect(page.get_by_text("Iterations (Optional)", exact=True)).to_have_count(0)
    # an empty-able text field is one input, not a choice of "str" and "None"
    agent_block = agent.locator(
        "xpath=ancestor::div[contains(concat(' ', normalize-space(@class), ' '), "
        "' schema-form-property ')][1]"
    )
    expect(agent_block).not_to_contain_text("Property is type")
    expect(agent_block.locator("input, textarea")).to_have_count(1)
    group_size.scroll_into_view_if_needed()
    page.screenshot(path=SHOTS / "prefect-form-bounds.png")


def test_api_refuses_a_bad_group_size(served, deployment) -> None:
    parameters = deployment["parameters"]
    bad = parameters | {
        "config": parameters["config"]
        | {"rollout": parameters["config"]["rollout"] | {"group_size": 0}}
    }
    response = served.api(
        "post",
        f"/deployments/{deployment['id']}/create_flow_run",
        json={"parameters": bad, "name": f"{RUN_NAME}-api-refused"},
    )
    assert response.status_code in (409, 422), response.text
    assert "config.rollout.group_size" in response.text
    assert "minimum of 1" in response.text


def test_api_run_with_overlap_completes(served, deployment, runner) -> None:
    """An asynchronous run (overlap.max_staleness=1) created through the deployment's API, as
    the UI form creates one: it completes, every update trained rows at most one version old,
    and the rows of iterations 2 and 3 were sampled while the previous update ran."""
    parameters = deployment["parameters"]
    config = parameters["config"]
    name = f"{RUN_NAME}-async"
    overlapped = parameters | {
        "config": config
        | {
            "run": config["run"] | {"name": name, "iterations": 3},
            # whole sections, as the form sends them: a field left out is refused, by name
            "overlap": config["overlap"] | {"max_staleness": 1},
            "trainer": config["trainer"]
            | {"off_policy_correction": "decoupled", "old_logprobs": "recompute"},
        }
    }
    response = served.api(
        "post",
        f"/deployments/{deployment['id']}/create_flow_run",
        json={"parameters": overlapped, "name": name},
    )
    assert response.status_code == 201, response.text
    flow_run_id = response.json()["id"]

    done = _ended(served, runner, flow_run_id, f"flow run {flow_run_id}")
    assert done["state"]["type"] == "COMPLETED", f"{done['state']}\n{_tail(runner)}"
    client = MlflowClient(tracking_uri=served.services.mlflow_url)
    experiment = client.get_experiment_by_name("steprl-smoke")
    (run,) = client.search_runs([experiment.experiment_id], f"attributes.run_name = '{name}'")
    staleness = {
        m.step: m.value
        for m in client.get_metric_history(run.info.run_id, "actor/async/staleness_mean")
    }
    assert sorted(staleness) == [1, 2, 3]
    assert staleness[1] == 0.0 and all(0.0 <= v <= 1.0 for v in staleness.values())
    assert max(staleness[2], staleness[3]) > 0.0, staleness


@pytest.fixture(scope="module")
def ui_run(browser: Browser, served, deployment, runner: Path) -> dict:
    """Submit a custom run from the UI form (run.name and trainer.learning_rate overridden)
    and wait until the runner has finished it; returns the Prefect flow run."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    refused: list[str] = []  # what the API answered the UI with an error (for the failure)

    def note_refusal(response) -> None:
        if "/api/" in response.url and response.status >= 400:
            with contextlib.suppress(Exception):  # a body the browser no longer holds
                refused.append(
                    f"{response.request.method} {response.url} -> {response.status}: "
                    f"{response.text()[:500]}"
                )

    page.on("response", note_refusal)
    page.on("pageerror", lambda error: refused.append(f"page error: {error}"))
    try:

        def fill() -> None:
            _open_custom_run_form(page, served, deployment)
            page.locator(".flow-run-name-input input").fill(RUN_NAME)
            _form_input(page, "Run", "Name").fill(RUN_NAME)
            _form_input(page, "Trainer", "Learning Rate").fill(LEARNING_RATE)

        _post_from_ui(page, fill, "Submit", "/create_flow_run")
        created = _wait_for(
            f"the flow run '{RUN_NAME}' created from the UI",
            lambda: _flow_runs_named(served, RUN_NAME),
            30,
            lambda: (
                f"toasts: {page.locator('.p-toast-container').all_inner_texts()}\n"
                f"API and page errors: {refused}\nPrefect server log: "
                f"{_tail(served.root / '.steprl' / 'prefect-server.log')}"
            ),
        )
    except BaseException:
        with contextlib.suppress(Exception):
            page.screenshot(path=SHOTS / "FAILED-ui-run-submit.png")
        raise
    finally:
        context.close()
    flow_run_id = created[0]["id"]

    return _ended(served, runner, flow_run_id, f"flow run {flow_run_id} to finish")


def test_ui_run_completes_with_the_form_values(page: Page, served, ui_run, runner) -> None:
    assert ui_run["state"]["type"] == "COMPLETED", f"{ui_run['state']}\n{_tail(runner)}"
    config = ui_run["parameters"]["config"]
    assert config["run"]["name"] == RUN_NAME
    assert config["trainer"]["learning_rate"] == float(LEARNING_RATE)
    # left empty in the form: the runner's MLFLOW_TRACKING_URI decides
    assert config["tracking"].get("tracking_uri") is None
    page.goto(
        f"{served.services.prefect_url}/runs/flow-run/{ui_run['id']}",
        wait_until="domcontentloaded",
    )
    expect(page.get_by_text(RUN_NAME).first).to_be_visible()
    expect(page.get_by_text("Completed").first).to_be_visible()
    page.screenshot(path=SHOTS / "prefect-flow-run.png")
    # the iteration's artifact hangs on the flow run itself, not only on a task run
    page.get_by_text("Artifacts", exact=True).first.click()
    key = f"steprl-{RUN_NAME}-iter-1"
    expect(page.get_by_text(key, exact=True)).to_be_visible()
    shown = page.locator("body").inner_text()  # listed under "Flow run", before "Task runs"
    assert shown.rindex("Flow run") < shown.index(key) < shown.rindex("Task runs"), shown
    page.screenshot(path=SHOTS / "prefect-flow-run-artifact.png")


# ---------------------------------------------------------------- MLflow


@pytest.fixture(scope="module")
def mlflow_run(served, ui_run):
    if ui_run["state"]["type"] != "COMPLETED":
        pytest.fail(f"the flow run submitted from the UI ended {ui_run['state']['type']}")
    client = MlflowClient(tracking_uri=served.services.mlflow_url)
    experiment = client.get_experiment_by_name("steprl-smoke")
    assert experiment is not None, "no MLflow experiment 'steprl-smoke' on the server"
    runs = client.search_runs(
        [experiment.experiment_id], filter_string=f"attributes.run_name = '{RUN_NAME}'"
    )
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return client, runs[0]


@pytest.fixture(scope="module")
def mlflow_traces(mlflow_run) -> list:
    """The run's traces; the flow-run process exports them asynchronously, so poll a while."""
    client, run = mlflow_run
    return _wait_for(
        f"MLflow traces of run {run.info.run_id}",
        lambda: client.search_traces(
            locations=[run.info.experiment_id], run_id=run.info.run_id, max_results=100
        ),
        60,
        lambda: "search_traces found none",
    )


def test_mlflow_run_holds_metrics_params_and_traces(ui_run, mlflow_run, mlflow_traces) -> None:
    client, run = mlflow_run
    assert run.info.status == "FINISHED"
    assert run.data.tags["prefect.flow_run_id"] == ui_run["id"]
    assert run.data.params["trainer.learning_rate"] == LEARNING_RATE
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert [m.step for m in history] == [1]
    for key in ("success_rate", "actor/policy_loss", "episode/steps_mean"):
        assert key in run.data.metrics, key
    for trace in mlflow_traces:
        names = [span.name for span in trace.data.spans]
        assert any(name.startswith("trajectory ") for name in names), names
        assert any(name.startswith("step ") for name in names), names


def test_mlflow_ui_shows_the_run_reward_and_traces(
    page: Page, served, mlflow_run, mlflow_traces
) -> None:
    _, run = mlflow_run
    page.goto(
        f"{served.services.mlflow_url}/#/experiments/{run.info.experiment_id}"
        f"/runs/{run.info.run_id}",
        wait_until="domcontentloaded",  # the MLflow UI keeps polling: never network-idle
    )
    expect(page.get_by_role("heading", name=RUN_NAME)).to_be_visible(timeout=60_000)
    page.get_by_placeholder("Search metrics").fill("reward/mean")
    link = page.get_by_role("link", name="reward/mean", exact=True)
    row = page.get_by_role("row").filter(has=link)
    expect(row).to_have_count(1)
    shown = float(row.get_by_role("cell").nth(1).inner_text())
    assert shown == pytest.approx(run.data.metrics["reward/mean"], rel=1e-6)
    page.screenshot(path=SHOTS / "mlflow-run.png")

    page.get_by_role("tab", name="Traces").click()
    for trace in mlflow_traces:
        expect(page.get_by_text(trace.info.trace_id, exact=True)).to_be_visible()
    page.screenshot(path=SHOTS / "mlflow-traces.png")


def test_mlflow_opens_the_experiment_as_model_training(page: Page, served, mlflow_run) -> None:
    """From the MLflow server's front page, in a browser that never chose a mode, the
    experiment opens on its runs table (model training), not as a GenAI app."""
    page.goto(f"{served.services.mlflow_url}/", wait_until="domcontentloaded")
    page.get_by_role("link", name="steprl-smoke").first.click(timeout=60_000)
    expect(page).to_have_url(re.compile(r"/runs\?.*workflowType=machine_learning"), timeout=60_000)
    expect(page.get_by_role("link", name=RUN_NAME, exact=True)).to_be_visible(timeout=60_000)
    page.screenshot(path=SHOTS / "mlflow-experiment.png")


def test_mlflow_lists_the_checkpoint_as_a_logged_model(page: Page, served, mlflow_run) -> None:
    client, run = mlflow_run
    [output] = client.get_run(run.info.run_id).outputs.model_outputs
    name = f"{RUN_NAME}-iter_0001"
    [model] = client.search_logged_models(
        [run.info.experiment_id], filter_string=f"name = '{name}'"
    )
    assert model.model_id == output.model_id and model.source_run_id == run.info.run_id
    assert output.step == 1 and model.tags["steprl.iteration"] == "1"
    assert "reward/mean" in {m.key for m in model.metrics}, "the iteration's metrics link to it"
    page.goto(
        f"{served.services.mlflow_url}/#/experiments/{run.info.experiment_id}/models",
        wait_until="domcontentloaded",
    )
    row = page.get_by_role("row").filter(has=page.get_by_text(name, exact=True))
    expect(row).to_contain_text("Ready", timeout=60_000)
    page.screenshot(path=SHOTS / "mlflow-logged-models.png")


def test_mlflow_shows_a_trace_as_a_chat(page: Page, served, mlflow_run, mlflow_traces) -> None:
    """A trajectory's trace opens on its conversation: the system and user messages the prompt
    held, the policy's replies, with the step's reward and advantage among its outputs."""
    _, run = mlflow_run
    [step] = [s for s in mlflow_traces[0].data.spans if s.name == "step 0"]
    assert step.span_type == "CHAT_MODEL" and {"reward", "advantage"} <= set(step.outputs)
    page.goto(
        f"{served.services.mlflow_url}/#/experiments/{run.info.experiment_id}/runs/"
        f"{run.info.run_id}",
        wait_until="domcontentloaded",
    )
    page.get_by_role("tab", name="Traces").click(timeout=60_000)
    with contextlib.suppress(Exception):  # a first-visit tip over the table
        page.get_by_role("button", name="Got it").click(timeout=5_000)
    page.get_by_text('"task_id": "calculator-', exact=False).first.click()
    for role in ("System", "User", "Assistant"):
        expect(page.get_by_text(role, exact=True).first).to_be_visible(timeout=60_000)
    expect(page.get_by_text("# Tools")).to_have_count(0)  # the tools block is no heading
    page.screenshot(path=SHOTS / "mlflow-trace-chat.png")


# ---------------------------------------------------------------- refill, errors, schedules


def _run_from_api(served, deployment: dict, runner: Path, name: str, **sections) -> dict:
    """Create a flow run of the deployment through its API with `sections` of the config
    changed (and run.name = `name`), as the form does; wait until it ends."""
    config = deployment["parameters"]["config"]
    config = config | {"run": config["run"] | {"name": name}}
    config |= {key: config.get(key, {}) | value for key, value in sections.items()}
    response = served.api(
        "post",
        f"/deployments/{deployment['id']}/create_flow_run",
        json={"parameters": {"config": config}, "name": name},
    )
    assert response.status_code == 201, response.text
    flow_run_id = response.json()["id"]

    return _ended(served, runner, flow_run_id, f"flow run {name}")


def test_refill_rounds_are_task_runs_in_the_ui(page: Page, served, deployment, runner) -> None:
    """Dynamic sampling's refill round is collect_rollouts task runs of the flow run, judged
    by judge_groups task runs: the UI lists them (the tiny model never succeeds, so
    no_success drops every group of round 0 and one refill round runs)."""
    name = f"{RUN_NAME}-refill"
    done = _run_from_api(
        served, deployment, runner, name, refill={"drop": ["no_success"], "max_rounds": 1}
    )
    assert done["state"]["type"] == "COMPLETED", f"{done['state']}\n{_tail(runner)}"
    page.goto(
        f"{served.services.prefect_url}/runs/flow-run/{done['id']}", wait_until="domcontentloaded"
    )
    page.get_by_text("Task Runs", exact=True).first.click()
    for task_run in (
        "collect_rollouts-iter1-shard0",
        "judge_groups-iter1-round0",
        "collect_rollouts-iter1-refill1-shard0",
        "judge_groups-iter1-round1",
    ):
        expect(page.get_by_text(task_run, exact=True).first).to_be_visible()
    page.screenshot(path=SHOTS / "prefect-refill-task-runs.png")


def test_a_config_error_fails_once(page: Page, served, deployment, runner) -> None:
    """An env constructor refusing its kwargs fails the run once: no task run is retried."""
    name = f"{RUN_NAME}-bad-kwargs"
    done = _run_from_api(served, deployment, runner, name, env={"kwargs": {"no_such_arg": 1}})
    assert done["state"]["type"] == "FAILED", done["state"]
    assert "no_such_arg" in done["state"]["message"]
    response = served.api(
        "post",
        "/task_runs/filter",
        json={"flow_runs": {"id": {"any_": [done["id"]]}}},
    )
    response.raise_for_status()
    assert all(task_run["run_count"] <= 1 for task_run in response.json()), response.json()
    page.goto(
        f"{served.services.prefect_url}/runs/flow-run/{done['id']}", wait_until="domcontentloaded"
    )
    expect(page.get_by_text("Failed").first).to_be_visible()
    page.screenshot(path=SHOTS / "prefect-config-error.png")


def test_a_ui_schedule_on_a_finished_run_says_why_nothing_ran(
    page: Page, served, deployment, runner
) -> None:
    """The deployment's own run (`smoke`) finished; a schedule made in the UI (every minute,
    the form's defaults: no continue_for) fires a run that is named for it and ends "Nothing
    to run" with why, instead of a bare Completed."""
    first = _run_from_api(served, deployment, runner, "smoke")
    assert first["state"]["type"] == "COMPLETED", first["state"]

    def fill() -> None:
        page.goto(
            f"{served.services.prefect_url}/deployments/deployment/{deployment['id']}",
            wait_until="domcontentloaded",
        )
        page.get_by_role("button", name="Schedule", exact=True).click()
        page.get_by_role("button", name="Cron", exact=True).click()
        page.locator(".p-modal input[type=text]").nth(1).fill("* * * * *")
        page.screenshot(path=SHOTS / "prefect-add-schedule.png")

    _post_from_ui(page, fill, "Save", "/schedules")
    schedules = _wait_for(
        "the schedule made in the UI",
        lambda: served.api("get", f"/deployments/{deployment['id']}").json()["schedules"],
        30,
        lambda: "none stored",
    )
    try:
        assert [s["schedule"].get("cron") for s in schedules] == ["* * * * *"]

        def said_why() -> dict | None:
            runs = served.flow_runs({"deployment_id": {"any_": [deployment["id"]]}})
            done = [r for r in runs if r["auto_scheduled"] and r["state"]["type"] == "COMPLETED"]
            return done[0] if done else None

        ran = _wait_for("a scheduled run to end", said_why, 300, lambda: _tail(runner))
        assert (ran["name"], ran["state"]["name"]) == ("smoke-nothing-to-run", "Nothing to run")
        assert "run.continue_for" in ran["state"]["message"]
        page.goto(
            f"{served.services.prefect_url}/runs/flow-run/{ran['id']}",
            wait_until="domcontentloaded",
        )
        expect(page.get_by_text("Nothing to run").first).to_be_visible()
        page.screenshot(path=SHOTS / "prefect-nothing-to-run.png")
    finally:
        for schedule in schedules:  # no more runs fired into the rest of the session
            served.api(
                "delete",
                f"/deployments/{deployment['id']}/schedules/{schedule['id']}",
            )
