"""The `env` section: the environment, where its tasks come from (seed ranges or a task file),
what each observation holds (context policy, tool prompt, few-shot) and which tools it offers.
Names of envs, tools and context policies are checked against agent_core's registries at load."""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from configs.base import Section
from configs.image_search import ImageSearchToolOptions
from configs.python_tool import PythonToolOptions
from configs.search import SearchToolOptions
from configs.task_file import TaskFileSection

# a role's name (it names its adapter, its trajectories and its metrics); the shared policy's
# adapter is PEFT's "default"
ROLE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
SHARED_ADAPTER = "default"


def _finite_numbers(value: Any, where: str = "") -> None:
    """Refuse NaN/inf anywhere inside free-form (dict/list) config values."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where or 'the value'} is {value}: give a finite number")
    if isinstance(value, dict | list):
        for key, sub in value.items() if isinstance(value, dict) else enumerate(value):
            _finite_numbers(sub, f"{where}.{key}" if where else str(key))


class ToolOptionsSection(Section):
    """Settings of the built-in tools, by tool name."""

    python: PythonToolOptions = Field(
        default_factory=PythonToolOptions,
        description="The sandboxed `python` tool: isolation level and per-call limits.",
    )
    search: SearchToolOptions = Field(
        default_factory=SearchToolOptions,
        description="The BM25 `search` tool: its corpus file and how many passages it returns.",
    )
    image_search: ImageSearchToolOptions = Field(
        default_factory=ImageSearchToolOptions,
        description="The `image_search` tool: its image collection and how many captions it "
        "returns.",
    )


class EnvSection(Section):
    """The environment episodes run in, and where its task instances come from."""

    name: str = Field(
        "calculator",
        description="Environment name from agent_core.envs.ENVS, or 'package.module:Class'.",
    )
    max_steps: int = Field(3, ge=1, description="Maximum agent steps (turns) per episode.")
    agent: str | None = Field(
        None,
        description="Your own agent function 'package.module:function', called per episode as "
        "fn(task, client) with an OpenAI client of the policy under training (README: Train "
        "your own agent); each completion call is a step (at most max_steps). The env `name` "
        "then only supplies tasks and scores a returned answer.",
    )
    agent_timeout_s: float = Field(
        120.0, gt=0, description="An agent episode running longer ends with reward 0."
    )
    agent_max_failed_share: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="An iteration in which a larger share of the agent function's episodes "
        "failed (raised, timed out, had calls refused, or had no call answered) fails loudly "
        "instead of training on the rest; 1.0 = never.",
    )
    train_seed_start: int = Field(
        0, ge=0, description="First seed of the training task range [start, start + size)."
    )
    train_seed_count: int = Field(
        1_000_000, ge=1, description="Number of seeds in the training range."
    )
    eval_seed_start: int = Field(
        10_000_000,
        ge=0,
        description="First seed of the held-out range; must not overlap the training range.",
    )
    eval_seed_count: int = Field(1_000, ge=1, description="Number of held-out seeds.")
    few_shot: bool = Field(
        True,
        description="Put one worked example exchange (a tool call and its use) in the system "
        "prompt. Small models rarely open a tool call without it.",
    )
    context: str | dict[str, Any] = Field(
        "full",
        description="Context policy: what history enters each observation. 'full' (every "
        "message; prompts grow by appending tokens), {name: window, last_turns: N}, 'latest' "
        "(the newest observation alone, no earlier reply), "
        "{name: token_budget, max_tokens: N}, {name: summarize, summarizer: rule|policy, "
        "keep_last_turns: K}, or 'package.module:Class'.",
    )
    tool_prompt: Literal["hermes", "compact", "none"] = Field(
        "hermes",
        description="How tool schemas enter the system prompt: 'hermes' = JSON schemas in "
        "<tools></tools> (or the chat template's own tools support); 'compact' = one line per "
        "tool; 'none' = not at all (the env's prompt and examples show the tools).",
    )
    tools: list[str] = Field(
        default_factory=list,
        description="Extra tools for a tool-using env, by name from agent_core.tools.TOOLS "
        "(e.g. 'python', the sandboxed interpreter) or 'package.module:Class'.",
    )
    tool_options: ToolOptionsSection = Field(
        default_factory=ToolOptionsSection,
        description="Per-tool settings, by tool name (e.g. tool_options.python.isolation, "
        ".timeout_s, .memory_mb); used for the tools listed in `tools`.",
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra keyword arguments for the env's constructor (env-specific).",
    )
    task_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments for the env's make_task(seed, **task_options): the "
        "parameters of its task distribution (e.g. {size: 12} for numberline's line length). "
        "Checked against make_task's signature at load. A make_task parameter named split is "
        "steprl's own: it receives 'train' or 'eval' (held-out), never a task option.",
    )
    roles: dict[str, Literal["shared", "adapter"]] = Field(
        default_factory=dict,
        description="The policy each role of a team samples and trains (a team env's roles, or "
        "an agent function's model='policy:<role>'): 'shared' = the one policy all shared "
        "roles use; 'adapter' = a LoRA adapter of its own on the same base model (needs "
        "trainer.lora). Empty: every role shares the policy; when set, an episode naming a "
        "role not listed here is refused.",
    )
    tasks: TaskFileSection | None = Field(
        None,
        description="Take tasks from a data file (Parquet, JSONL, CSV) instead of the env's "
        "make_task(seed): {path, prompt, answer, id, train, held_out}; the seed ranges are "
        "then unused.",
    )

    @field_validator("kwargs", "task_options", "context")
    @classmethod
    def _finite_values(cls, value: Any) -> Any:
        _finite_numbers(value)
        return value

    @field_validator("roles")
    @classmethod
    def _role_names(cls, roles: dict[str, str]) -> dict[str, str]:
        for role in roles:
            if not ROLE_NAME.fullmatch(role) or role == SHARED_ADAPTER:
                raise ValueError(
                    f"env.roles: role name {role!r} is not allowed: use letters, digits, '_' "
                    f"and '-', starting with a letter, and not {SHARED_ADAPTER!r}"
                )
        return roles

    def adapter_roles(self) -> tuple[str, ...]:
        """The roles with an adapter of their own (sorted)."""
        return tuple(sorted(r for r, policy in self.roles.items() if policy == "adapter"))

    def adapter_of(self, role: str | None) -> str | None:
        """The adapter a row of `role` samples with: the role's own, or None (the shared
        policy); raises ValueError for a role env.roles does not list (when it lists any)."""
        if role is None or not self.roles:
            return None
        if role not in self.roles:
            raise ValueError(
                f"role {role!r} is not in env.roles ({', '.join(sorted(self.roles))}): add it "
                "(shared or adapter), or name a listed role"
            )
        return role if self.roles[role] == "adapter" else None

    @model_validator(mode="after")
    def _disjoint_seeds(self) -> EnvSection:
        train_end = self.train_seed_start + self.train_seed_count
        eval_end = self.eval_seed_start + self.eval_seed_count
        if self.train_seed_start < eval_end and self.eval_seed_start < train_end:
            raise ValueError(
                f"train seeds [{self.train_seed_start}, {train_end}) overlap eval seeds "
                f"[{self.eval_seed_start}, {eval_end}): move eval_seed_start to >= {train_end}"
            )
        return self
