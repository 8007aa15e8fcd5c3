"""The `judge` reward term: a model reads the task and each trajectory and scores it by a rubric.

'absolute' asks one prompt per trajectory for a score; 'relative' (RULER-style) shows one
prompt per group all of its trajectories side by side and asks for a score each, as JSON. All
of an iteration's judge prompts go to the engine `batch_size` at a time (one generate call per
batch); a reply with no readable score scores 0, is counted and logged, never raised.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent_core.core.records import Observation, Step, Task
from agent_core.prompting.renderer import PromptRenderer
from agent_core.rewards.judge_replies import parse_group_scores, parse_score
from agent_core.rollout.engine import Generation, SamplingParams
from configs.judge import JudgeTerm

log = logging.getLogger(__name__)


class JudgeEngine(Protocol):
    """What the judge needs of an engine: batched generate and its model's tokenizer (every
    steprl rollout engine has both)."""

    tokenizer: Any

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Sample one response per prompt (token-id lists, unpadded)."""
        ...


@dataclass
class JudgeOutcome:
    """What a judge made of some trajectories, keyed by trajectory id."""

    scores: dict[str, float] = field(default_factory=dict)
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    parse_failures: int = 0
    generate_calls: int = 0


@dataclass(frozen=True)
class _Prompt:
    """One judge prompt and the trajectories its reply scores (one, or a group's)."""

    ids: list[int]
    trajectory_ids: list[str]


def trajectory_text(trajectory: list[Step], sees: str, max_chars: int) -> str:
    """What the judge reads of one trajectory: its last reply, or every reply with the
    environment's feedback; cut to the last `max_chars` characters."""
    if sees == "final_answer":
        text = trajectory[-1].response_text.strip()
    else:
        parts = []
        for step in trajectory:
            parts.append(f"[assistant, step {step.step_index + 1}]\n{step.response_text.strip()}")
            if step.feedback_text:
                parts.append(f"[environment]\n{step.feedback_text.strip()}")
        text = "\n".join(parts)
    return text if len(text) <= max_chars else "..." + text[-max_chars:]


def _what(term: JudgeTerm) -> str:
    return "final answer" if term.sees == "final_answer" else "trajectory"


def absolute_prompt(term: JudgeTerm, task: Task, trajectory: list[Step]) -> str:
    """The judge's message for one trajectory, asking for `Score: <number>`."""
    return (
        f"{term.rubric}\n\n# Task\n{task.prompt}\n\n# The assistant's {_what(term)}\n"
        f"{trajectory_text(trajectory, term.sees, term.max_chars)}\n\n"
        f"Score it from 0 (worst) to {term.scale:g} (best). End your reply with one line: "
        "Score: <number>"
    )


def relative_prompt(term: JudgeTerm, task: Task, trajectories: list[list[Step]]) -> str:
    """The judge's message for a group: its trajectories numbered 1..n, scores asked as JSON."""
    n = len(trajectories)
    shown = "\n\n".join(
        f"## Attempt {i}\n{trajectory_text(t, term.sees, term.max_chars)}"
        for i, t in enumerate(trajectories, 1)
    )
    return (
        f"{term.rubric}\n\n# Task\n{task.prompt}\n\n"
        f"# {n} attempts at this task (the {_what(term)} of each)\n{shown}\n\n"
        f"Compare the attempts and score each from 0 (worst) to {term.scale:g} (best). Reply "
        'with JSON only: {"scores": [{"id": 1, "score": <number>}, ...]} with one entry for '
        f"each id from 1 to {n}."
    )


def build_prompts(
    term: JudgeTerm, trajectories: list[list[Step]], tasks: dict[str, Task], flow: PromptRenderer
) -> list[_Prompt]:
    """Token ids of every judge prompt (rendered with the judge's chat template)."""
    if term.mode == "absolute":
        units = [[t] for t in trajectories]
    else:
        groups: dict[str, list[list[Step]]] = {}
        for t in trajectories:
            groups.setdefault(t[0].group_id, []).append(t)
        units = list(groups.values())
    prompts = []
    for unit in units:
        task = tasks[unit[0][0].task_id]
        text = (
            absolute_prompt(term, task, unit[0])
            if term.mode == "absolute"
            else relative_prompt(term, task, unit)
        )
        ids = flow.encode(Observation(messages=[{"role": "user", "content": text}]))
        prompts.append(_Prompt(ids, [t[0].trajectory_id for t in unit]))
    return prompts


def judge_trajectories(
    term: JudgeTerm,
    trajectories: list[list[Step]],
    tasks: dict[str, Task],
    engine: JudgeEngine,
    seed: int = 0,
) -> JudgeOutcome:
    """Score every trajectory in [0, 1] with the judge `engine` (one generate per batch)."""
    tokenizer = engine.tokenizer
    prompts = build_prompts(term, trajectories, tasks, PromptRenderer(tokenizer, "none"))
    params = SamplingParams(
        max_new_tokens=term.max_new_tokens, temperature=term.temperature, seed=seed
    )
    outcome = JudgeOutcome()
    for start in range(0, len(prompts), term.batch_size):
        batch = prompts[start : start + term.batch_size]
        generations = engine.generate([p.ids for p in batch], params)
        outcome.generate_calls += 1
        for prompt, generation in zip(batch, generations, strict=True):
            reply = tokenizer.decode(generation.token_ids, skip_special_tokens=True)
            _record(term, prompt.trajectory_ids, reply, outcome)
    if outcome.parse_failures:
        first = next(r["reply"] for r in outcome.records.values() if r["score"] is None)
        log.warning(
            "judge: %d of %d trajectories got no readable score from their judge reply (scored "
            "0); first such reply: %r",
            outcome.parse_failures,
            len(trajectories),
            first[:200],
        )
    return outcome


def _record(term: JudgeTerm, trajectory_ids: list[str], reply: str, outcome: JudgeOutcome) -> None:
    """Parse one reply into the scores of the trajectories it judged (None -> 0, counted)."""
    if term.mode == "absolute":
        parsed = [parse_score(reply, term.scale)]
    else:
        parsed = parse_group_scores(reply, len(trajectory_ids), term.scale)
    for tid, score in zip(trajectory_ids, parsed, strict=True):
        outcome.scores[tid] = 0.0 if score is None else score
        outcome.records[tid] = {"mode": term.mode, "reply": reply, "score": score}
        outcome.parse_failures += score is None
