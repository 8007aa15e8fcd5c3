"""Property-based fuzzing of tool-call parsing, ToolEnv.step, BaseTool.run and the calculator.

Malformed model output must always come back as an "Error:" observation; nothing may raise.
"""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any, ClassVar

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent_core.core.records import Action, StepResult, Task
from agent_core.envs.calculator import CalculatorEnv
from agent_core.envs.tool_env import ToolEnv
from agent_core.text.tool_calls import (
    CLOSE_TAG,
    MAX_CALLS_PER_STEP,
    OPEN_TAG,
    CallError,
    ToolCall,
    parse_tool_calls,
)
from agent_core.tools.base import BaseTool, ToolResult
from agent_core.tools.calculator import MAX_ABS_VALUE, CalculatorTool, ToolError, evaluate

FUZZ = settings(
    deadline=None,
    database=None,  # no .hypothesis folder in the repo
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def fuzz(examples: int) -> settings:
    return settings(FUZZ, max_examples=examples)


# A hang detector, not a benchmark: a safe evaluator answers in microseconds.
HANG_S = 5.0


class ConfigTool(BaseTool):
    """A dummy tool with a nested, self-referencing object schema."""

    name = "configure"
    description = "Apply a nested configuration."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "config": {
                "type": "object",
                "properties": {
                    "depth": {"type": "integer", "minimum": 0, "maximum": 10},
                    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
                    "inner": {
                        "type": "object",
                        "properties": {
                            "flag": {"type": "boolean"},
                            "child": {"$ref": "#/properties/config"},
                        },
                        "required": ["flag"],
                        "additionalProperties": False,
                    },
                },
                "required": ["inner"],
                "additionalProperties": False,
            }
        },
        "required": ["config"],
        "additionalProperties": False,
    }

    def execute(self, arguments: dict[str, Any]) -> ToolResult:
        return ToolResult(text=f"configured {len(json.dumps(arguments))} bytes")


class TwoToolEnv(ToolEnv):
    """A ToolEnv with the calculator and the nested-schema tool."""

    name = "two_tools"

    @classmethod
    def make_task(cls, seed: int) -> Task:
        return Task(task_id=f"two-{seed}", prompt="Configure, then compute.")


CALCULATOR = CalculatorTool()
CONFIG = ConfigTool()
CALC_ENV = CalculatorEnv(max_steps=10**9)
TWO_ENV = TwoToolEnv([CalculatorTool(), ConfigTool()], max_steps=10**9)

# ---------------------------------------------------------------------------------------------
# Strategies

WEIRD = ["\x00", "\ud800", "\udfff", "\u202e", "\ufeff", "\r\n", "\t", "\x1b[2J", "😀", "é"]
junk = st.text(max_size=40) | st.sampled_from([*WEIRD, "Answer: 12", "null", "{", "}"])
json_scalar = (
    st.none()
    | st.booleans()
    | st.integers(-(10**30), 10**30)
    | st.floats()  # NaN and ±inf serialize as NaN/Infinity, which json.loads accepts
    | junk
)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(junk, inner, max_size=3),
    max_leaves=6,
)
# fmt: off
EXPRESSION_ATOMS = [
    "1e309", "10**10**10", "9**9**9", "(1e-10)**-64", "1e-300**-2", "0**-1", "(-8)**0.5",
    "1/0", "1/0.0", "2**64", "2**65", "10**60", "10**61", "-10**61", "1e308*10", "5/1e-320",
    "(10**40)**-2", "1_000", "0x1F", "1j", "nan", "inf", "__import__('os').system('true')",
    "(lambda: 1)()", "[x for x in range(9)]", "{x: 1 for x in 'ab'}", "(x for x in ())",
    "a.b", "abs(-1)", "().__class__.__bases__", "f'{1}'", "(x := 1)", "1 if 1 else 2",
    "1 < 2", "not 1", "~1", "1 // 2", "7 % 3", "1 << 64", "...", "None", "True", "'a' * 10",
    "b'x'", "[1, 2]", "{1: 2}", "yield 1", "await x", "*a", "1,2", "", " ", "(", ")", "((1)",
    "1 +", "**2", "2 ** -1", "(-2) ** -3", "0.0 ** 0", "12 × 3", "12 ÷ 4", "2 ^ 10", "2 ^^ 3",
    "9" * 199, "1" + "0" * 61, "(" * 150 + "1" + ")" * 150, "-" * 199 + "1", "1+" * 99 + "1",
]
# fmt: on
number = st.integers(-1000, 1000).map(str) | st.floats(allow_nan=False).map(repr)
expression = st.recursive(
    st.sampled_from(EXPRESSION_ATOMS) | number | junk,
    lambda inner: (
        st.builds(
            "{}{}{}".format,
            inner,
            st.sampled_from([" + ", "-", "*", " / ", "**", "^", "×", "÷", "//", "%", " and ", "@"]),
            inner,
        )
        | inner.map("({})".format)
        | inner.map("-{}".format)
    ),
    max_leaves=8,
)


