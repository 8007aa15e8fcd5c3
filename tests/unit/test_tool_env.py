"""Tool-call parsing and ToolEnv steps: every malformed call becomes an error observation."""

from __future__ import annotations

import time
from typing import Any

from agent_core.envs.calculator import CalculatorEnv
from agent_core.envs.tool_calls import CallError, ToolCall, parse_tool_calls
from agent_core.envs.tool_env import ToolEnv
from agent_core.records import Action
from agent_core.tools.base import BaseTool, ToolResult

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2 + 3"}}</tool_call>'


def test_parse_well_formed_and_string_arguments() -> None:
    assert parse_tool_calls(CALL) == [ToolCall("calculator", {"expression": "2 + 3"})]
    stringly = (
        '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1\\"}"}</tool_call>'
    )
    assert parse_tool_calls(stringly) == [ToolCall("calculator", {"expression": "1"})]
    assert parse_tool_calls("Answer: 5") == []


def test_parse_malformed() -> None:
    (broken,) = parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {</tool_call>')
    assert isinstance(broken, CallError) and "not valid JSON" in broken.message
    (no_name,) = parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>')
    assert isinstance(no_name, CallError) and '"name"' in no_name.message
    (unclosed,) = parse_tool_calls('<tool_call>{"name": "calculator"')
    assert isinstance(unclosed, CallError) and "unclosed" in unclosed.message
    many = parse_tool_calls(CALL * 6)
    assert len(many) == 5 and isinstance(many[-1], CallError)


def _env(max_steps: int = 3) -> CalculatorEnv:
    env = CalculatorEnv(max_steps=max_steps)
    env.reset(CalculatorEnv.make_task(7))
    return env


def test_valid_call_appends_tool_result() -> None:
    env = _env()
    result = env.step(Action(text=CALL))
    assert not result.done and result.feedback == "5"
    assert result.observation is not None and result.observation.appended
    assert result.observation.messages[-2:] == [
        {"role": "assistant", "content": CALL},
        {"role": "tool", "content": "5"},
    ]
    assert result.info["tool_calls_ok"] == 1


def test_errors_become_observations_not_exceptions() -> None:
    cases = {
        "malformed JSON": '<tool_call>{"name": calculator}</tool_call>',
        "unknown tool": '<tool_call>{"name": "search", "arguments": {}}</tool_call>',
        "schema break": '<tool_call>{"name": "calculator", "arguments": {"expression": 5}}</tool_call>',
        "missing argument": '<tool_call>{"name": "calculator", "arguments": {}}</tool_call>',
        "arguments not an object": '<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>',
        "unsafe expression": '<tool_call>{"name": "calculator", "arguments": {"expression": "__import__(\\"os\\")"}}</tool_call>',
    }
    for label, text in cases.items():
        env = _env()
        result = env.step(Action(text=text))
        assert not result.done, label
        assert result.feedback.startswith("Error:"), (label, result.feedback)
        assert result.observation is not None
        assert result.observation.messages[-1] == {"role": "tool", "content": result.feedback}
        assert result.info["tool_calls_failed"] == 1, label


def test_answer_without_call_ends_and_is_judged() -> None:
    env = CalculatorEnv()
    task = CalculatorEnv.make_task(3)
    env.reset(task)
    right = env.step(Action(text=f"Answer: {task.answer}"))
    assert right.done and right.info["success"] and right.info["end"] == "answer"
    env.reset(task)
    wrong = env.step(Action(text=f"Answer: {task.answer + 1}"))
    assert wrong.done and not wrong.info["success"]


def test_max_steps_truncates() -> None:
    env = _env(max_steps=2)
    assert not env.step(Action(text=CALL)).done
    last = env.step(Action(text=CALL))
    assert last.done and last.truncated and last.info["end"] == "max_steps"


class _SlowTool(BaseTool):
    name = "slow"
    description = "Sleeps."
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    def execute(self, arguments: dict[str, Any]) -> ToolResult:
        time.sleep(2)
        return ToolResult(text="late")


class _CrashTool(BaseTool):
    name = "crash"
    description = "Raises."
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    def execute(self, arguments: dict[str, Any]) -> ToolResult:
        raise RuntimeError("boom")


class _Env(ToolEnv):
    @classmethod
    def make_task(cls, seed: int):
        return CalculatorEnv.make_task(seed)


def test_timeouts_and_crashes_are_observations() -> None:
    env = _Env([_SlowTool(), _CrashTool()], tool_timeout_s=0.2)
    env.reset(CalculatorEnv.make_task(1))
    slow = env.step(Action(text='<tool_call>{"name": "slow", "arguments": {}}</tool_call>'))
    assert slow.feedback == "Error: slow timed out after 0.2s"
    crash = env.step(Action(text='<tool_call>{"name": "crash", "arguments": {}}</tool_call>'))
    assert crash.feedback == "Error: boom"


def test_tasks_are_deterministic_and_split() -> None:
    a, b = CalculatorEnv.make_task(11), CalculatorEnv.make_task(11)
    assert a == b
    assert len({CalculatorEnv.make_task(s).prompt for s in range(50)}) > 40
    assert all(isinstance(CalculatorEnv.make_task(s).answer, int) for s in range(200))


def test_answer_extraction_is_linear_time() -> None:
    from agent_core.answers import extract_number_answer

    assert extract_number_answer("Answer: $ 1,234") == 1234.0
    assert extract_number_answer("Answer: -3.5 then Answer: 7") == 7.0
    assert extract_number_answer("Answer:" + " " * 40_000) is None  # was ~38 s with backtracking


def test_config_can_add_the_python_tool() -> None:
    from agent_core.envs import make_env

    env = make_env("calculator", max_steps=2, few_shot=False, kwargs={}, tools=["python"])
    assert set(env.tools) == {"calculator", "python"}
