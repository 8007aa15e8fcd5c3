"""NumberLineEnv: deterministic tasks, per-step rewards, robust parsing, repeated anchor states."""

from __future__ import annotations

import pytest

from agent_core.core.records import Action, StepResult, Task
from agent_core.envs import ENVS, make_env
from agent_core.envs.numberline import MoveError, NumberLineEnv, parse_move
from agent_core.prompting.context import ContextServices, SlidingWindow

Env = NumberLineEnv


def _optimal(env: NumberLineEnv) -> str:
    assert env.goal is not None and env.position is not None
    gap = env.goal - env.position
    steps = min(abs(gap), Env.MAX_MOVE)
    return f"Move: {'+' if gap > 0 else '-'}{steps}"


def _task(start: int, goal: int, size: int = 10) -> Task:
    return Task(
        "t", f"You are at {start}. The goal is at {goal}.", goal, {"start": start, "size": size}
    )


def test_registered_and_built_by_name() -> None:
    assert ENVS["numberline"] is NumberLineEnv
    env = make_env("numberline", max_steps=5, few_shot=False, kwargs={})
    assert isinstance(env, NumberLineEnv) and env.max_steps == 5 and not env.few_shot


def test_tasks_are_deterministic_and_vary_with_seed() -> None:
    assert Env.make_task(11) == Env.make_task(11)
    tasks = [Env.make_task(s) for s in range(60)]
    assert len({t.task_id for t in tasks}) == 60
    assert len({(t.meta["start"], t.meta["goal"]) for t in tasks}) > 25
    for t in tasks:
        start, goal = t.meta["start"], t.meta["goal"]
        assert t.answer == goal and t.meta["size"] == 10
        assert 0 <= start <= 10 and 0 <= goal <= 10 and abs(start - goal) >= Env.MIN_DISTANCE
        assert t.prompt == f"You are at {start}. The goal is at {goal}."


def test_reset_observation_has_rules_format_and_example() -> None:
    task = Env.make_task(3)
    obs = Env().reset(task)
    system, user = obs.messages
    assert system["role"] == "system" and "Move: +<steps>" in system["content"]
    assert "Example:" in system["content"] and "0 to 10" in system["content"]
    assert user == {"role": "user", "content": task.prompt}
    assert obs.tools == [] and not obs.appended
    assert "Example:" not in Env(few_shot=False).reset(task).messages[0]["content"]


def test_optimal_policy_reaches_goal() -> None:
    for seed in range(20):
        env = Env()
        env.reset(Env.make_task(seed))
        results: list[StepResult] = []
        while not results or not results[-1].done:
            results.append(env.step(Action(_optimal(env))))
        final = results[-1]
        assert final.reward == Env.GOAL_REWARD and final.info["success"]
        assert not final.truncated and final.observation is None
        assert final.info["end"] == "goal" and "reached the goal" in final.feedback
        assert all(r.reward == 0.0 and not r.info["success"] for r in results[:-1])
        assert len(results) <= 4


def test_moves_that_do_not_get_closer_are_penalized() -> None:
    env = Env()
    env.reset(_task(start=2, goal=8))
    away = env.step(Action("Move: -1"))
    assert away.reward == Env.NO_PROGRESS_PENALTY and "did not bring you closer" in away.feedback
    assert away.info["position"] == 1 and away.info["valid_action"]
    closer = env.step(Action("Move: +3"))
    assert closer.reward == 0.0 and closer.info["position"] == 4
    overshoot = env.step(Action("Move: +3"))  # 4 -> 7 is closer; 7 -> 10 is not
    assert overshoot.reward == 0.0
    past = env.step(Action("Move: +3"))
    assert past.reward == Env.NO_PROGRESS_PENALTY and past.info["position"] == 10


def test_moves_stop_at_the_ends_of_the_line() -> None:
    env = Env()
    env.reset(_task(start=1, goal=6))
    result = env.step(Action("Move: -3"))
    assert result.info["position"] == 0 and result.reward == Env.NO_PROGRESS_PENALTY


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Move: +3", 3),
        ("move:-2", -2),
        ("  MOVE : 1\n", 1),
        ("I will go right.\nMove: +2", 2),
        ("Move: \u22121", -1),  # unicode minus sign
        ("Move: 02", 2),
    ],
)
def test_parse_valid_moves(text: str, expected: int) -> None:
    assert parse_move(text, 3) == expected


