"""Environments by name (an explicit dict users may extend) and the factory used by the flows."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial
from typing import Any

from agent_core.core.records import Task
from agent_core.core.registry import resolve_subclass
from agent_core.envs.base import AgentEnv, TaskSplit, make_task_takes_split
from agent_core.envs.calculator import CalculatorEnv
from agent_core.envs.chain import ChainEnv
from agent_core.envs.code import CodeEnv
from agent_core.envs.debate import DebateEnv
from agent_core.envs.frozenlake import FrozenLakeEnv, FrozenLakeImageEnv
from agent_core.envs.numberline import NumberLineEnv
from agent_core.envs.qa import QAEnv
from agent_core.envs.search import SearchEnv
from agent_core.envs.sokoban import SokobanEnv, SokobanImageEnv
from agent_core.envs.solver_verifier import SolverVerifierEnv
from agent_core.envs.tool_env import ToolEnv
from agent_core.envs.visual_search import VisualSearchEnv
from agent_core.prompting.context import make_context_policy
from agent_core.tools import make_tool
from configs.env import EnvSection

ENVS: dict[str, type[AgentEnv]] = {
    CalculatorEnv.name: CalculatorEnv,
    ChainEnv.name: ChainEnv,
    CodeEnv.name: CodeEnv,
    DebateEnv.name: DebateEnv,
    FrozenLakeEnv.name: FrozenLakeEnv,
    FrozenLakeImageEnv.name: FrozenLakeImageEnv,
    NumberLineEnv.name: NumberLineEnv,
    QAEnv.name: QAEnv,
    SearchEnv.name: SearchEnv,
    SokobanEnv.name: SokobanEnv,
    SokobanImageEnv.name: SokobanImageEnv,
    SolverVerifierEnv.name: SolverVerifierEnv,
    VisualSearchEnv.name: VisualSearchEnv,
}
# Constructor keyword of an env that builds a tool itself -> the tool whose env.tool_options
# entry it receives (the code env's sandbox, the search env's corpus, visual_search's collection).
TOOL_SETTINGS = {"sandbox": "python", "search": "search", "image_search": "image_search"}


def env_class(name: str) -> type[AgentEnv]:
    """The env class for a configured name ('calculator' or 'package.module:Class')."""
    return resolve_subclass("env", name, ENVS, AgentEnv)


def constructor_arguments(
    cls: type[AgentEnv],
    max_steps: int,
    few_shot: bool,
    kwargs: dict[str, Any],
    tool_options: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """What `make_env` passes to the env's constructor besides `context`: max_steps, few_shot
    (when it takes one), its own tools' settings (when it builds them) and `env.kwargs`. A
    tool's settings come from `tool_options` alone (one route, the one a deployment run's
    limits check): env.kwargs naming them is a ValueError."""
    carried = sorted(set(kwargs) & set(TOOL_SETTINGS))
    if carried:
        tool = TOOL_SETTINGS[carried[0]]
        raise ValueError(
            f"{carried[0]!r} holds the {tool} tool's settings, which come from "
            f"env.tool_options.{tool} only (where a deployment run's limits apply), not "
            "env.kwargs: move them there"
        )
    accepted = inspect.signature(cls).parameters
    options = {"max_steps": max_steps, **kwargs}
    if "few_shot" in accepted:
        options.setdefault("few_shot", few_shot)
    for param, tool in TOOL_SETTINGS.items():  # an env's own tools take their tool's settings
        if param in accepted:
            options[param] = dict((tool_options or {}).get(tool, {}))
    return options


def make_env(
    name: str,
    max_steps: int,
    few_shot: bool,
    kwargs: dict[str, Any],
    context: str | dict[str, Any] = "full",
    tools: list[str] | None = None,
    tool_options: dict[str, dict[str, Any]] | None = None,
) -> AgentEnv:
    """Build one env instance from config values (a fresh context policy per episode, given
    to the constructor when it takes `context`, else set on the env; extra tools for
    tool-using envs, each built with its `tool_options` entry)."""
    cls = env_class(name)
    if context != "full" and not cls.takes_context:
        raise ValueError(f"env {name!r} takes no context policy; leave env.context at 'full'")
    options = constructor_arguments(cls, max_steps, few_shot, kwargs, tool_options)
    policy = make_context_policy(context)
    takes_it = "context" in inspect.signature(cls).parameters
    env = cls(**options, **({"context": policy} if takes_it else {}))
    if not takes_it:
        env.context = policy
    if tools:
        if not isinstance(env, ToolEnv):
            raise ValueError(f"env {name!r} does not use tools; leave env.tools empty")
        env.add_tools([make_tool(t, tool_options) for t in tools])
    return env


def env_factory(env: EnvSection) -> Callable[[], AgentEnv]:
    """A maker of env instances as the config's env section describes them (`make_env` with
    its name, limits, keywords, context policy, extra tools and tool options)."""
    return partial(
        make_env,
        env.name,
        env.max_steps,
        env.few_shot,
        env.kwargs,
        env.context,
        env.tools,
        env.tool_options.model_dump(),
    )


def make_tasks(
    name: str, seeds: list[int], task_options: dict[str, Any], split: TaskSplit
) -> list[Task]:
    """The env's task instances for `seeds`: `make_task(seed, **env.task_options)`, plus
    `split=split` when its make_task has a `split` parameter (an env without one is called as
    before)."""
    cls = env_class(name)
    options = {**task_options, "split": split} if make_task_takes_split(cls) else task_options
    return [cls.make_task(seed, **options) for seed in seeds]


__all__ = [
    "ENVS",
    "AgentEnv",
    "CalculatorEnv",
    "CodeEnv",
    "FrozenLakeEnv",
    "FrozenLakeImageEnv",
    "NumberLineEnv",
    "QAEnv",
    "SearchEnv",
    "SokobanEnv",
    "SokobanImageEnv",
    "TaskSplit",
    "ToolEnv",
    "VisualSearchEnv",
    "constructor_arguments",
    "env_class",
    "env_factory",
    "make_env",
    "make_tasks",
]
