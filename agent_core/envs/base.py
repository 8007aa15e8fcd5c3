"""The environment contract: `AgentEnv.reset(task) -> Observation`, `step(action) -> StepResult`.

An env also knows its task distribution (`make_task(seed)`) and may expose `anchor_key()`, a
hashable summary of its current state for step-level grouping (GiGPO).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from agent_core.context import ContextServices
from agent_core.records import Action, Observation, StepResult, Task


class AgentEnv(ABC):
    """One episode at a time; create one instance per concurrent episode."""

    name: ClassVar[str]
    #: text that ends a reply early (the env acts on what came before it)
    stop_strings: ClassVar[tuple[str, ...]] = ()

    @classmethod
    @abstractmethod
    def make_task(cls, seed: int) -> Task:
        """The task instance for `seed` (deterministic: same seed, same task)."""

    @abstractmethod
    def reset(self, task: Task) -> Observation:
        """Start an episode on `task` and return the first observation."""

    @abstractmethod
    def step(self, action: Action) -> StepResult:
        """Apply the policy's action and return feedback, reward and whether the episode ended."""

    def bind_services(self, services: ContextServices) -> None:
        """Receive model-backed helpers (token counter, text generator) for the context policy.

        Envs without a context policy need none, so the default ignores them.
        """
        return None

    def solve_step(self) -> str | None:
        """The env's own solver: a correct next reply for the current state (for warm-up
        demonstrations), or None when the env has no solver."""
        return None

    def anchor_key(self) -> str | None:
        """A hashable key of the current env state (same key = same state), or None."""
        return None