def _nested_list(depth: int) -> Any:
    value: Any = "1"
    for _ in range(depth):  # built iteratively: deeper than any recursive walk can go
        value = [value]
    return value


def _nested_dict(depth: int) -> Any:
    value: Any = {"flag": True}
    for _ in range(depth):
        value = {"a": value, "config": {"inner": value}}
    return value


deep_object = st.integers(0, 20_000).flatmap(
    lambda d: st.sampled_from([_nested_list(d), _nested_dict(d), {"expression": _nested_list(d)}])
)
config_object = st.recursive(
    st.fixed_dictionaries({"inner": st.fixed_dictionaries({"flag": st.booleans()})}),
    lambda inner: st.fixed_dictionaries(
        {"inner": st.fixed_dictionaries({"flag": st.booleans(), "child": inner})},
        optional={"depth": st.integers(-2, 12), "tags": st.lists(junk, max_size=6)},
    ),
    max_leaves=6,
)
arguments = st.one_of(
    json_value,
    expression.map(lambda e: {"expression": e}),
    json_value.map(lambda v: {"expression": v}),
    st.builds(lambda c: {"config": c}, config_object),
    st.builds(
        lambda c, extra: {"config": c, **extra},
        config_object,
        st.dictionaries(junk, json_value, max_size=2),
    ),
    st.integers(0, 100_000).map(lambda n: {"expression": "1+" * n + "1"}),
)
tool_name = (
    st.sampled_from(["calculator", "configure", "Calculator", "calc", "", " calculator", "python"])
    | junk
    | st.integers()
    | st.none()
    | st.lists(st.integers(), max_size=2)
)
payload = st.one_of(
    st.fixed_dictionaries({"name": tool_name, "arguments": arguments}),
    st.fixed_dictionaries({"name": tool_name, "arguments": arguments.map(json.dumps)}),
    st.fixed_dictionaries({"name": tool_name, "arguments": junk}),  # arguments: invalid JSON
    st.fixed_dictionaries({"name": tool_name}),
    st.dictionaries(junk, json_value, max_size=3),
    json_value,
)


