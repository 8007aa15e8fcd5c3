"""Reward functions by name and the scoring pass that turns them into each step's reward.

An outcome reward is `fn(trajectory_steps, task) -> float`, added to the trajectory's last
step; a process reward is `fn(step, task) -> float`, added to every step; a judged reward
(`judge`) scores all of an iteration's trajectories at once with a model (agent_core.rewards.judge).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agent_core.core.records import Step, Task
from agent_core.core.registry import is_plugin, resolve
from agent_core.envs import env_class
from agent_core.rewards.judge import JudgeEngine, judge_trajectories
from agent_core.text.answers import extract_number_answer, extract_text_answer, numbers_match
from agent_core.text.tool_calls import CallError, parse_tool_calls
from configs.judge import JudgeTerm
from configs.run_config import RewardTerm, RunConfig

# The judge's engine for a term's `model` ('policy' or a model folder).
JudgeEngines = Callable[[str], JudgeEngine]


@dataclass(frozen=True)
class RewardFn:
    """A named reward function and whether it scores trajectories, single steps, or all
    trajectories at once with a judge model (`fn(term, trajectories, tasks, engine, seed)`)."""

    fn: Callable[..., Any]
    kind: Literal["outcome", "process", "judged"]


def answer_match(trajectory: list[Step], task: Task) -> float:
    """1.0 when the last reply's 'Answer: <number>' equals the task's numeric answer (0.0 for
    a task whose answer is no number, e.g. a code task or a text answer from a tasks file)."""
    final = trajectory[-1]
    if final.info.get("end") != "answer":
        return 0.0
    try:
        expected = float(str(task.answer).replace(",", ""))
    except ValueError:
        return 0.0
    return float(numbers_match(extract_number_answer(final.response_text), expected))


def answer_format(trajectory: list[Step], task: Task) -> float:
    """1.0 when the episode ended with a reply containing 'Answer: <number>' (any number)."""
    final = trajectory[-1]
    return float(
        final.info.get("end") == "answer" and extract_number_answer(final.response_text) is not None
    )


def answer_text_format(trajectory: list[Step], task: Task) -> float:
    """1.0 when the episode ended with a reply containing 'Answer: <text>' (any non-empty
    text: the format term for text answers, e.g. the qa env)."""
    final = trajectory[-1]
    return float(
        final.info.get("end") == "answer" and extract_text_answer(final.response_text) is not None
    )


def tool_call_format(trajectory: list[Step], task: Task) -> float:
    """1.0 when at least one tool call in the episode was well-formed and ran without error."""
    return float(any(s.info.get("tool_calls_ok", 0) > 0 for s in trajectory))


def malformed_call_penalty(step: Step, task: Task) -> float:
    """-1.0 for each step whose reply holds a malformed tool call (process reward)."""
    calls = parse_tool_calls(step.response_text)
    return -1.0 if any(isinstance(c, CallError) for c in calls) else 0.0


def response_tokens(step: Step, task: Task) -> float:
    """The number of tokens in the step's response (process reward; give it a negative weight
    for a length penalty)."""
    return float(len(step.response_ids))


REWARDS: dict[str, RewardFn] = {
    "answer_match": RewardFn(answer_match, "outcome"),
    "answer_format": RewardFn(answer_format, "outcome"),
    "answer_text_format": RewardFn(answer_text_format, "outcome"),
    "tool_call_format": RewardFn(tool_call_format, "outcome"),
    "malformed_call_penalty": RewardFn(malformed_call_penalty, "process"),
    "response_tokens": RewardFn(response_tokens, "process"),
    "judge": RewardFn(judge_trajectories, "judged"),
}


def _is_reward(found: Any) -> bool:
    return isinstance(found, RewardFn) or is_plugin(found, "reward")


def reward_fn(name: str) -> RewardFn:
    """Resolve a configured reward name: a 'module:fn' is a `RewardFn` or a function marked
    `@plugin("reward")` (an outcome reward, or as its `reward_kind` attribute says)."""
    found = resolve(
        "reward", name, REWARDS, _is_reward, "a RewardFn or a function marked @plugin('reward')"
    )
    if isinstance(found, RewardFn):
        return found
    kind = vars(found).get("reward_kind", "outcome")
    if kind not in ("outcome", "process"):
        raise ValueError(
            f"reward {name!r} has reward_kind={kind!r}: set 'outcome' (fn(trajectory, task)) "
            "or 'process' (fn(step, task))"
        )
    return RewardFn(found, kind)


def configured_terms(cfg: RunConfig) -> list[RewardTerm | JudgeTerm]:
    """The run's reward terms: `reward.terms`, or the env's own `reward_terms` when the config
    leaves it unset."""
    if cfg.reward.terms is not None:
        return list(cfg.reward.terms)
    return [RewardTerm(name=n, weight=w) for n, w in env_class(cfg.env.name).reward_terms]


def group_trajectories(steps: list[Step]) -> dict[str, list[Step]]:
    """Steps by trajectory id, each list in step order."""
    out: dict[str, list[Step]] = {}
    for step in steps:
        out.setdefault(step.trajectory_id, []).append(step)
    for trajectory in out.values():
        trajectory.sort(key=lambda s: s.step_index)
    return out


def score_steps(
    steps: list[Step],
    tasks: dict[str, Task],
    terms: Sequence[RewardTerm | JudgeTerm],
    env_reward_weight: float,
    judge_engines: JudgeEngines | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Set each step's `reward` = weighted env reward + process terms (+ outcome and judged
    terms on the last step). Each term's value is also kept in `info['reward_terms']` (a
    judge's reply in `info['judge']`). Returns term means (and the judges' counters)."""
    trajectories = group_trajectories(steps)
    for step in steps:
        step.reward = env_reward_weight * step.env_reward
        step.info["reward_terms"] = {}
        step.info.pop("judge", None)
    totals: dict[str, float] = {term.name: 0.0 for term in terms}
    counters: dict[str, float] = {}
    for term in terms:
        rf = reward_fn(term.name)
        if rf.kind == "judged":
            values = _judged_values(term, rf, trajectories, tasks, judge_engines, seed, counters)
        else:
            values = _function_values(rf, trajectories, tasks)
        for step, value in values:
            step.reward += term.weight * value
            step.info["reward_terms"][term.name] = value
            totals[term.name] += value
    n = max(1, len(trajectories))
    return {f"reward/{name}": total / n for name, total in totals.items()} | counters


