"""The number-line game: walk from a start position to a visible goal in moves of 1 to 3 steps.

A small multi-step env with per-step rewards whose states (positions) repeat across episodes of
one task, so anchor-state grouping (GiGPO) finds step groups larger than one.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from agent_core.core.records import Action, Observation, StepResult, Task
from agent_core.envs.base import AgentEnv
from agent_core.prompting.context import ContextPolicy

RULES = (
    "You play a number-line game. You stand on a line of whole numbers from 0 to {size} and "
    "must reach the goal position. Each turn, move right or left by 1 to {max_move} steps; a "
    "move past either end stops at the end. Reach the goal in as few moves as possible.\n"
    "Reply with exactly one line in this format: Move: +<steps> to go right or "
    "Move: -<steps> to go left, where <steps> is a whole number from 1 to {max_move}."
)
EXAMPLE = "\nExample: for 'You are at 2. The goal is at 7.' reply: Move: +3"

# 'Move: +2', 'move:-1', 'MOVE : 3' ('+' may be omitted). Digits are ASCII only, so int() never
# sees other scripts' digits; the length check before int() keeps huge numbers cheap.
_MOVE_RE = re.compile(r"move\s*:\s*([+-]?)\s*([0-9]+)", re.IGNORECASE)
_MINUS_SIGNS = str.maketrans({"\u2212": "-", "\u2013": "-", "\u2014": "-"})
_MAX_DIGITS = 6


@dataclass(frozen=True)
class MoveError:
    """An action that is not exactly one valid move, and what to fix."""

    message: str


def parse_move(text: str, max_move: int) -> int | MoveError:
    """The signed step count of the single 'Move: ±k' in `text` (1 <= k <= max_move).

    Never raises. No move, several moves, or k outside 1..max_move is a `MoveError`: out-of-range
    steps are rejected rather than clamped, so the model learns the stated format.
    """
    matches = _MOVE_RE.findall(text.translate(_MINUS_SIGNS))
    if not matches:
        return MoveError("no move found")
    if len(matches) > 1:
        return MoveError(f"found {len(matches)} moves, give exactly one")
    sign, digits = matches[0]
    steps = int(digits) if len(digits) <= _MAX_DIGITS else None
    if steps is None or not 1 <= steps <= max_move:
        shown = digits if len(digits) <= 12 else digits[:12] + "..."
        return MoveError(f"steps must be 1 to {max_move}, got {shown}")
    return -steps if sign == "-" else steps


class NumberLineEnv(AgentEnv):
    """Reach the goal on the line 0..size; +1 on arrival, small penalties for wasted steps."""

    name = "numberline"

    GOAL_REWARD: ClassVar[float] = 1.0
    NO_PROGRESS_PENALTY: ClassVar[float] = -0.05  # a valid move that does not get closer
    INVALID_PENALTY: ClassVar[float] = -0.1  # unparsable or out-of-range action; costs a step
    MAX_MOVE: ClassVar[int] = 3
    MIN_DISTANCE: ClassVar[int] = 4  # start-goal distance: at least two moves per episode
    DEFAULT_SIZE: ClassVar[int] = 10

    def __init__(
        self,
        max_steps: int = 8,
        size: int = DEFAULT_SIZE,
        context: ContextPolicy | None = None,
        few_shot: bool = True,
    ) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if size < self.MIN_DISTANCE:
            raise ValueError(f"size must be >= {self.MIN_DISTANCE}, got {size}")
        super().__init__(max_steps=max_steps, context=context)
        self.size = size  # line length for tasks without meta['size'] (hand-written tasks)
        self.few_shot = few_shot
        self.steps = 0
        self.invalid_actions = 0
        self.line = size
        self.goal: int | None = None
        self.position: int | None = None

    @classmethod
    def make_task(cls, seed: int, size: int = DEFAULT_SIZE) -> Task:
        rng = random.Random(seed)
        goal = rng.randint(0, size)
        starts = [p for p in range(size + 1) if abs(p - goal) >= min(cls.MIN_DISTANCE, size)]
        start = starts[rng.randrange(len(starts))]
        return Task(
            task_id=f"numberline-{seed}",
            prompt=_state(start, goal),
            answer=goal,
            meta={"seed": seed, "start": start, "goal": goal, "size": size},
        )

    def reset(self, task: Task, rng: random.Random | None = None) -> Observation:
        # The task defines the game, so every episode of a group plays the same line.
        self.line = int(task.meta.get("size", self.size))
        self.goal, self.position = int(task.answer), int(task.meta["start"])
        if not (0 <= self.goal <= self.line and 0 <= self.position <= self.line):
            raise ValueError(f"task {task.task_id}: start and goal must lie in 0..{self.line}")
        self.steps = self.invalid_actions = 0
        system = RULES.format(size=self.line, max_move=self.MAX_MOVE)
        return self.start_history(
            [
                {"role": "system", "content": system + (EXAMPLE if self.few_shot else "")},
                {"role": "user", "content": task.prompt},
            ]
        )

    def step(self, action: Action) -> StepResult:
        if self.goal is None or self.position is None:
            raise RuntimeError("NumberLineEnv.step before reset")
        self.steps += 1
        self.history.append({"role": "assistant", "content": action.text})
        move = parse_move(action.text, self.MAX_MOVE)
        if isinstance(move, MoveError):
            self.invalid_actions += 1
            reward, feedback = self.INVALID_PENALTY, self._invalid_text(move)
        else:
            reward, feedback = self._apply(move)
        self.history.append({"role": "user", "content": feedback})
        success = self.position == self.goal
        info: dict[str, Any] = {
            "success": success,
            "position": self.position,
            "distance": abs(self.goal - self.position),
            "valid_action": not isinstance(move, MoveError),
            "invalid_actions": self.invalid_actions,
        }
        if success or self.steps >= self.max_steps:
            info["end"] = "goal" if success else "max_steps"
            return StepResult(
                None, reward, done=True, feedback=feedback, truncated=not success, info=info
            )
        return StepResult(self.observe(), reward, done=False, feedback=feedback, info=info)

    def _apply(self, move: int) -> tuple[float, str]:
        """Move (stopping at the line's ends); the reward and the feedback text."""
        assert self.goal is not None and self.position is not None
        before = abs(self.goal - self.position)
        self.position = min(max(self.position + move, 0), self.line)
        after = abs(self.goal - self.position)
        if after == 0:
            return self.GOAL_REWARD, f"Move {move:+d}: you reached the goal at {self.goal}!"
        note = "" if after < before else " That did not bring you closer."
        return (
            0.0 if after < before else self.NO_PROGRESS_PENALTY,
            f"Move {move:+d}.{note} {_state(self.position, self.goal)}",
        )

    def _invalid_text(self, error: MoveError) -> str:
        assert self.goal is not None and self.position is not None
        return (
            f"Invalid action: {error.message}. Reply with one line like 'Move: +2' or "
            f"'Move: -1' (1 to {self.MAX_MOVE} steps). {_state(self.position, self.goal)}"
        )

    def solve_step(self) -> str | None:
        """The greedy optimal move: as far as allowed towards the goal."""
        if self.goal is None or self.position is None:
            return None
        delta = max(-self.MAX_MOVE, min(self.MAX_MOVE, self.goal - self.position))
        return f"Move: {delta:+d}"

    def anchor_key(self) -> str | None:
        """The state the next action is taken from (goal included so keys never mix tasks)."""
        if self.position is None:
            return None
        return f"pos={self.position} goal={self.goal}"


def _state(position: int, goal: int) -> str:
    return f"You are at {position}. The goal is at {goal}."
