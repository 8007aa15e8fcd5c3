"""Context policies: window, token budget and summaries keep the prefix and cut whole turns."""

from __future__ import annotations

import pytest

from agent_core.core.records import Action, Message
from agent_core.envs.calculator import CalculatorEnv
from agent_core.prompting.context import (
    CONTEXT_POLICIES,
    SUMMARIZERS,
    SUMMARY_PREFIX,
    ContextServices,
    FullHistory,
    LatestObservation,
    PolicySummarizer,
    RuleSummarizer,
    SlidingWindow,
    Summarize,
    TokenBudget,
    make_context_policy,
    split_turns,
)


def _call(expr: str) -> str:
    return (
        f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expr}"}}}}</tool_call>'
    )


PREFIX: list[Message] = [
    {"role": "system", "content": "You solve problems."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "Answer: 4"},
    {"role": "user", "content": "Add 10 and 20, then double, then add 1, then halve."},
]
TURNS: list[list[Message]] = [
    [{"role": "assistant", "content": _call("10 + 20")}, {"role": "tool", "content": "30"}],
    [{"role": "assistant", "content": _call("30 * 2")}, {"role": "tool", "content": "60"}],
    [
        {"role": "assistant", "content": _call("60 + 1") + _call("61 / 2")},
        {"role": "tool", "content": "61"},
        {"role": "tool", "content": "30.5"},
    ],
    [{"role": "assistant", "content": "thinking"}, {"role": "user", "content": "Go on."}],
]
HISTORY = PREFIX + [m for turn in TURNS for m in turn]
N_PREFIX = len(PREFIX)


def _flat(turns: list[list[Message]]) -> list[Message]:
    return [m for turn in turns for m in turn]


def test_split_turns_groups_assistant_with_its_replies() -> None:
    assert split_turns(HISTORY[N_PREFIX:]) == TURNS
    assert split_turns([{"role": "tool", "content": "x"}]) == [[{"role": "tool", "content": "x"}]]


def test_full_history_is_append_only() -> None:
    policy = FullHistory()
    assert policy.append_only and policy.select(HISTORY, N_PREFIX) == HISTORY


@pytest.mark.parametrize("last", [1, 2, 3, 4, 9])
def test_window_keeps_prefix_and_last_whole_turns(last: int) -> None:
    policy = SlidingWindow(last)
    assert not policy.append_only
    assert policy.select(HISTORY, N_PREFIX) == PREFIX + _flat(TURNS[-last:])


def test_window_never_orphans_a_tool_message() -> None:
    out = SlidingWindow(2).select(HISTORY, N_PREFIX)[N_PREFIX:]
    assert out[0]["role"] == "assistant"
    assert SlidingWindow(1).select(PREFIX, N_PREFIX) == PREFIX


def _chars4(messages: list[Message]) -> int:
    return sum(len(m["content"]) for m in messages) // 4


def test_latest_keeps_prefix_and_the_newest_observation_without_any_reply() -> None:
    policy = make_context_policy("latest")
    assert isinstance(policy, LatestObservation)
    assert policy.select(HISTORY, N_PREFIX) == [*PREFIX, {"role": "user", "content": "Go on."}]
    tool_turn = PREFIX + _flat(TURNS[:3])  # the newest observation: both tool results
    assert policy.select(tool_turn, N_PREFIX) == PREFIX + TURNS[2][1:]
    first = [{"role": "user", "content": "The board: ..."}]  # no reply yet: the first turn
    assert policy.select(PREFIX[:1] + first, 1) == PREFIX[:1] + first
    assert policy.select(PREFIX, N_PREFIX) == PREFIX


def test_token_budget_drops_oldest_whole_turns() -> None:
    policy = TokenBudget(max_tokens=10_000)
    policy.bind(ContextServices(count_tokens=_chars4))
    assert policy.select(HISTORY, N_PREFIX) == HISTORY
    for keep in range(1, len(TURNS) + 1):
        budget = _chars4(PREFIX + _flat(TURNS[-keep:]))
        policy.max_tokens = budget
        out = policy.select(HISTORY, N_PREFIX)
        assert out == PREFIX + _flat(TURNS[-keep:]) and _chars4(out) <= budget


def test_token_budget_keeps_last_turn_when_nothing_fits() -> None:
    policy = TokenBudget(max_tokens=1)
    policy.bind(ContextServices(count_tokens=_chars4))
    assert policy.select(HISTORY, N_PREFIX) == PREFIX + TURNS[-1]


def test_token_budget_without_counter_says_what_to_bind() -> None:
    with pytest.raises(RuntimeError, match="count_tokens"):
        TokenBudget(100).select(HISTORY, N_PREFIX)


def test_summarize_replaces_old_turns_and_caches() -> None:
    seen: list[list[Message]] = []

    def fake(messages: list[Message]) -> str:
        seen.append(messages)
        return f"{len(messages)} messages"

    policy = Summarize(fake, keep_last_turns=1)
    out = policy.select(HISTORY, N_PREFIX)
    summary = {"role": "user", "content": SUMMARY_PREFIX + "8 messages"}
    assert out == [*PREFIX, summary, *TURNS[-1]]
    assert seen == [[PREFIX[-1], *_flat(TURNS[:-1])]]  # the task, then the folded turns
    assert policy.select(list(HISTORY), N_PREFIX) == out and len(seen) == 1
    assert policy.select(HISTORY[:-2], N_PREFIX)[-3:] == TURNS[2] and len(seen) == 2
    assert Summarize(fake, keep_last_turns=4).select(HISTORY, N_PREFIX) == HISTORY