def _function_values(
    rf: RewardFn, trajectories: dict[str, list[Step]], tasks: dict[str, Task]
) -> list[tuple[Step, float]]:
    """(step, value) of an outcome term (last steps) or a process term (every step)."""
    out = []
    for trajectory in trajectories.values():
        task = tasks[trajectory[0].task_id]
        if rf.kind == "outcome":
            out.append((trajectory[-1], float(rf.fn(trajectory, task))))
        else:
            out += [(step, float(rf.fn(step, task))) for step in trajectory]
    return out


def _judged_values(
    term: RewardTerm | JudgeTerm,
    rf: RewardFn,
    trajectories: dict[str, list[Step]],
    tasks: dict[str, Task],
    judge_engines: JudgeEngines | None,
    seed: int,
    counters: dict[str, float],
) -> list[tuple[Step, float]]:
    """(last step, judge score) of every trajectory; the reply is kept in the step's info."""
    if not isinstance(term, JudgeTerm) or judge_engines is None:
        raise ValueError(f"reward term {term.name!r} is judged: it needs judge options and engines")
    engine = judge_engines(term.model)
    outcome = rf.fn(term, list(trajectories.values()), tasks, engine, seed)
    for key, count in (
        ("reward/judge_parse_failures", outcome.parse_failures),
        ("reward/judge_generate_calls", outcome.generate_calls),
    ):
        counters[key] = counters.get(key, 0.0) + count
    out = []
    for trajectory_id, trajectory in trajectories.items():
        last = trajectory[-1]
        last.info.setdefault("judge", []).append(outcome.records[trajectory_id])
        out.append((last, outcome.scores[trajectory_id]))
    return out
