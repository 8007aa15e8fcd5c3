"""The episode loop a config asks for: the env loop over the rollout engine (the configured env,
context and sampling; for training episodes with `rollout.tree` on, the branching one), or the
user's agent function behind the policy server when `env.agent` is set.
"""

from __future__ import annotations

from collections.abc import Callable

from agent_core.core.images import ImageSink
from agent_core.envs import env_class, env_factory
from agent_core.prompting.renderer import PromptRenderer
from agent_core.rollout import build
from agent_core.rollout.engine import SamplingParams
from agent_core.rollout.loop import AgentEnvLoop
from agent_core.rollout.tree import TreeEnvLoop
from agent_core.serving.agent_loop import AgentFunctionLoop, agent_function_loop
from configs.run_config import RunConfig


def make_loop(
    cfg: RunConfig,
    engine: build.Engine | None,
    seed: int,
    temperature: float | None = None,
    tokenizer=None,
    refresh: Callable[[], None] | None = None,
    processor=None,
    images: ImageSink | None = None,
) -> AgentEnvLoop | AgentFunctionLoop:
    """An episode loop over `engine` for the configured env, context and sampling (with no
    engine, only solver demonstrations can run; give the `tokenizer`, and a VLM's
    `processor`, then), or over the user's agent function when `env.agent` is set. `refresh`
    (partial rollouts) is called before each turn of the env loop; an agent function's
    episodes keep one policy. `images` keeps the images prompts show (default: in memory)."""
    env = cfg.env
    sampling = SamplingParams(
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature if temperature is None else temperature,
        top_p=cfg.rollout.top_p,
        stop_strings=env_class(env.name).stop_strings,
        seed=seed,
    )
    factory = env_factory(env)
    if env.agent is not None and engine is not None:
        return agent_function_loop(cfg, engine, factory, sampling, images)
    if engine is not None:
        tokenizer, processor = engine.tokenizer, getattr(engine, "processor", None)
    flow = PromptRenderer(tokenizer, env.tool_prompt, processor)
    return AgentEnvLoop(
        engine,
        flow,
        factory,
        sampling,
        cfg.rollout.max_prompt_tokens,
        refresh,
        images,
        adapter_of=cfg.env.adapter_of if env.roles else None,  # a team's: each role's adapter
    )


def make_collector(
    cfg: RunConfig,
    engine: build.Engine,
    seed: int,
    refresh: Callable[[], None] | None = None,
    images: ImageSink | None = None,
) -> AgentEnvLoop | AgentFunctionLoop:
    """The loop that collects an iteration's training episodes: `make_loop`'s, or with
    `rollout.tree` on the branching one over the same env, context and sampling; `images`
    keeps the images their prompts show (the run's image store)."""
    loop = make_loop(cfg, engine, seed, refresh=refresh, images=images)
    if cfg.rollout.tree.mode == "off" or not isinstance(loop, AgentEnvLoop):
        return loop
    tree = TreeEnvLoop(
        loop.engine,
        loop.flow,
        loop.make_env,
        loop.sampling,
        loop.max_prompt_tokens,
        cfg.rollout.tree,
        refresh=refresh,
    )
    tree.images = loop.images
    return tree
