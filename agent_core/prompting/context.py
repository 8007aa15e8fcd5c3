"""Context policies: which part of an episode's history enters the next observation.

The env keeps the whole message history; a `ContextPolicy` selects the messages the policy sees.
Each step stores the exact prompt ids it was given, so any policy is trainable. An image lives
in the message that shows it: a policy that drops a turn drops its images, a token budget
counts their tokens, a summary writes `[image]` where one was.
"""

from __future__ import annotations

import inspect
import json
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent_core.core.images import message_key, message_text
from agent_core.core.records import Message
from agent_core.core.registry import resolve, resolve_subclass
from agent_core.text.tool_calls import ToolCall, parse_tool_calls

#: A summarizer turns messages (the task message, then the turns to fold) into a short text.
Summarizer = Callable[[list[Message]], str]

SUMMARY_PREFIX = "Summary of earlier steps: "
SUMMARY_INSTRUCTION = (
    "Summarize the progress so far in <= 3 sentences: what was tried, what came back, "
    "and what remains to do. Reply with the summary only."
)


@dataclass(frozen=True)
class ContextServices:
    """Model-backed helpers a policy may need; the rollout side binds them to each env.

    `count_tokens(messages)` is the prompt length of `messages` as the engine would see it;
    `generate_text(messages)` is the policy model's reply to `messages`.
    """

    count_tokens: Callable[[list[Message]], int] | None = None
    generate_text: Callable[[list[Message]], str] | None = None


def split_turns(messages: list[Message]) -> list[list[Message]]:
    """Group messages into turns: an assistant message plus the tool/user messages after it.

    Messages before the first assistant message (an env's `first_turn`: what only the first
    turn needs, see `AgentEnv.start_history`) form their own leading group, the oldest turn,
    which a window drops once later turns take its place. No cut ever separates a tool result
    from the call that produced it.
    """
    turns: list[list[Message]] = []
    for message in messages:
        if message["role"] == "assistant" or not turns:
            turns.append([message])
        else:
            turns[-1].append(message)
    return turns


def _flatten(turns: list[list[Message]]) -> list[Message]:
    return [message for turn in turns for message in turn]


def _positive_int(owner: str, field: str, value: Any, minimum: int = 1) -> int:
    # bool is an int subclass; `last_turns=True` is a config mistake, not 1.
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{owner}: {field} must be an integer >= {minimum}, got {value!r}")
    return value


class ContextPolicy(ABC):
    """Maps the full history to the messages of the next observation."""

    #: True when the selection only ever grows by appending (prompts may extend token-wise)
    append_only: bool = False
    services: ContextServices | None = None

    @abstractmethod
    def select(self, history: list[Message], n_prefix: int) -> list[Message]:
        """Choose from `history`; its first `n_prefix` messages (system, examples, task) stay."""

    def bind(self, services: ContextServices) -> None:
        """Receive the model-backed helpers (token counter, text generator) this policy uses."""
        self.services = services

    def _service(self, name: str) -> Callable[[list[Message]], Any]:
        fn = getattr(self.services, name, None) if self.services is not None else None
        if fn is None:
            raise RuntimeError(
                f"{type(self).__name__} needs ContextServices.{name}: call "
                f"env.bind_services(ContextServices({name}=...)) before reset"
            )
        return fn


class FullHistory(ContextPolicy):
    """Every message so far: the prompt grows by appending each reply and its feedback."""

    append_only = True

    def select(self, history: list[Message], n_prefix: int) -> list[Message]:
        return list(history)


class SlidingWindow(ContextPolicy):
    """The prefix plus the last `last_turns` whole turns; older turns are dropped."""

    def __init__(self, last_turns: int = 2) -> None:
        self.last_turns = _positive_int("SlidingWindow", "last_turns", last_turns)

    def select(self, history: list[Message], n_prefix: int) -> list[Message]:
        turns = split_turns(history[n_prefix:])
        return [*history[:n_prefix], *_flatten(turns[-self.last_turns :])]


class LatestObservation(ContextPolicy):
    """The prefix plus the newest observation alone: the messages after the last reply (before
    any reply, the first turn). No earlier reply enters the prompt, so a policy cannot lean on
    its own last move where the newest observation holds the whole state (a board game)."""

    def select(self, history: list[Message], n_prefix: int) -> list[Message]:
        turns = split_turns(history[n_prefix:])
        newest = [m for m in turns[-1] if m["role"] != "assistant"] if turns else []
        return [*history[:n_prefix], *newest]


