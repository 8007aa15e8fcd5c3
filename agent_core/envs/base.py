"""The environment contract: `AgentEnv.reset(task[, rng]) -> Observation`, `step(action) ->
StepResult`, and the message history that the configured context policy selects from; a
message may show images (content parts, see `AgentEnv`).

An env also knows its task distribution (`make_task(seed, **task_options)`, told the split
when it takes one) and may expose `anchor_key()`, a hashable summary of its current state for
step-level grouping (GiGPO), stored as the text `anchor_text` makes of it, and `snapshot()` /
`restore()` (or `branch_by`) for tree rollouts' branches.
"""

from __future__ import annotations

import inspect
import json
import random
from abc import ABC, abstractmethod
from collections.abc import Hashable
from functools import cache
from typing import Any, ClassVar, Literal

from agent_core.core.records import Action, Message, Observation, Step, StepResult, Task
from agent_core.prompting.context import ContextPolicy, ContextServices, FullHistory

#: which tasks `make_task` makes: training (and warm-up) tasks, or held-out evaluation ones
TaskSplit = Literal["train", "eval"]


class AgentEnv(ABC):
    """One episode at a time; create one instance per concurrent episode.

    An env that keeps its messages in `history` (`start_history` in reset, appends in step,
    `observe()` for each observation) gets every context policy of `env.context` for free.

    Images: a message may show images. Its `content` is then a list of parts in order,
    `{"type": "text", "text": ...}` and `{"type": "image", "image": img}` (`img` a PIL image
    or a uint8 numpy array (H, W), (H, W, 3) or (H, W, 4); `agent_core.api.image_part`
    checks one where it is made). The image enters the prompt where its part sits, through
    the model's own processor and chat template (its placeholder tokens expanded as the
    processor does), so the policy must be an image-text-to-text model folder. Each step
    row stores the prompt ids with the image tokens and the sha256 of each image; the run's
    image store keeps each image once. An image lives in the message that shows it: a
    window of turns drops it with its turn, a token budget counts its tokens.
    """

    name: ClassVar[str]
    #: text that ends a reply early (the env acts on what came before it)
    stop_strings: ClassVar[tuple[str, ...]] = ()
    #: reward terms (name, weight) used when the config leaves `reward.terms` unset
    reward_terms: ClassVar[tuple[tuple[str, float], ...]] = ()
    #: False for an env that builds its observations itself instead of with `observe`: a
    #: context policy other than 'full' is then refused at config load
    takes_context: ClassVar[bool] = True
    #: how a tree rollout (rollout.tree) continues an episode on a branch: "replay" = a fresh
    #: env of the same task and seed is given the episode's replies again and must reach the
    #: same observation (else the rollout stops, naming the step); "copy" = copy.deepcopy of
    #: the env, for an env whose deep copy is an independent env (no process, file or socket
    #: of its own). An env that overrides `snapshot` and `restore` is copied with them instead.
    branch_by: ClassVar[Literal["replay", "copy"]] = "replay"

    def __init__(self, max_steps: int = 3, context: ContextPolicy | None = None) -> None:
        self.max_steps = max_steps
        self.context: ContextPolicy = context or FullHistory()
        self.history: list[Message] = []
        self.n_prefix = 0  # leading messages every context policy keeps

    @classmethod
    @abstractmethod
    def make_task(cls, seed: int) -> Task:
        """The task instance for `seed` (deterministic: same seed, same task). Keyword
        parameters after `seed` receive `env.task_options` from the config; a parameter named
        `split`, when there is one, receives 'train' (training and warm-up tasks) or 'eval'
        (held-out evaluation), so held-out content can be kept apart by split, not seed."""

    @abstractmethod
    def reset(self, task: Task, rng: random.Random | None = None) -> Observation:
        """Start an episode on `task` and return the first observation. `rng` is seeded per
        episode by the rollout loop (same run seed, same episode): draw the episode's
        randomness from it. A `reset(self, task)` without it is called without it."""

    @abstractmethod
    def step(self, action: Action) -> StepResult:
        """Apply the policy's action and return feedback, reward and whether the episode ended."""

    def start_episode(self, task: Task, seed: int) -> Observation:
        """What the rollout loop calls: `reset(task, rng=random.Random(seed))`, or
        `reset(task)` when this env's reset takes no `rng`."""
        if _reset_takes_rng(type(self)):
            return self.reset(task, rng=random.Random(seed))
        return self.reset(task)

    def start_history(
        self, messages: list[Message], first_turn: list[Message] | None = None
    ) -> Observation:
        """Begin the episode's history and return the first observation. `messages` (system
        prompt, examples, task) stay in every prompt under every context policy; `first_turn`
        (what only the first turn needs, e.g. the first view of a board each step redraws)
        follows them as the oldest turn, which a window or token budget drops once later
        turns take its place."""
        self.history = [*messages, *(first_turn or [])]
        self.n_prefix = len(messages)
        return self.observe(appended=False)

    def observe(self, appended: bool = True) -> Observation:
        """The next observation: what the context policy selects from `history`. `appended`
        says the history grew by the model's reply and new messages since the last one."""
        messages = self.context.select(self.history, self.n_prefix)
        return Observation(messages, [], appended=appended and self.context.append_only)

    def bind_services(self, services: ContextServices) -> None:
        """Receive model-backed helpers (token counter, text generator) for the context policy."""
        context = getattr(self, "context", None)  # None: an __init__ that skipped AgentEnv's
        if context is not None:
            context.bind(services)

    def solve_step(self) -> str | None:
        """The env's own solver: a correct next reply for the current state (for warm-up
        demonstrations), or None when the env has no solver."""
        return None

    def image_caption(self) -> str | None:
        """What the newest image this env showed holds, as text (a grid game's board in the
        symbols of its text twin), or None when the env has no such text (the default). The
        warm-up's alignment stage (`warmup.align_tasks`) teaches a VLM's projector to read
        the env's images by writing these captions for them."""
        return None

    @classmethod
    def keep_demonstration(cls, trajectory: list[Step]) -> bool:
        """Whether a solver episode becomes a warm-up demonstration: by default only a
        successful one (`info["success"]` on its last step). An env whose success is partly
        luck (a stochastic payout) keeps every solver episode by returning True."""
        return trajectory[-1].success

    def snapshot(self) -> Any:
        """The env's whole state now, for a tree rollout's branches: `restore(state)` on a new
        instance (built like this one, its context services bound, never reset) must make it
        continue exactly as this env would. Override both or neither; restore may be called
        with one snapshot several times, and neither may change the snapshot."""
        raise NotImplementedError

    def restore(self, state: Any) -> None:
        """Take the state a `snapshot` returned (see there)."""
        raise NotImplementedError

    def anchor_key(self) -> Hashable | None:
        """A key of the current env state (same key = same state), or None: a str, an int,
        float or bool, or a tuple or frozenset of those (nested as deep as you like). steprl
        stores it as text (`anchor_text`)."""
        return None


