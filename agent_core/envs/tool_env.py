"""`ToolEnv`: an episode in which the model may call tools before it answers.

Each step parses Hermes-style calls from the reply, runs them (time-limited), and appends their
results as tool messages. The episode ends when the model replies without a call, or at
`max_steps`. Nothing the model writes can raise out of `step`.
"""

from __future__ import annotations

import concurrent.futures as cf
from typing import Any

from agent_core.context import ContextPolicy, ContextServices, FullHistory
from agent_core.envs.base import AgentEnv
from agent_core.envs.tool_calls import CLOSE_TAG, CallError, ToolCall, parse_tool_calls
from agent_core.records import Action, Message, Observation, StepResult, Task
from agent_core.tools.base import BaseTool, ToolResult

# Tools run on a shared pool so a slow call can be abandoned after its timeout.
_TOOL_POOL = cf.ThreadPoolExecutor(max_workers=8, thread_name_prefix="steprl-tool")


class ToolEnv(AgentEnv):
    """A tool-use episode: system prompt, optional worked examples, the task, then tool turns."""

    name = "tool_env"
    stop_strings = (CLOSE_TAG,)  # a call is complete: run it rather than let the model go on

    def __init__(
        self,
        tools: list[BaseTool],
        system_prompt: str = "",
        examples: list[Message] | None = None,
        max_steps: int = 3,
        context: ContextPolicy | None = None,
        tool_timeout_s: float = 5.0,
    ) -> None:
        self.tools = {tool.name: tool for tool in tools}
        self.system_prompt = system_prompt
        self.examples = list(examples or [])
        self.max_steps = max_steps
        self.context = context or FullHistory()
        self.tool_timeout_s = tool_timeout_s
        self.task: Task | None = None
        self.history: list[Message] = []
        self.n_prefix = 0
        self.steps = 0
        self.tool_calls_ok = 0
        self.tool_calls_failed = 0

    def add_tools(self, tools: list[BaseTool]) -> None:
        """Offer more tools (their schemas enter the prompt; calls to them are run)."""
        for tool in tools:
            self.tools[tool.name] = tool

    def bind_services(self, services: ContextServices) -> None:
        self.context.bind(services)

    def reset(self, task: Task) -> Observation:
        self.task = task
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        self.history = [*system, *self.examples, {"role": "user", "content": task.prompt}]
        self.n_prefix = len(self.history)
        self.steps = 0
        self.tool_calls_ok = self.tool_calls_failed = 0
        return self._observe(appended=False)

    def _observe(self, appended: bool) -> Observation:
        messages = self.context.select(self.history, self.n_prefix)
        schemas = [tool.schema() for tool in self.tools.values()]
        return Observation(messages, schemas, appended=appended and self.context.append_only)

    def step(self, action: Action) -> StepResult:
        self.steps += 1
        self.history.append({"role": "assistant", "content": action.text})
        calls = parse_tool_calls(action.text)
        if not calls:
            return self._finish(action)
        results = [self._run(call) for call in calls]
        for result in results:
            self.history.append({"role": "tool", "content": result.text})
        reward = sum(r.reward or 0.0 for r in results)
        info = self._counts()
        feedback = "\n".join(r.text for r in results)
        if self.steps >= self.max_steps:
            info["end"] = "max_steps"
            return StepResult(None, reward, done=True, feedback=feedback, truncated=True, info=info)
        return StepResult(
            self._observe(appended=True), reward, done=False, feedback=feedback, info=info
        )

    def _finish(self, action: Action) -> StepResult:
        """The model answered without a call: the episode ends and is judged."""
        assert self.task is not None
        info = self._counts()
        info["success"] = bool(self.is_success(action.text, self.task))
        info["end"] = "answer"
        return StepResult(None, 0.0, done=True, feedback="", truncated=action.truncated, info=info)

    def _counts(self) -> dict[str, Any]:
        return {"tool_calls_ok": self.tool_calls_ok, "tool_calls_failed": self.tool_calls_failed}

    def _run(self, call: ToolCall | CallError) -> ToolResult:
        result = self._execute(call)
        if result.error:
            self.tool_calls_failed += 1
        else:
            self.tool_calls_ok += 1
        return result

    def _execute(self, call: ToolCall | CallError) -> ToolResult:
        if isinstance(call, CallError):
            return ToolResult(text=f"Error: {call.message}", error=True)
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return ToolResult(
                text=f"Error: unknown tool {call.name!r}; available: {known}", error=True
            )
        future = _TOOL_POOL.submit(tool.run, call.arguments)
        try:
            return future.result(timeout=self.tool_timeout_s)
        except cf.TimeoutError:
            return ToolResult(
                text=f"Error: {call.name} timed out after {self.tool_timeout_s}s", error=True
            )

    def is_success(self, final_text: str, task: Task) -> bool:
        """Whether the final reply solves `task`; envs with a checkable answer override this."""
        return False