@st.composite
def mutated(draw: st.DrawFn, text: str) -> str:
    """Break valid JSON: truncate, delete, insert or duplicate at a random point."""
    at = draw(st.integers(0, len(text)))
    action = draw(st.sampled_from(["truncate", "delete", "insert", "duplicate", "quotes"]))
    if action == "truncate":
        return text[:at]
    if action == "delete":
        return text[:at] + text[at + 1 :]
    if action == "insert":
        return text[:at] + draw(st.sampled_from(['"', "{", "}", "[", ",", ":", *WEIRD])) + text[at:]
    if action == "duplicate":
        return text[:at] + text[at // 2 :]
    return text.replace('"', "'")


deep_json = st.integers(0, 3000).flatmap(
    lambda d: st.sampled_from(
        [
            "[" * d + "]" * d,
            '{"a":' * d + "1" + "}" * d,
            '{"name": "calculator", "arguments": ' + '{"a":' * d + "1" + "}" * d + "}",
            '{"name": "configure", "arguments": ' + "[" * d + "]" * d + "}",
            '{"name": "calculator", "arguments": "' + "[" * d + '"}',
            "[" * d,
        ]
    )
)
call_body = st.one_of(
    payload.map(json.dumps),
    payload.map(json.dumps).flatmap(mutated),
    deep_json,
    junk,
    st.integers(0, 6000).map(
        lambda n: '{"name": "calculator", "arguments": {"expression": "' + "9" * n + '"}}'
    ),
)
VALID_CALL = (
    f'{OPEN_TAG}{{"name": "calculator", "arguments": {{"expression": "2 + 3"}}}}{CLOSE_TAG}'
)
TAGS = [
    OPEN_TAG,
    CLOSE_TAG,
    "<tool_call",
    "tool_call>",
    "</tool_call",
    "<TOOL_CALL>",
    "<tool_call >",
]
fragment = st.one_of(
    call_body.map(f"{OPEN_TAG}{{}}{CLOSE_TAG}".format), st.sampled_from(TAGS), junk
)
model_output = st.one_of(
    st.lists(fragment, max_size=8).map("".join),
    st.lists(st.sampled_from([VALID_CALL, *TAGS]) | fragment, min_size=5, max_size=16).map("".join),
    st.builds(
        lambda tag, n: tag * n,
        st.sampled_from([OPEN_TAG, CLOSE_TAG, OPEN_TAG + CLOSE_TAG]),
        st.integers(1, 5000),
    ),
    st.integers(1, 50).map(lambda n: OPEN_TAG * n + VALID_CALL + CLOSE_TAG * n),
    st.lists(st.sampled_from([*TAGS, "{", "}", '"', "x"]), max_size=30).map("".join),
)

# ---------------------------------------------------------------------------------------------
# Properties


def _check_calls(calls: list[ToolCall | CallError]) -> None:
    assert len(calls) <= MAX_CALLS_PER_STEP + 1
    for call in calls:
        assert isinstance(call, ToolCall | CallError)
        if isinstance(call, ToolCall):
            assert isinstance(call.name, str)
        else:
            assert isinstance(call.message, str) and call.message


@fuzz(2000)
@given(text=model_output)
def test_parse_tool_calls_never_raises(text: str) -> None:
    _check_calls(parse_tool_calls(text))


_REFERENCE_RE = re.compile(re.escape(OPEN_TAG) + r"(.*?)" + re.escape(CLOSE_TAG), re.DOTALL)


@fuzz(1000)
@given(
    text=st.lists(
        st.sampled_from([*TAGS, "x", '{"name": "calculator"}', "<", ">"]), max_size=20
    ).map("".join)
)
def test_parse_matches_the_regex_reference(text: str) -> None:
    """The linear scanner finds the same bodies as the (quadratic) lazy regex it replaced."""
    matches = list(_REFERENCE_RE.finditer(text))
    expected = parse_tool_calls(text)
    bodies = [m.group(1) for m in matches]
    unclosed = OPEN_TAG in text[matches[-1].end() if matches else 0 :]
    if len(bodies) + unclosed <= MAX_CALLS_PER_STEP:
        assert len(expected) == len(bodies) + unclosed
        assert all(isinstance(c, CallError) for c in expected[len(bodies) :])
        assert [parse_tool_calls(f"{OPEN_TAG}{b}{CLOSE_TAG}")[0] for b in bodies] == expected[
            : len(bodies)
        ]
    else:
        assert len(expected) == MAX_CALLS_PER_STEP + 1
        extra = len(bodies) + unclosed - MAX_CALLS_PER_STEP
        assert expected[-1] == CallError(
            f"only {MAX_CALLS_PER_STEP} tool calls per step; {extra} ignored"
        )


def _malformed(env: ToolEnv, call: ToolCall | CallError) -> bool:
    """Whether a call cannot succeed: bad format, unknown tool or schema-invalid arguments."""
    if isinstance(call, CallError) or call.name not in env.tools:
        return True
    try:
        return env.tools[call.name].validate(call.arguments) is not None
    except Exception:  # what the validator cannot walk is malformed too
        return True


def _check_step(env: ToolEnv, text: str) -> None:
    env.reset(env.make_task(0))
    calls = parse_tool_calls(text)
    result = env.step(Action(text=text))
    assert isinstance(result, StepResult)
    if not calls:  # a reply without a call ends the episode
        assert result.done and result.feedback == ""
        return
    assert not result.done and result.observation is not None
    messages = [m["content"] for m in env.history[-len(calls) :]]
    assert [m["role"] for m in env.history[-len(calls) :]] == ["tool"] * len(calls)
    for call, message in zip(calls, messages, strict=True):
        if _malformed(env, call):
            assert message.startswith("Error:"), (call, message)
    errors = sum(message.startswith("Error:") for message in messages)
    assert result.info["tool_calls_failed"] == errors
    assert result.info["tool_calls_ok"] == len(calls) - errors
    assert result.feedback == "\n".join(messages)


@fuzz(2000)
@given(text=model_output)
def test_calculator_env_step_turns_garbage_into_error_observations(text: str) -> None:
    _check_step(CALC_ENV, text)


@fuzz(1500)
@given(text=model_output | payload.map(lambda p: f"{OPEN_TAG}{json.dumps(p)}{CLOSE_TAG}"))
def test_two_tool_env_step_turns_garbage_into_error_observations(text: str) -> None:
    _check_step(TWO_ENV, text)


@fuzz(2000)
@given(
    args=arguments | deep_object | st.integers(0, 200_000).map(lambda n: {"expression": "x" * n})
)
def test_tool_run_never_raises(args: Any) -> None:
    for tool in (CALCULATOR, CONFIG):
        result = tool.run(args)
        assert isinstance(result, ToolResult)
        assert result.text.startswith("Error:") == result.error
    calculated = CALCULATOR.run(args)
    if not calculated.error:
        assert isinstance(args, dict) and isinstance(args["expression"], str)
        assert math.isfinite(float(calculated.text))


@fuzz(2500)
@given(text=expression)
def test_evaluate_returns_a_bounded_number_or_refuses(text: str) -> None:
    start = time.monotonic()
    try:
        value = evaluate(text)
    except ToolError:
        value = None
    assert time.monotonic() - start < HANG_S
    if value is not None:
        assert isinstance(value, int | float) and not isinstance(value, bool)
        assert math.isfinite(value) and abs(value) <= MAX_ABS_VALUE
    result = CALCULATOR.run({"expression": text})
    assert result.error == (value is None)  # the tool and the evaluator agree


Node = tuple[str, int | float | None]  # (expression text, its value or None once refused)


def _combine(left: Node, op: str, right: Node) -> Node:
    """Python's value of `left op right`, or None where the calculator must refuse."""
    text = f"({left[0]} {op} {right[0]})"
    a, b = left[1], right[1]
    if a is None or b is None or (op == "/" and b == 0):
        return text, None
    value = {"+": a + b, "-": a - b, "*": a * b}[op] if op != "/" else a / b
    return text, value if abs(value) <= MAX_ABS_VALUE else None


def _power(base: Node, exponent: int) -> Node:
    text = f"({base[0]} ** {exponent})"
    if base[1] is None or (base[1] == 0 and exponent < 0):
        return text, None
    value = base[1] ** exponent
    return text, value if abs(value) <= MAX_ABS_VALUE / 10 else None  # stay clear of the cap


small_arithmetic = st.recursive(
    st.one_of(st.integers(0, 99), st.sampled_from([10**20, 2**64, 3**40])).map(
        lambda n: (str(n), n)
    ),
    lambda inner: (
        st.builds(_combine, inner, st.sampled_from(["+", "-", "*", "/"]), inner)
        | st.builds(_power, inner, st.integers(-2, 3))
        | inner.map(lambda node: (f"(-{node[0]})", None if node[1] is None else -node[1]))
    ),
    max_leaves=6,
)


@fuzz(1500)
@given(node=small_arithmetic)
@example(node=("((10 ** 40) ** -2)", 1e-80))  # a big base to a negative power is small
def test_small_integer_arithmetic_agrees_with_python(node: Node) -> None:
    text, within_caps = node
    if len(text) > 200:
        return
    try:
        expected = eval(text, {"__builtins__": {}})  # text holds only ints, + - * / ** and ()
    except ZeroDivisionError:
        expected = None
    try:
        got = evaluate(text)
    except ToolError:
        assert expected is None or within_caps is None, text
        return
    assert got == expected and type(got) is type(expected), text
