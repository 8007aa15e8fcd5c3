"""The `judge` reward term (`reward.terms: [{name: judge, ...}]`): which model judges, by which
rubric, what it sees, and how its calls are batched. Whether the model folder exists is
checked when the config loads (`agent_core.config.load.check_config`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from configs.base import Section

JUDGE_POLICY = "policy"
DEFAULT_RUBRIC = (
    "You grade an assistant's work on a task. A correct, complete answer that follows the "
    "task's instructions scores high; a wrong, missing or off-topic answer scores low."
)


class JudgeTerm(Section):
    """An outcome reward scored by a model reading the task and each trajectory."""

    name: Literal["judge"] = Field(description="'judge': the model-judged reward term.")
    weight: float = Field(1.0, description="Multiplier applied to the judge's score in [0, 1].")
    model: str = Field(
        JUDGE_POLICY,
        description="The judge: 'policy' = the policy that produced the trajectories (its live "
        "rollout engine, no second copy of the weights), or a local Hugging Face model folder "
        "(never a hub id: nothing is downloaded at run time).",
    )
    rubric: str = Field(
        DEFAULT_RUBRIC,
        min_length=1,
        description="What makes a good answer, in words; opens every judge prompt.",
    )
    sees: Literal["final_answer", "trajectory"] = Field(
        "final_answer",
        description="What the judge reads besides the task: 'final_answer' = the last reply; "
        "'trajectory' = every step's reply and the environment's feedback.",
    )
    mode: Literal["absolute", "relative"] = Field(
        "absolute",
        description="'absolute' = one prompt per trajectory, one score each; 'relative' "
        "(RULER-style) = one prompt per group showing its trajectories side by side, scores "
        "for all of them as JSON (a group's scores are then comparable with each other).",
    )
    scale: float = Field(
        10.0,
        gt=0.0,
        description="The judge is asked for scores from 0 to `scale`; a score is divided by "
        "it (or by the denominator the reply gives, as in '7/10') and clamped into [0, 1].",
    )
    max_chars: int = Field(
        2000,
        ge=100,
        description="Characters of each trajectory's text shown to the judge; longer text "
        "keeps its end (where the final answer is).",
    )
    max_new_tokens: int = Field(
        96,
        ge=1,
        description="Tokens the judge may generate per prompt (relative mode lists a score per "
        "trajectory of the group: allow ~12 per trajectory).",
    )
    temperature: float = Field(
        0.0, ge=0.0, description="Judge sampling temperature; 0 = greedy (reproducible)."
    )
    batch_size: int = Field(
        16, ge=1, description="Judge prompts per engine generate call (one forward per token)."
    )
