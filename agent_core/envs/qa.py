"""The generic `qa` env: a question from a tasks file, answered as 'Answer: <text>' in one or
more turns (optional tools, optional retries after a wrong answer), checked by exact,
normalised or numeric match; the env's reward is 1.0 for a correct final answer.
"""

from __future__ import annotations

from typing import ClassVar

from agent_core.core.records import Action, StepResult, Task
from agent_core.envs.tool_env import ToolEnv
from agent_core.prompting.context import ContextPolicy
from agent_core.text.answers import MatchMode, answers_match, extract_text_answer

SYSTEM_PROMPT = (
    "Answer the user's question. Use the tools when they help. End your reply with the final "
    "answer on its own line as: Answer: <answer>"
)
RETRY_TEXT = "That answer is not correct. Try again, and end with: Answer: <answer>"


class QAEnv(ToolEnv):
    """Question answering: success = the final 'Answer:' matches the task's answer."""

    name = "qa"
    needs_task_file: ClassVar[bool] = True  # no generator of its own: tasks come from env.tasks

    def __init__(
        self,
        max_steps: int = 1,
        context: ContextPolicy | None = None,
        match: MatchMode = "normalized",
        rel_tol: float = 1e-6,
        retry_on_wrong: bool = False,
        system_prompt: str = SYSTEM_PROMPT,
        tool_timeout_s: float = 5.0,
    ) -> None:
        if match not in ("exact", "normalized", "numeric"):
            raise ValueError(f"match={match!r}: use 'exact', 'normalized' or 'numeric'")
        super().__init__(
            tools=[],
            system_prompt=system_prompt,
            max_steps=max_steps,
            context=context,
            tool_timeout_s=tool_timeout_s,
        )
        self.match: MatchMode = match
        self.rel_tol = rel_tol
        self.retry_on_wrong = retry_on_wrong

    @classmethod
    def make_task(cls, seed: int) -> Task:
        raise ValueError(
            f"env {cls.name!r} has no tasks of its own: set env.tasks (a data file with "
            "prompt and answer columns)"
        )

    def is_success(self, final_text: str, task: Task) -> bool:
        return answers_match(extract_text_answer(final_text), task.answer, self.match, self.rel_tol)

    def _finish(self, action: Action) -> StepResult:
        """Judge the answer; a wrong one may get another turn (`retry_on_wrong`)."""
        result = super()._finish(action)
        correct = result.info["success"]
        if correct or not self.retry_on_wrong or self.steps >= self.max_steps:
            result.reward = 1.0 if correct else 0.0
            return result
        self.history.append({"role": "user", "content": RETRY_TEXT})
        info = {**result.info, "end": "retry"}
        del info["success"]
        return StepResult(self.observe(), 0.0, done=False, feedback=RETRY_TEXT, info=info)