class TokenBudget(ContextPolicy):
    """The prefix plus as many of the newest whole turns as fit in `max_tokens`.

    Tokens are counted by the bound `ContextServices.count_tokens`. When even the prefix plus
    the last turn is over budget, that is still returned: the model must see its latest
    feedback, and the rollout loop's `max_prompt_tokens` guard ends an episode that is too long.
    """

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = _positive_int("TokenBudget", "max_tokens", max_tokens)

    def select(self, history: list[Message], n_prefix: int) -> list[Message]:
        count_tokens = self._service("count_tokens")
        prefix, turns = history[:n_prefix], split_turns(history[n_prefix:])
        start = 0  # drop the oldest turn until it fits, but never the last one
        while (
            start < len(turns) - 1
            and count_tokens([*prefix, *_flatten(turns[start:])]) > self.max_tokens
        ):
            start += 1
        return [*prefix, *_flatten(turns[start:])]


def _clip(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: max(limit - 3, 0)] + "..."


class RuleSummarizer:
    """Deterministic summary: one short line per earlier step, `Step i: action -> feedback`.

    Tool calls are shown as `name({json args})`. When the lines exceed `max_chars`, the newest
    lines are kept (they matter most for the next action) and a short note counts the rest.
    """

    def __init__(self, max_chars: int = 600, line_chars: int = 160) -> None:
        self.max_chars = _positive_int("RuleSummarizer", "max_chars", max_chars)
        self.line_chars = _positive_int("RuleSummarizer", "line_chars", line_chars)

    def __call__(self, messages: list[Message]) -> str:
        turns = [t for t in split_turns(messages) if t[0]["role"] == "assistant"]
        lines = [self._line(i, turn) for i, turn in enumerate(turns, 1)]
        if not lines:
            return "(no earlier steps)"
        kept: list[str] = []
        used = 0
        for line in reversed(lines):
            if used + len(line) > self.max_chars:
                break
            kept.insert(0, line)
            used += len(line) + 1
        if not kept:  # even the newest line is over budget: show it clipped
            kept = [_clip(lines[-1], self.max_chars)]
        omitted = len(lines) - len(kept)
        head = [f"({omitted} earlier steps omitted)"] if omitted else []
        return "\n".join([*head, *kept])

    def _line(self, index: int, turn: list[Message]) -> str:
        half = self.line_chars // 2
        action = _clip(_describe_action(message_text(turn[0])), half)
        feedback = _clip(" | ".join(message_text(m) for m in turn[1:]), half) or "(no feedback)"
        return f"Step {index}: {action} -> {feedback}"


def _describe_action(text: str) -> str:
    """`name({args})` for each tool call in `text`, else the text itself."""
    # Imported here: agent_core.envs imports this module, so a top-level import would cycle.

    calls = parse_tool_calls(text)
    if not calls:
        return text
    shown = [
        f"{c.name}({json.dumps(c.arguments, ensure_ascii=False)})"
        if isinstance(c, ToolCall)
        else "malformed tool call"
        for c in calls
    ]
    return "; ".join(shown)


class PolicySummarizer:
    """Asks the policy model itself (bound `ContextServices.generate_text`) for the summary."""

    def __init__(self, instruction: str = SUMMARY_INSTRUCTION, max_chars: int = 600) -> None:
        self.instruction = instruction
        self.max_chars = _positive_int("PolicySummarizer", "max_chars", max_chars)
        self.generate_text: Callable[[list[Message]], str] | None = None

    def bind(self, services: ContextServices) -> None:
        self.generate_text = services.generate_text

    def __call__(self, messages: list[Message]) -> str:
        if self.generate_text is None:
            raise RuntimeError(
                "PolicySummarizer needs ContextServices.generate_text: call "
                "env.bind_services(ContextServices(generate_text=...)) before reset"
            )
        # The conversation as the model saw it, then the instruction as the next user turn.
        reply = self.generate_text([*messages, {"role": "user", "content": self.instruction}])
        return _clip(reply, self.max_chars) or "(empty summary)"


SUMMARIZERS: dict[str, Callable[..., Summarizer]] = {
    "rule": RuleSummarizer,
    "policy": PolicySummarizer,
}