def test_policy_summarizer_uses_bound_generate_text() -> None:
    prompts: list[list[Message]] = []

    def generate(messages: list[Message]) -> str:
        prompts.append(messages)
        return "  Added 10 and 20, doubled.  "

    policy = Summarize(PolicySummarizer(), keep_last_turns=2)
    with pytest.raises(RuntimeError, match="generate_text"):
        policy.select(HISTORY, N_PREFIX)
    policy.bind(ContextServices(generate_text=generate))
    out = policy.select(HISTORY, N_PREFIX)
    assert out[N_PREFIX] == {
        "role": "user",
        "content": SUMMARY_PREFIX + "Added 10 and 20, doubled.",
    }
    assert out[N_PREFIX + 1 :] == _flat(TURNS[-2:])
    assert prompts[0][-1]["content"].startswith("Summarize the progress so far in <= 3 sentences")
    assert prompts[0][:-1] == [PREFIX[-1], *_flat(TURNS[:2])]
    policy.select(HISTORY, N_PREFIX)
    assert len(prompts) == 1


def test_rule_summarizer_is_deterministic_and_bounded() -> None:
    source = [PREFIX[-1], *_flat(TURNS[:3])]
    text = RuleSummarizer()(source)
    assert text == RuleSummarizer()(list(source))
    assert text.splitlines() == [
        'Step 1: calculator({"expression": "10 + 20"}) -> 30',
        'Step 2: calculator({"expression": "30 * 2"}) -> 60',
        'Step 3: calculator({"expression": "60 + 1"}); calculator({"expression": "61 / 2"}) '
        "-> 61 | 30.5",
    ]
    short = RuleSummarizer(max_chars=60)(source)
    assert short.startswith("(2 earlier steps omitted)\nStep 3:")
    assert len(RuleSummarizer(max_chars=20)(source)) <= 20 + len("(3 earlier steps omitted)\n")
    assert RuleSummarizer()([]) == "(no earlier steps)"


def test_factory_builds_each_policy() -> None:
    assert set(CONTEXT_POLICIES) == {"full", "window", "latest", "token_budget", "summarize"}
    assert set(SUMMARIZERS) == {"rule", "policy"}
    assert isinstance(make_context_policy("full"), FullHistory)
    assert make_context_policy("window").last_turns == 2
    assert make_context_policy({"name": "window", "last_turns": 3}).last_turns == 3
    budget = make_context_policy({"name": "token_budget", "max_tokens": 512})
    assert isinstance(budget, TokenBudget) and budget.max_tokens == 512
    summ = make_context_policy({"name": "summarize", "summarizer": "rule", "keep_last_turns": 2})
    assert isinstance(summ, Summarize) and isinstance(summ.summarizer, RuleSummarizer)
    assert summ.keep_last_turns == 2
    pol = make_context_policy({"name": "summarize", "summarizer": {"name": "policy"}})
    assert isinstance(pol, Summarize) and isinstance(pol.summarizer, PolicySummarizer)
    assert isinstance(make_context_policy("summarize").summarizer, RuleSummarizer)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("windw", "choose one of full, latest, summarize, token_budget, window"),
        ({"last_turns": 2}, "'name'"),
        (3, "give a name"),
        ({"name": "window", "turns": 2}, "takes: last_turns=2;"),
        ("token_budget", "max_tokens.*e.g."),
        ({"name": "window", "last_turns": 0}, "last_turns must be an integer >= 1"),
        ({"name": "window", "last_turns": "2"}, "last_turns must be an integer"),
        ({"name": "summarize", "summarizer": "llm"}, "unknown summarizer 'llm'"),
        ({"name": "summarize", "summarizer": {"name": "rule", "chars": 3}}, "max_chars"),
        ("agent_core.core.records:Task", "not a ContextPolicy"),
    ],
)
def test_factory_errors_say_how_to_fix(spec: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_context_policy(spec)  # type: ignore[arg-type]


def test_tool_env_with_sliding_window_shows_only_last_turn() -> None:
    env = CalculatorEnv(max_steps=5, context=SlidingWindow(1))
    env.bind_services(ContextServices())
    obs = env.reset(CalculatorEnv.make_task(3))
    prefix = list(obs.messages)
    for expr in ["1 + 1", "2 * 3", "7 - 4"]:
        result = env.step(Action(text=_call(expr)))
        assert not result.done and result.observation is not None
        obs = result.observation
    assert obs.messages == [
        *prefix,
        {"role": "assistant", "content": _call("7 - 4")},
        {"role": "tool", "content": "3"},
    ]
    assert not obs.appended
    assert len(env.history) == len(prefix) + 6


def test_tool_env_forwards_services_to_its_policy() -> None:
    policy = TokenBudget(max_tokens=50)
    env = CalculatorEnv(context=policy)
    services = ContextServices(count_tokens=_chars4)
    env.bind_services(services)
    assert policy.services is services
    assert env.reset(CalculatorEnv.make_task(1)).messages
