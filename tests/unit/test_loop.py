"""AgentEnvLoop: one batched generate call per turn over all live episodes; exact ids stored."""

from __future__ import annotations

import itertools
import time
from functools import partial

import pytest
import torch

from agent_core.envs.calculator import CalculatorEnv
from agent_core.prompting.renderer import PromptRenderer
from agent_core.rollout.engine import Generation, SamplingParams
from agent_core.rollout.engines.hf import HFRolloutEngine
from agent_core.rollout.loop import AgentEnvLoop, RolloutMeta

META = RolloutMeta(run_id="r", iteration=1, policy_version=0, env_name="calculator")
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>'


class ScriptedEngine:
    """Replies by turn: episode i calls the tool i times, then answers; records each call."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.calls: list[list[list[int]]] = []
        self.policy_version = 0

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        self.calls.append([list(p) for p in prompts])
        out = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt)
            turns = text.count("<|im_start|>tool") - 2  # minus the two worked examples
            wants = int(text.split("[calls=")[1][0]) if "[calls=" in text else 0
            reply = (CALL % "40 + 2") if turns < wants else "Answer: 42"
            ids = [
                *self.tokenizer.encode(reply, add_special_tokens=False),
                self.tokenizer.eos_token_id,
            ]
            out.append(Generation(ids, [-0.1] * len(ids), "eos"))
        return out

    def load_weights(self, state_dict: dict, policy_version: int) -> None:  # pragma: no cover
        raise NotImplementedError


def _tasks(wants: list[int]):
    from dataclasses import replace

    return [
        replace(CalculatorEnv.make_task(i), prompt=f"[calls={w}] What is 40 + 2?", answer=42)
        for i, w in enumerate(wants)
    ]


def test_one_generate_call_per_turn_over_live_episodes(tiny_tokenizer) -> None:
    engine = ScriptedEngine(tiny_tokenizer)
    loop = AgentEnvLoop(
        engine,
        PromptRenderer(tiny_tokenizer),
        partial(CalculatorEnv, max_steps=4),
        SamplingParams(),
        10_000,
    )
    steps, stats = loop.run(_tasks([0, 1, 2]), group_size=2, meta=META)
    # episodes need 1, 2 and 3 turns: 6 live, then 4, then 2
    assert [len(batch) for batch in engine.calls] == [6, 4, 2]
    assert stats.generate_calls == 3 and stats.episodes == 6 and stats.steps == len(steps) == 12
    by_traj: dict[str, list] = {}
    for step in steps:
        by_traj.setdefault(step.trajectory_id, []).append(step)
    assert len(by_traj) == 6
    for trajectory in by_traj.values():
        assert [s.step_index for s in trajectory] == list(range(len(trajectory)))
        assert trajectory[-1].done and trajectory[-1].success
        assert all(not s.done for s in trajectory[:-1])
        for prev, nxt in itertools.pairwise(trajectory):
            # append-only context: the next prompt extends prompt + sampled response exactly
            assert nxt.prompt_ids[: len(prev.prompt_ids) + len(prev.response_ids)] == (
                prev.prompt_ids + prev.response_ids
            )
            assert prev.feedback_text == "42"
    # every stored prompt is exactly one the engine was given
    given = {tuple(p) for batch in engine.calls for p in batch}
    assert all(tuple(s.prompt_ids) in given for s in steps)
    groups = {s.group_id for s in steps}
    assert len(groups) == 3


def test_prompt_budget_truncates_episode(tiny_tokenizer) -> None:
    engine = ScriptedEngine(tiny_tokenizer)
    flow = PromptRenderer(tiny_tokenizer)
    first_len = len(flow.encode(CalculatorEnv().reset(_tasks([2])[0])))
    loop = AgentEnvLoop(engine, flow, CalculatorEnv, SamplingParams(), first_len + 10)
    steps, _ = loop.run(_tasks([2]), group_size=1, meta=META)
    assert len(steps) == 1 and steps[0].done and steps[0].truncated
    assert steps[0].info["end"] == "max_prompt_tokens"


def test_hf_engine_batched_sampling_matches_teacher_forced_logprobs(tiny_model_dir) -> None:
    engine = HFRolloutEngine(tiny_model_dir)
    tok = engine.tokenizer
    prompts = [
        tok.encode(t, add_special_tokens=False) for t in ["hello", "a much longer prompt here"]
    ]
    params = SamplingParams(max_new_tokens=12, temperature=0.7, seed=3)
    gens = engine.generate(prompts, params)
    assert gens == engine.generate(prompts, params)  # same seed, same samples
    for prompt, gen in zip(prompts, gens, strict=True):
        assert 1 <= len(gen.token_ids) <= 12 and len(gen.logprobs) == len(gen.token_ids)
        ids = torch.tensor([prompt + gen.token_ids])
        with torch.no_grad():
            logits = engine.model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits / 0.7, -1).gather(-1, ids[0, len(prompt) :, None])
        assert gen.logprobs == pytest.approx(expected.squeeze(-1).tolist(), abs=1e-4)


def test_hf_engine_stops_on_stop_string(tiny_model_dir) -> None:
    engine = HFRolloutEngine(tiny_model_dir)
    prompt = engine.tokenizer.encode("x", add_special_tokens=False)
    # with a one-byte stop string almost every sample stops early
    gens = engine.generate(
        [prompt] * 8, SamplingParams(max_new_tokens=50, stop_strings=("e",), seed=1)
    )
    stopped = [g for g in gens if g.finish_reason == "stop"]
    assert stopped
    for gen in stopped:
        assert engine.tokenizer.decode(gen.token_ids, skip_special_tokens=True).endswith("e")


def test_window_context_prompts_are_exactly_what_the_model_saw(tiny_tokenizer) -> None:
    from agent_core.prompting.context import SlidingWindow

    engine = ScriptedEngine(tiny_tokenizer)
    loop = AgentEnvLoop(
        engine,
        PromptRenderer(tiny_tokenizer),
        partial(CalculatorEnv, max_steps=4, context=SlidingWindow(1)),
        SamplingParams(),
        10_000,
    )
    steps, _ = loop.run(_tasks([9]), group_size=1, meta=META)  # calls the tool every turn
    assert len(steps) == 4
    given = [p for batch in engine.calls for p in batch]
    assert [s.prompt_ids for s in steps] == given
    # step 3 sees the prefix and only the last turn: one tool message beyond the examples' two
    last = tiny_tokenizer.decode(steps[3].prompt_ids)
    assert last.count("<|im_start|>tool") == 2 + 1
    # a one-turn window keeps the prompt from growing once the window is full
    assert len(steps[3].prompt_ids) == len(steps[2].prompt_ids) < len(steps[0].prompt_ids) + 200


def test_policy_summarizer_uses_the_engine(tiny_tokenizer) -> None:
    from agent_core.prompting.context import PolicySummarizer, Summarize

    engine = ScriptedEngine(tiny_tokenizer)
    loop = AgentEnvLoop(
        engine,
        PromptRenderer(tiny_tokenizer),
        partial(
            CalculatorEnv, max_steps=4, context=Summarize(PolicySummarizer(), keep_last_turns=1)
        ),
        SamplingParams(),
        10_000,
    )
    steps, _ = loop.run(_tasks([9]), group_size=1, meta=META)
    assert len(steps) == 4
    # turns 2 and 3 fold earlier turns into a summary written by the engine (extra calls)
    assert len(engine.calls) > 4
    assert "Summary of earlier steps:" in tiny_tokenizer.decode(steps[3].prompt_ids)


class SlowEngine(ScriptedEngine):
    """Takes 30 ms per generate call."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        time.sleep(0.03)
        return super().generate(prompts, params)