class Summarize(ContextPolicy):
    """The prefix, one user message summarizing the older turns, then the last turns verbatim.

    The summarizer gets the task message (last of the prefix) followed by the turns to fold.
    Summaries are cached by those messages, so selecting the same history twice (a re-render,
    a retried step) does not call the summarizer again.
    """

    def __init__(
        self, summarizer: Summarizer | None = None, keep_last_turns: int = 1, cache_size: int = 64
    ) -> None:
        self.summarizer: Summarizer = summarizer if summarizer is not None else RuleSummarizer()
        self.keep_last_turns = _positive_int("Summarize", "keep_last_turns", keep_last_turns, 0)
        self.cache_size = _positive_int("Summarize", "cache_size", cache_size)
        self._cache: OrderedDict[tuple[tuple[str, ...], ...], str] = OrderedDict()

    def bind(self, services: ContextServices) -> None:
        super().bind(services)
        bind = getattr(self.summarizer, "bind", None)
        if callable(bind):
            bind(services)

    def select(self, history: list[Message], n_prefix: int) -> list[Message]:
        prefix, turns = history[:n_prefix], split_turns(history[n_prefix:])
        split = len(turns) - self.keep_last_turns
        if split <= 0:
            return list(history)
        summary = self._summary([*prefix[-1:], *_flatten(turns[:split])])
        note = {"role": "user", "content": SUMMARY_PREFIX + summary}
        return [*prefix, note, *_flatten(turns[split:])]

    def _summary(self, messages: list[Message]) -> str:
        key = tuple(message_key(m) for m in messages)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        summary = self.summarizer(messages)
        self._cache[key] = summary
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return summary


CONTEXT_POLICIES: dict[str, type[ContextPolicy]] = {
    "full": FullHistory,
    "window": SlidingWindow,
    "latest": LatestObservation,
    "token_budget": TokenBudget,
    "summarize": Summarize,
}

# One valid spec per name, quoted in error messages so they say how to fix a config.
SPEC_EXAMPLES: dict[str, Any] = {
    "full": "full",
    "window": {"name": "window", "last_turns": 2},
    "latest": "latest",
    "token_budget": {"name": "token_budget", "max_tokens": 1024},
    "summarize": {"name": "summarize", "summarizer": "rule", "keep_last_turns": 1},
}


def _split_spec(kind: str, spec: Any, known: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """`"name"` or `{"name": ..., **kwargs}` -> (name, kwargs)."""
    if isinstance(spec, str):
        return spec, {}
    if isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
        kwargs = dict(spec)
        return kwargs.pop("name"), kwargs
    raise ValueError(
        f"{kind} spec {spec!r}: give a name ({', '.join(sorted(known))}) or a mapping with "
        f"'name' and its arguments, e.g. {json.dumps(SPEC_EXAMPLES['window'])}"
    )


def _construct(kind: str, cls: Callable[..., Any], kwargs: dict[str, Any], example: Any) -> Any:
    # Check the arguments against the signature first, so a TypeError raised inside a
    # constructor is not misreported as a config mistake.
    signature = inspect.signature(cls)
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        takes = ", ".join(
            p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
            for p in signature.parameters.values()
        )
        hint = f"; e.g. {json.dumps(example)}" if example is not None else ""
        raise ValueError(
            f"{kind}: bad arguments {kwargs!r} ({exc}); it takes: {takes or 'no arguments'}{hint}"
        ) from exc
    return cls(**kwargs)


def make_summarizer(spec: str | Mapping[str, Any] | Summarizer) -> Summarizer:
    """A summarizer from "rule", "policy", {"name": "rule", "max_chars": 300}, or a callable;
    a 'package.module:attribute' one must be marked `@plugin("summarizer")` (checked before it
    is called with the config's arguments)."""
    if callable(spec):
        return spec
    name, kwargs = _split_spec("summarizer", spec, SUMMARIZERS)
    cls = resolve("summarizer", name, SUMMARIZERS)
    return _construct(f"summarizer {name!r}", cls, kwargs, None)


def make_context_policy(spec: str | Mapping[str, Any] | ContextPolicy) -> ContextPolicy:
    """A context policy from a config value.

    `spec` is a name ("full", "window", "latest", "token_budget", "summarize", or
    'package.module:Class') or a mapping with "name" plus constructor arguments, e.g.
    {"name": "window", "last_turns": 2} or {"name": "summarize", "summarizer": "rule",
    "keep_last_turns": 1}. Raises ValueError with the known names and a valid example when the
    name or the arguments are wrong.
    """
    if isinstance(spec, ContextPolicy):
        return spec
    name, kwargs = _split_spec("context policy", spec, CONTEXT_POLICIES)
    cls = resolve_subclass("context policy", name, CONTEXT_POLICIES, ContextPolicy)
    if "summarizer" in kwargs:
        kwargs["summarizer"] = make_summarizer(kwargs["summarizer"])
    return _construct(f"context policy {name!r}", cls, kwargs, SPEC_EXAMPLES.get(name))
