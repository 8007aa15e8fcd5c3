"""Agent-function rollouts whose agent speaks the Responses API (the OpenAI Agents SDK's
default): each call is a step holding exactly what the engine saw and sampled, and a call that
sends the previous output items back extends the previous call token-wise."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from agent_core.config import load_config
from agent_core.records import Task
from agent_core.registry import plugin
from agent_core.rollout.hf_engine import HFRolloutEngine
from tests.integration.test_agent_rollouts import run_agent
from tests.integration.test_policy_server import RecordingEngine

HERE = "tests.integration.test_agent_responses"


@plugin("agent")
def responses_agent(task: Task, client: openai.OpenAI) -> float:
    """Two Responses calls; the second sends the first's output items back, then a new turn."""
    items: list = [{"role": "user", "content": task.prompt}]
    first = client.responses.create(model="policy", instructions="Be brief.", input=items)
    items += [o.model_dump(exclude_none=True) for o in first.output]
    items.append({"role": "user", "content": "And then?"})
    client.responses.create(model="policy", instructions="Be brief.", input=items, stream=True)
    return 0.5


@plugin("agent")
async def agents_sdk_agent(task: Task, client: openai.AsyncOpenAI) -> str:
    """An OpenAI Agents SDK agent with the SDK's default API (Responses), streamed. The SDK
    raises on an answer cut at the token budget (`incomplete`, as OpenAI reports it); this
    agent answers '' then, so the cut answer is a step that scores 0, not an agent error."""
    import agents

    agents.set_tracing_disabled(True)
    model = agents.OpenAIResponsesModel("policy", client)
    agent = agents.Agent(name="solver", instructions="Be brief.", model=model)
    result = agents.Runner.run_streamed(agent, task.prompt)
    try:
        async for _ in result.stream_events():
            pass
    except agents.exceptions.ModelBehaviorError as exc:
        assert "max_output_tokens" in str(exc)
        return ""
    return str(result.final_output)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> HFRolloutEngine:
    return HFRolloutEngine(tiny_model_dir)


def _config(tiny_model_dir: Path, agent: str):
    return load_config("smoke", [f"model.path={tiny_model_dir}", f"env.agent={HERE}:{agent}",
                                 "rollout.max_new_tokens=8"])  # fmt: skip


def test_responses_calls_are_the_engines_steps(tiny_model_dir, engine) -> None:
    spy = RecordingEngine(engine)
    steps, stats = run_agent(_config(tiny_model_dir, "responses_agent"), spy)
    rows = [(p, g.token_ids, g.logprobs) for prompts, _, gens in spy.calls
            for p, g in zip(prompts, gens, strict=True)]  # fmt: skip
    assert len(steps) == 8 == len(rows) and stats.env_errors == 0
    for step in steps:  # every step is one engine row: the prompt it saw, what it sampled
        rows.remove((step.prompt_ids, step.response_ids, step.response_logprobs))
    first, second = steps[0], steps[1]
    assert first.info["prompt"] == "rendered" and second.info["prompt"] == "extended"
    assert second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids
    assert [s.reward for s in steps[:2]] == [0.0, 0.5]


def test_an_agents_sdk_agent_trains_with_its_defaults(tiny_model_dir, engine) -> None:
    pytest.importorskip("agents")
    spy = RecordingEngine(engine)
    steps, stats = run_agent(_config(tiny_model_dir, "agents_sdk_agent"), spy)
    assert len(steps) == 4 and stats.env_errors == 0  # one call per episode, recorded
    assert {s.info["end"] for s in steps} <= {"answer"} and len(spy.calls) >= 1