@cache
def _reset_takes_rng(cls: type[AgentEnv]) -> bool:
    return "rng" in inspect.signature(cls.reset).parameters


@cache
def make_task_takes_split(cls: type[AgentEnv]) -> bool:
    """Whether the env's `make_task` has a `split` keyword (then steprl passes it)."""
    param = inspect.signature(cls.make_task).parameters.get("split")
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return param is not None and param.kind in named


ANCHOR_FIX = (
    "return a str, an int, float or bool, or a tuple or frozenset of those (e.g. "
    "(row, col)), or None"
)


def anchor_text(key: Hashable | None) -> str | None:
    """The text the replay stores for an env's `anchor_key()`: a str as it is, None as None,
    anything else the docs allow (an int, float or bool; a tuple or frozenset of those,
    nested) as one canonical text, the same for equal keys in every process (a frozenset's
    items sorted, so neither hash seeds nor insertion order matter). Raises TypeError naming
    `anchor_key` and the fix for any other value."""
    if key is None or isinstance(key, str):
        return key
    try:
        return _canonical(key)
    except TypeError as exc:
        raise TypeError(f"anchor_key() returned {key!r}, {exc}: {ANCHOR_FIX}") from None


def _canonical(key: object) -> str:
    if isinstance(key, str):
        return json.dumps(key, ensure_ascii=False)
    if isinstance(key, bool | int | float):
        return repr(key)
    if isinstance(key, tuple):
        return (
            "(" + ", ".join(_canonical(item) for item in key) + ("," if len(key) == 1 else "") + ")"
        )
    if isinstance(key, frozenset):
        return "frozenset{" + ", ".join(sorted(_canonical(item) for item in key)) + "}"
    raise TypeError(f"which is or holds a {type(key).__name__} ({key!r})")
