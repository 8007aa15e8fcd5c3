"""Context policies: which part of an episode's history enters the next observation.

The env keeps the whole message history; a `ContextPolicy` selects the messages the policy sees.
Each step stores the exact prompt ids it was given, so any policy is trainable.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from agent_core.records import Message


class ContextPolicy(ABC):
    """Maps the full history to the messages of the next observation."""

    #: True when the selection only ever grows by appending (prompts may extend token-wise)
    append_only: bool = False

    @abstractmethod
    def select(self, history: list[Message], n_prefix: int) -> list[Message]:
        """Choose from `history`; its first `n_prefix` messages (system, examples, task) stay."""


class FullHistory(ContextPolicy):
    """Every message so far: the prompt grows by appending each reply and its feedback."""

    append_only = True

    def select(self, history: list[Message], n_prefix: int) -> list[Message]:
        return list(history)


CONTEXT_POLICIES: dict[str, type[ContextPolicy]] = {
    "full": FullHistory,
}
