"""Hermes-style tool-call parsing: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Parsing never raises: each malformed call becomes a `CallError` whose message tells the model
what to fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
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


def _call_bodies(text: str) -> tuple[list[str], bool]:
    """The text between each open tag and the next close tag, and whether one is left open.

    A linear scan: the lazy regex `<tool_call>(.*?)</tool_call>` retries from every unclosed
    open tag, which is quadratic in a reply of repeated tags (seconds for ~40 KB).
    """
    bodies: list[str] = []
    start = text.find(OPEN_TAG)
    while start != -1:
        end = text.find(CLOSE_TAG, start + len(OPEN_TAG))
        if end == -1:
            return bodies, True
        bodies.append(text[start + len(OPEN_TAG) : end])
        start = text.find(OPEN_TAG, end + len(CLOSE_TAG))
    return bodies, False


def parse_tool_calls(text: str) -> list[ToolCall | CallError]:
    """All calls in `text`, in order; an unclosed trailing `<tool_call>` is an error too."""
    bodies, unclosed = _call_bodies(text)
    results: list[ToolCall | CallError] = [_parse_one(body) for body in bodies[:MAX_CALLS_PER_STEP]]
    if unclosed:
        results.append(CallError(f"unclosed {OPEN_TAG}: end the call with {CLOSE_TAG}"))
    if len(bodies) + unclosed > MAX_CALLS_PER_STEP:
        extra = len(bodies) + unclosed - MAX_CALLS_PER_STEP
        note = CallError(f"only {MAX_CALLS_PER_STEP} tool calls per step; {extra} ignored")
        results = [*results[:MAX_CALLS_PER_STEP], note]
    return results
