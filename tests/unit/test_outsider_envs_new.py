"""Three more envs written from the README alone (tests/outsider): a code-guessing game that
needs the env's hints, a two-tool shop task (per-task prices from `lookup`, the built-in
`calculator`) and a maze walk where a failure takes more steps than a success. Each one's
solver wins every held-out episode, its trivial baselines are measured on the same held-out
seeds (printed; the README quotes them), it loads by `module:Class` and keeps the env contract,
and the warm-up plays its solver."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from agent_core.config.load import load_config
from agent_core.config.presets import ConfigError
from agent_core.core.records import Action
from agent_core.envs import AgentEnv, make_env
from tests.outsider import code_guess_env, corridor_env, lookup_compute_env

ENVS = {
    "code_guess": ("tests.outsider.code_guess_env:CodeGuessEnv", 6),
    "lookup_compute": ("tests.outsider.lookup_compute_env:LookupComputeEnv", 4),
    "corridor": ("tests.outsider.corridor_env:CorridorEnv", 12),
}
BASELINES: dict[str, dict[str, Callable]] = {
    "code_guess": {
        "random valid guess": code_guess_env.random_guess,
        "constant guess": code_guess_env.constant_guess,
    },
    "lookup_compute": {
        "constant answer": lookup_compute_env.constant_answer,
        "answer without lookup": lookup_compute_env.answer_without_lookup,
    },
    "corridor": {
        "random valid move": corridor_env.random_move,
        "constant move": corridor_env.constant_move,
    },
}
EPISODES = 48  # held-out episodes, as the README's greedy evaluations of outsider envs


OPTIONS = {  # each env's make_task options, as env.task_options
    "code_guess": "{length: 4, top: 6}",
    "lookup_compute": "{items: 1}",
    "corridor": "{width: 5, height: 4, shortest: [5, 7]}",
}


def _config(env: str, *overrides: str):
    name, max_steps = ENVS[env]
    return load_config("smoke", [f"env.name={name}", f"env.max_steps={max_steps}", *overrides])


def held_out(env: str) -> list:
    """The first EPISODES held-out tasks, from the seeds `steprl eval` uses."""
    cfg = _config(env)
    cls = type(_env(env))
    return [cls.make_task(cfg.env.eval_seed_start + i) for i in range(EPISODES)]


def _env(env: str, context="full") -> AgentEnv:
    name, max_steps = ENVS[env]
    return make_env(name, max_steps, True, {}, context)


def solver(env: AgentEnv, rng: random.Random) -> str:
    return env.solve_step()


def play(env_name: str, policy: Callable, task, seed: int) -> list:
    """One episode of `policy(env, rng)`; the StepResults."""
    env, rng = _env(env_name), random.Random(seed)
    obs, results = env.start_episode(task, seed), []
    while True:
        result = env.step(Action(text=policy(env, rng)))
        results.append(result)
        assert (result.observation is None) == result.done
        if result.done:
            assert isinstance(result.info.get("success"), bool)
            return results
        obs = result.observation
        assert obs.messages


def success_rate(env_name: str, policy: Callable) -> tuple[float, list[list]]:
    episodes = [play(env_name, policy, task, seed=i) for i, task in enumerate(held_out(env_name))]
    return sum(e[-1].info["success"] for e in episodes) / len(episodes), episodes


@pytest.mark.parametrize("env", list(ENVS))
def test_env_loads_by_module_name_and_keeps_the_contract(env: str) -> None:
    cfg = _config(env, "env.context={name: window, last_turns: 1}")
    assert cfg.env.name == ENVS[env][0]
    assert _config(env, f"env.task_options={OPTIONS[env]}").env.task_options
    with pytest.raises(ConfigError, match=r"env\.task_options:.*takes no option 'colour'"):
        _config(env, "env.task_options={colour: red}")
    cls = type(_env(env))
    first = [cls.make_task(s) for s in range(20)]
    assert [t.task_id for t in first] == [t.task_id for t in (cls.make_task(s) for s in range(20))]
    assert len({t.task_id for t in first}) == 20  # unique per seed
    assert {t.task_id for t in held_out(env)}.isdisjoint(t.task_id for t in first)
    # the same episode seed replays the same episode
    assert [r.feedback for r in play(env, solver, first[0], 1)] == [
        r.feedback for r in play(env, solver, first[0], 1)
    ]
    # a window context works with no wiring: the prompt keeps its prefix and the last turn
    windowed = _env(env, {"name": "window", "last_turns": 1})
    obs = windowed.start_episode(first[3], seed=0)
    prefix = len(obs.messages)
    for _ in range(2):
        result = windowed.step(Action(text="no idea"))
        if result.done:
            break
        obs = result.observation
        assert len(obs.messages) <= prefix + 3  # reply + (tool or user) replies of one turn
    assert isinstance(windowed.solve_step(), str)


@pytest.mark.parametrize("env", list(ENVS))
def test_solver_wins_every_held_out_episode(env: str) -> None:
    rate, episodes = success_rate(env, solver)
    assert rate == 1.0
    print(f"{env}: solver {rate:.3f}, steps {min(map(len, episodes))}-{max(map(len, episodes))}")


@pytest.mark.parametrize("env", list(ENVS))
def test_trivial_baselines_on_the_same_held_out_seeds(env: str) -> None:
    """Measured and printed (`pytest -s`); each is far below the solver's 1.0."""
    for label, policy in BASELINES[env].items():
        rate, _ = success_rate(env, policy)
        print(f"{env}: {label} {rate:.3f} on {EPISODES} held-out episodes")
        assert rate <= 0.35, (label, rate)