class SlowEnv(CalculatorEnv):
    """Takes 20 ms per env step."""

    def step(self, action):
        time.sleep(0.02)
        return super().step(action)


def test_steps_record_their_generate_and_env_wall_clock(tiny_tokenizer) -> None:
    loop = AgentEnvLoop(
        SlowEngine(tiny_tokenizer),
        PromptRenderer(tiny_tokenizer),
        SlowEnv,
        SamplingParams(),
        10_000,
    )
    before = time.time_ns()
    steps, _ = loop.run(_tasks([1, 0]), group_size=1, meta=META)
    after = time.time_ns()
    assert len(steps) == 3
    for step in steps:
        t = step.info["timing"]
        assert before <= t["generate_start_ns"] < t["generate_end_ns"] <= t["env_start_ns"]
        assert t["env_start_ns"] < t["env_end_ns"] <= after
        assert t["generate_end_ns"] - t["generate_start_ns"] >= 30_000_000
        assert t["env_end_ns"] - t["env_start_ns"] >= 20_000_000
    first, second = steps[0].info["timing"], steps[1].info["timing"]  # episode 0's two steps
    assert first["env_end_ns"] <= second["generate_start_ns"]
    # both episodes' first steps came from one batched generate call
    assert (
        steps[0].info["timing"]["generate_start_ns"] == steps[2].info["timing"]["generate_start_ns"]
    )
