"""The `search` env: multi-hop questions about invented entities, answered with a BM25
`search` tool over a corpus (Search-R1 style); a qa env whose tool is always there.

By default the questions and the corpus are the generated world of `search_world`; with
`env.tasks` (a question file) and `env.tool_options.search.corpus` (a passage file) it runs on
the user's own data.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from agent_core.core.records import Message, Task
from agent_core.envs.qa import QAEnv
from agent_core.prompting.context import ContextPolicy
from agent_core.text.answers import MatchMode
from agent_core.tools.search import SearchTool
from agent_core.tools.search_world import question

SYSTEM_PROMPT = (
    "You answer questions about a private document collection that only the search tool can "
    "read. Search for each fact you need, one search per step; then reply with the final "
    "answer as: Answer: <answer>"
)


def _call(query: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'search', 'arguments': {'query': query}})}</tool_call>"


# One worked exchange with two searches (about entities that are not in the corpus).
EXAMPLES: list[Message] = [
    {"role": "user", "content": "In which town was the founder of Orvane Mills born?"},
    {"role": "assistant", "content": _call("Orvane Mills")},
    {
        "role": "tool",
        "content": "[1] Orvane Mills: Orvane Mills is a maker of wool blankets with its seat in "
        "Kelport. It was founded in 1901 by Ada Brisk.",
    },
    {"role": "assistant", "content": _call("Ada Brisk")},
    {
        "role": "tool",
        "content": "[1] Ada Brisk: Ada Brisk is an engineer and entrepreneur. Ada Brisk was born "
        "in Tamsford.",
    },
    {"role": "assistant", "content": "Answer: Tamsford"},
]


class SearchEnv(QAEnv):
    """Questions answered with the `search` tool; success = the normalised answer matches."""

    name = "search"
    needs_task_file = False
    own_tools: ClassVar[tuple[str, ...]] = ("search",)

    def __init__(
        self,
        max_steps: int = 4,
        few_shot: bool = True,
        context: ContextPolicy | None = None,
        match: MatchMode = "normalized",
        search: dict[str, Any] | None = None,
        tool_timeout_s: float = 5.0,
    ) -> None:
        super().__init__(
            max_steps=max_steps,
            context=context,
            match=match,
            system_prompt=SYSTEM_PROMPT,
            tool_timeout_s=tool_timeout_s,
        )
        self.examples = EXAMPLES if few_shot else []
        self.add_tools([SearchTool(**dict(search or {}))])  # env.tool_options.search

    @classmethod
    def make_task(cls, seed: int) -> Task:
        q = question(seed)
        meta = {"seed": seed, "kind": q.kind, "hops": list(q.hops)}
        return Task(task_id=f"search-{seed}", prompt=q.text, answer=q.answer, meta=meta)

    def solve_step(self) -> str | None:
        """Search each hop in turn, then answer (generated questions only)."""
        if self.task is None or "hops" not in self.task.meta:
            return None
        hops = self.task.meta["hops"]
        if self.tool_calls_ok < len(hops):
            return _call(hops[self.tool_calls_ok])
        return f"Answer: {self.task.answer}"
