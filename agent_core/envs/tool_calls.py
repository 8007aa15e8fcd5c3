"""Hermes-style tool-call parsing: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Parsing never raises: each malformed call becomes a `CallError` whose message tells the model
what to fix.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
_CALL_RE = re.compile(re.escape(OPEN_TAG) + r"(.*?)" + re.escape(CLOSE_TAG), re.DOTALL)
MAX_CALLS_PER_STEP = 4
MAX_CALL_CHARS = 4_000
FORMAT_HINT = f'{OPEN_TAG}{{"name": "<tool>", "arguments": {{...}}}}{CLOSE_TAG}'


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call: tool name and its JSON arguments."""

    name: str
    arguments: Any


@dataclass(frozen=True)
class CallError:
    """A malformed call and why."""

    message: str


def _parse_one(body: str) -> ToolCall | CallError:
    if len(body) > MAX_CALL_CHARS:
        return CallError(f"tool call longer than {MAX_CALL_CHARS} characters")
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
        return CallError(f"tool call is not valid JSON ({reason}); write {FORMAT_HINT}")
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return CallError(f'tool call needs a string "name"; write {FORMAT_HINT}')
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):  # some models send the arguments object as a JSON string
        try:
            arguments = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            return CallError(f'"arguments" of {payload["name"]} must be a JSON object')
    return ToolCall(name=payload["name"], arguments=arguments)


def parse_tool_calls(text: str) -> list[ToolCall | CallError]:
    """All calls in `text`, in order; an unclosed trailing `<tool_call>` is an error too."""
    results: list[ToolCall | CallError] = [_parse_one(m.group(1)) for m in _CALL_RE.finditer(text)]
    tail = _CALL_RE.sub("", text)
    if OPEN_TAG in tail:
        results.append(CallError(f"unclosed {OPEN_TAG}: end the call with {CLOSE_TAG}"))
    if len(results) > MAX_CALLS_PER_STEP:
        extra = len(results) - MAX_CALLS_PER_STEP
        note = CallError(f"only {MAX_CALLS_PER_STEP} tool calls per step; {extra} ignored")
        results = [*results[:MAX_CALLS_PER_STEP], note]
    return results