@pytest.mark.parametrize(
    "text",
    [
        "hello",
        "",
        "🙂 déplacer ⟶ +2",
        "Move: +0",
        "Move: +4",
        "Move: +999999999",
        "Move: -" + "9" * 5000,
        "Move: +\u0663",  # Arabic-Indic digit three
        "Move: +1 Move: +2",
        "Guess: 5",
    ],
)
def test_garbage_is_an_invalid_action_never_an_exception(text: str) -> None:
    assert isinstance(parse_move(text, 3), MoveError)
    env = Env()
    env.reset(_task(start=2, goal=8))
    result = env.step(Action(text))
    assert result.reward == Env.INVALID_PENALTY and not result.done
    assert result.info["position"] == 2 and not result.info["valid_action"]
    assert result.feedback.startswith("Invalid action:") and "You are at 2." in result.feedback
    assert len(result.feedback) < 300 and env.steps == 1 and env.invalid_actions == 1


def test_max_steps_truncates() -> None:
    env = Env(max_steps=3)
    env.reset(_task(start=0, goal=9))
    results = [env.step(Action(t)) for t in ["Move: +1", "nonsense", "Move: +1"]]
    assert [r.done for r in results] == [False, False, True]
    last = results[-1]
    assert last.truncated and not last.info["success"] and last.info["end"] == "max_steps"
    assert last.observation is None


def test_goal_on_last_allowed_step_is_success_not_truncation() -> None:
    env = Env(max_steps=2)
    env.reset(_task(start=0, goal=5))
    env.step(Action("Move: +3"))
    last = env.step(Action("Move: +2"))
    assert last.done and not last.truncated and last.info["success"] and last.reward == 1.0


def test_anchor_keys_repeat_for_the_same_state_across_episodes() -> None:
    task = Env.make_task(5)
    start, goal = task.meta["start"], task.meta["goal"]
    toward = "Move: +1" if goal > start else "Move: -1"
    keys = []
    for script in ([toward, "hello", toward], ["Move: 9", toward, toward]):
        env = Env()
        assert env.anchor_key() is None
        env.reset(task)
        episode = []
        for text in script:
            episode.append(env.anchor_key())  # the state this action is taken from
            env.step(Action(text))
        keys.append(episode)
    first = f"pos={start} goal={goal}"
    assert keys[0][0] == keys[1][0] == keys[1][1] == first
    assert keys[0][1] == keys[0][2] == keys[1][2] != first


def test_observations_append_with_full_history() -> None:
    env = Env()
    obs = env.reset(_task(start=2, goal=8))
    result = env.step(Action("Move: +3"))
    assert result.observation is not None and result.observation.appended
    assert result.observation.messages == [
        *obs.messages,
        {"role": "assistant", "content": "Move: +3"},
        {"role": "user", "content": "Move +3. You are at 5. The goal is at 8."},
    ]
    assert result.feedback == result.observation.messages[-1]["content"]
    again = env.step(Action("Move: +1"))
    assert again.observation is not None and again.observation.appended
    assert again.observation.messages[:4] == result.observation.messages


def test_context_policy_and_services_are_used() -> None:
    policy = SlidingWindow(1)
    env = Env(context=policy)
    services = ContextServices()
    env.bind_services(services)
    assert policy.services is services
    obs = env.reset(_task(start=0, goal=9))
    for text in ["Move: +1", "Move: +1", "Move: +1"]:
        result = env.step(Action(text))
    assert result.observation is not None and not result.observation.appended
    assert result.observation.messages == [
        *obs.messages,
        {"role": "assistant", "content": "Move: +1"},
        {"role": "user", "content": "Move +1. You are at 3. The goal is at 9."},
    ]


def test_step_before_reset_and_bad_construction() -> None:
    with pytest.raises(RuntimeError, match="before reset"):
        Env().step(Action("Move: +1"))
    with pytest.raises(ValueError, match="size"):
        Env(size=2)
    with pytest.raises(ValueError, match="max_steps"):
        Env(max_steps=0)
