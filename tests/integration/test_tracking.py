"""MLflow artifacts that tools can load: a registered checkpoint version loads with
`mlflow.transformers.load_model` (and `mlflow.pyfunc`) and generates; trajectory traces carry
the wall-clock times the rollout loop recorded for each step."""

from __future__ import annotations

import shutil
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from agent_core import tracking
from configs.tracking import TrackingSection

pytestmark = pytest.mark.slow


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A sqlite MLflow store (artifacts in ./mlartifacts of a temp working dir) and a run."""
    monkeypatch.chdir(tmp_path)
    cfg = TrackingSection(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="t")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_id = tracking.start_or_resume_run(cfg, run_dir, "r", {}, {})
    saved = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(cfg.tracking_uri)
    yield cfg, run_id
    mlflow.set_tracking_uri(saved)


def test_registered_checkpoint_loads_with_mlflow_and_generates(
    store, tiny_model_dir: Path, tmp_path: Path
) -> None:
    cfg, run_id = store
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(tiny_model_dir, checkpoint)
    (checkpoint / "deepspeed").mkdir()  # optimizer state: stays out of the model
    (checkpoint / "deepspeed" / "state.pt").write_bytes(b"x" * 1000)
    (checkpoint / "steprl.json").write_text('{"policy_version": 1}')
    artifact = tracking.log_checkpoint(cfg, run_id, 1, checkpoint)
    version = tracking.register_checkpoint(cfg, run_id, artifact, "steprl-test", 1)
    assert version == "1"
    files = tracking.list_artifacts(cfg, run_id, artifact)
    assert f"{artifact}/MLmodel" in files and f"{artifact}/model" in files
    assert f"{artifact}/deepspeed" not in files
    steprl = tracking.list_artifacts(cfg, run_id, f"{artifact}/steprl")
    assert steprl == [f"{artifact}/steprl/steprl.json"]
    assert f"{artifact}/model/model.safetensors" in tracking.list_artifacts(
        cfg, run_id, f"{artifact}/model"
    )

    pipe = mlflow.transformers.load_model("models:/steprl-test/1")
    out = pipe("Hello", max_new_tokens=5, do_sample=False)
    assert out[0]["generated_text"].startswith("Hello")
    assert len(out[0]["generated_text"]) > len("Hello")
    predicted = mlflow.pyfunc.load_model("models:/steprl-test/1").predict(
        ["Hello"], params={"max_new_tokens": 5, "do_sample": False}
    )
    assert isinstance(predicted[0], str) and predicted[0]


def _timing(start_ns: int, generate_ms: int, env_ms: int) -> dict[str, int]:
    gen_end = start_ns + generate_ms * 1_000_000
    env_start = gen_end + 1_000_000
    return {
        "generate_start_ns": start_ns,
        "generate_end_ns": gen_end,
        "env_start_ns": env_start,
        "env_end_ns": env_start + env_ms * 1_000_000,
    }


def _step(timing: dict[str, int] | None) -> dict:
    return {"prompt": "p", "response": "r", "tool_calls": [], "feedback": "f", "reward": 1.0,
            "advantage": 0.5, "return": 1.0, "done": True, "timing": timing}  # fmt: skip


def test_trace_spans_span_the_recorded_step_times(store) -> None:
    cfg, run_id = store
    base = 1_700_000_000_000_000_000
    first, second = _timing(base, 700, 40), _timing(base + 900_000_000, 300, 2500)
    payload = {"trajectory_id": "t0", "task_id": "k", "iteration": 1, "success": True,
               "steps": [_step(first), _step(second)]}  # fmt: skip
    untimed = {
        "trajectory_id": "t1",
        "task_id": "k",
        "iteration": 1,
        "success": False,
        "steps": [_step(None)],
    }  # fmt: skip  (a step stored before steps were timed)
    assert tracking.log_trajectory_traces(cfg, run_id, [payload, untimed]) == 2
    client = MlflowClient(cfg.tracking_uri)
    traces = client.search_traces(
        locations=[tracking.experiment_id_of(cfg, run_id)], run_id=run_id, max_results=10
    )
    trace = next(t for t in traces if any(s.name == "trajectory t0" for s in t.data.spans))
    spans = {s.name: s for s in trace.data.spans if not s.name.startswith(("generate", "env"))}
    assert trace.info.execution_duration == (second["env_end_ns"] - base) // 1_000_000
    root = spans["trajectory t0"]
    assert (root.start_time_ns, root.end_time_ns) == (base, second["env_end_ns"])
    for index, timing in enumerate((first, second)):
        step = spans[f"step {index}"]
        assert (step.start_time_ns, step.end_time_ns) == (
            timing["generate_start_ns"],
            timing["env_end_ns"],
        )
        children = {s.name: s for s in trace.data.spans if s.parent_id == step.span_id}
        for name in ("generate", "env"):
            assert (children[name].start_time_ns, children[name].end_time_ns) == (
                timing[f"{name}_start_ns"],
                timing[f"{name}_end_ns"],
            )
    assert len(traces) == 2


def test_role_steps_tag_their_trace_and_spans(store) -> None:
    """Agent rollouts with roles: the role-trajectory's trace and step spans carry the role."""
    cfg, run_id = store
    step = _step(_timing(1_700_000_000_000_000_000, 10, 10)) | {"role": "solver"}
    payload = {"trajectory_id": "t0:solver", "task_id": "k", "iteration": 1, "success": True,
               "steps": [step]}  # fmt: skip
    assert tracking.log_trajectory_traces(cfg, run_id, [payload]) == 1
    client = MlflowClient(cfg.tracking_uri)
    [trace] = client.search_traces(
        locations=[tracking.experiment_id_of(cfg, run_id)], run_id=run_id, max_results=10
    )
    assert trace.info.tags["steprl.role"] == "solver"
    [span] = [s for s in trace.data.spans if s.name == "step 0"]
    assert span.attributes["role"] == "solver"