def test_code_guess_needs_the_hints() -> None:
    """The hints are what the solver plays on: the first guess is the same for all codes, and
    a player ignoring the hints (random valid guesses) wins far less often than one using them."""
    task = code_guess_env.CodeGuessEnv.make_task(5)
    env = _env("code_guess")
    env.start_episode(task, seed=0)
    assert env.solve_step() == "Guess: 123"
    result = env.step(Action(text="Guess: 123"))
    said = code_guess_env.hints("123", task.answer)
    assert result.feedback.startswith("123: 1 " + said[0] + ", 2 " + said[1] + ", 3 " + said[2])
    assert env.solve_step() != "Guess: 123"  # the next guess follows from the hint
    assert env.step(Action(text="Guess: 112")).info["valid_guess"] is False
    solved, _ = success_rate("code_guess", solver)
    blind, _ = success_rate("code_guess", code_guess_env.random_guess)
    assert blind < solved - 0.5


def test_lookup_serves_each_tasks_own_prices_and_the_calculator_is_built_in() -> None:
    env = _env("lookup_compute")
    tasks = [lookup_compute_env.LookupComputeEnv.make_task(s) for s in (1, 2)]
    seen = []
    for task in tasks:
        env.start_episode(task, seed=0)
        item = next(iter(task.meta["bought"]))
        result = env.step(Action(text=lookup_compute_env._call("lookup", item=item + "s")))
        assert result.feedback == str(task.meta["prices"][item])
        seen.append(task.meta["prices"])
    assert seen[0] != seen[1]  # per-task data: another task, another shop
    result = env.step(Action(text=lookup_compute_env._call("calculator", expression="6 * 7")))
    assert result.feedback == "42" and result.info["tool_calls_ok"] == 2
    result = env.step(Action(text=lookup_compute_env._call("lookup", item="car")))
    assert "unknown item" in result.feedback and result.info["tool_calls_failed"] == 1
    # the solver's episode: lookups, one calculator call, the answer
    steps = play("lookup_compute", solver, tasks[0], 0)
    assert len(steps) == 4 and steps[-1].info["end"] == "answer" and steps[-1].info["success"]


def test_corridor_failures_take_more_steps_than_successes() -> None:
    _, solved = success_rate("corridor", solver)
    _, walked = success_rate("corridor", corridor_env.random_move)
    assert all(4 <= len(e) <= 6 for e in solved)
    failures = [e for e in walked if not e[-1].info["success"]]
    assert failures and all(len(e) == 12 and e[-1].truncated for e in failures)
    assert all(not e[-1].truncated for e in solved)


@pytest.mark.parametrize("env", list(ENVS))
def test_warmup_demonstrations_come_from_the_solver(env: str, tiny_tokenizer) -> None:
    from agent_core.run.warmup import solver_rows

    cfg = _config(env, "warmup.tasks=8")
    rows, episodes, success = solver_rows(cfg, tiny_tokenizer)
    assert episodes == 8 and success == 1.0
    assert len(rows) > episodes  # every step of every episode (some take more than one)
