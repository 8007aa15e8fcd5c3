"""The `reward` section: the terms summed into each step's reward (reward functions by name, or
the model-scored `judge` term of configs.judge) and the weight of the env's own reward."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Discriminator, Field, Tag

from configs.base import Section
from configs.judge import JudgeTerm


class RewardTerm(Section):
    """One named reward function and its weight."""

    name: str = Field(
        description="Reward name from agent_core.rewards.terms.REWARDS, or "
        "'package.module:function'."
    )
    weight: float = Field(1.0, description="Multiplier applied to the function's value.")


# The kinds of reward term; pydantic puts the kind into an error's path, which
# agent_core.config.load leaves out again (the path then matches the YAML).
TERM_KINDS = ("judge term", "function term")


def _term_kind(term: Any) -> str:
    """A judge term (it has options of its own) or a function term, by its name."""
    name = term.get("name") if isinstance(term, dict) else getattr(term, "name", None)
    return TERM_KINDS[0] if name == "judge" else TERM_KINDS[1]


AnyRewardTerm = Annotated[
    Annotated[JudgeTerm, Tag(TERM_KINDS[0])] | Annotated[RewardTerm, Tag(TERM_KINDS[1])],
    Discriminator(_term_kind),
]


class RewardSection(Section):
    """How the scalar reward of each step is made."""

    terms: list[AnyRewardTerm] | None = Field(
        None,
        description="Reward functions summed into each step's reward. Outcome terms land on "
        "the last step of a trajectory, process terms on every step; a term named 'judge' is "
        "scored by a model and takes the options of configs.judge.JudgeTerm. None = the env's "
        "own default terms (its `reward_terms`: answer_match for the calculator, none for the "
        "other built-in envs, whose own rewards count through env_reward_weight); [] = none.",
    )
    env_reward_weight: float = Field(
        1.0, description="Weight of the reward the environment itself returns at each step."
    )
