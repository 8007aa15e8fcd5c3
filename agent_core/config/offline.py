"""An env played without a model: episodes of a reply function (the env's solver, a trivial
baseline of your own) on the tasks a config draws, built as a rollout builds the env, to
check an env before any training run (`agent_core.api.play_offline`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from agent_core.collect.iteration_tasks import train_tasks
from agent_core.core.records import Action, StepResult, Task
from agent_core.envs import AgentEnv, env_factory
from agent_core.envs.base import TaskSplit
from agent_core.prompting.context import ContextServices
from agent_core.run.evaluate import eval_tasks
from configs.env import EnvSection
from configs.run_config import RunConfig

#: a policy without a model: the next reply for the env's current state; `rng` is seeded
#: per episode, for baselines that pick at random
Reply = Callable[[AgentEnv, random.Random], str]

# What a context policy asks the model for while the env runs without one: a length estimate
# (4 characters a token) and an empty summary.
OFFLINE_SERVICES = ContextServices(
    count_tokens=lambda messages: sum(len(str(m.get("content", ""))) for m in messages) // 4,
    generate_text=lambda messages: "",
)


@dataclass(frozen=True)
class OfflineEpisode:
    """One episode played offline: its task and what each step returned."""

    task: Task
    results: list[StepResult]

    @property
    def success(self) -> bool:
        """The last step's `info["success"]` (missing = failure), as steprl counts it."""
        return bool(self.results and self.results[-1].info.get("success", False))


def offline_env(env: EnvSection) -> AgentEnv:
    """One env instance built from the config's env section as a rollout builds it
    (constructor keywords, context policy, extra tools), its context policy served offline."""
    built = env_factory(env)()
    built.bind_services(OFFLINE_SERVICES)
    return built


def solver(env: AgentEnv, rng: random.Random) -> str:
    """The env's own solver as a reply function (its `solve_step`)."""
    reply = env.solve_step()
    if reply is None:
        raise ValueError(f"env {type(env).__name__} has no solver: its solve_step returned None")
    return reply


def offline_tasks(config: RunConfig, split: TaskSplit = "eval") -> list[Task]:
    """The tasks a run draws: for 'eval' the `eval.episodes` held-out ones `steprl eval`
    scores, for 'train' those of the first iteration."""
    if split == "eval":
        return eval_tasks(config)
    return train_tasks(config, 1, config.rollout.tasks_per_iteration)


def play_offline(
    config: RunConfig, reply: Reply, split: TaskSplit = "eval", tasks: list[Task] | None = None
) -> list[OfflineEpisode]:
    """Play `reply` on each of `tasks` (default `offline_tasks(config, split)`), one fresh env
    per episode and episode i's env and reply seeded with i. An env that has not ended its
    episode after `env.max_steps` replies is a ValueError (steprl would wait for it)."""
    episodes = []
    for i, task in enumerate(tasks if tasks is not None else offline_tasks(config, split)):
        env, rng = offline_env(config.env), random.Random(i)
        env.start_episode(task, seed=i)
        results: list[StepResult] = []
        while not (results and results[-1].done):
            if len(results) == config.env.max_steps:
                raise ValueError(
                    f"env {config.env.name!r} did not end task {task.task_id!r} after "
                    f"env.max_steps={config.env.max_steps} replies: return done=True once "
                    "self.max_steps replies were played"
                )
            results.append(env.step(Action(text=reply(env, rng))))
        episodes.append(OfflineEpisode(task, results))
    return episodes


def success_rate(episodes: list[OfflineEpisode]) -> float:
    """The share of `episodes` that succeeded."""
    return sum(e.success for e in episodes) / len(episodes) if episodes else 0.0
