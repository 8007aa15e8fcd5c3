"""The turn loop shared by the grid games (FrozenLake, Sokoban): one move per reply in VAGEN's
reply formats (`<answer>Move</answer>`, or the belief format with a stated observation and
prediction), the board shown as text (a symbol grid) or as an image, per-step rewards, the true
state before and after each move in the step's info (for the belief rewards), and the solver's
replies for the warm-up.
"""

from __future__ import annotations

import random
from abc import abstractmethod
from collections.abc import Hashable
from typing import Any, ClassVar, Literal, Protocol

from agent_core.core.records import Action, Message, Observation, StepResult, Task
from agent_core.envs.base import AgentEnv
from agent_core.prompting.context import ContextPolicy
from agent_core.text.belief import (
    NEXT_STATE_KEY,
    STATE_KEY,
    WEIGHTS_KEY,
    Relation,
    belief_reply,
    parse_answer_reply,
    parse_belief_reply,
    relations_text,
)

# VAGEN's action names; a move is one of them, any case
MOVES: dict[str, tuple[int, int]] = {
    "Left": (0, -1),
    "Down": (1, 0),
    "Right": (0, 1),
    "Up": (-1, 0),
}
ReplyFormat = Literal["answer", "belief"]
REPLY_FORMATS = ("answer", "belief")
FORMAT_RULES = {
    "answer": "Reply with one move in answer tags: <answer>...</answer>.",
    "belief": "First describe what you see, then your reasoning, then predict what you will see "
    "after your move, then give the move, in the format <think><observation>...</observation>"
    "<reasoning>...</reasoning><prediction>...</prediction></think><answer>...</answer>. In "
    "<observation> and <prediction> give, for {objects}, where it is relative to you: its row "
    "(above, below or same) and its column (left, right or same), e.g. '{example}'.",
}


class GridGame(Protocol):
    """One state of a grid game (immutable: a move returns the next state)."""

    @property
    def done(self) -> bool: ...

    @property
    def success(self) -> bool: ...

    def move(self, name: str) -> GridGame:
        """The state after the move `name` (a key of MOVES); the same state when it is blocked."""

    def relations(self) -> list[Relation]:
        """Every object seen from the player (what a belief reply should state)."""

    def text(self) -> str:
        """The board as a symbol grid, one line per row."""

    def cells(self) -> list[list[str]]:
        """The board as cell kinds (for drawing), row by row."""

    def solution(self) -> list[str]:
        """A shortest list of moves that wins from here ([] when done or lost)."""

    def key(self) -> Hashable:
        """What identifies this state within its task (the env's anchor key)."""


def went_nowhere(before: GridGame, after: GridGame) -> bool:
    """A move that changed nothing (into a wall, or a box that cannot move)."""
    return after.key() == before.key()


class GridGameEnv(AgentEnv):
    """A grid game played one move per reply; subclasses give the game (`game_of`) and its
    rules; the board is shown as text (`board_message`; the image versions draw it)."""

    rules: ClassVar[str]  # what the game is, before the legend
    legend: ClassVar[str]  # what the symbols (or, for images, the colours) mean
    belief_objects: ClassVar[str]  # the objects a belief names, for the format rules
    belief_weights: ClassVar[dict[str, float]]  # object kind -> weight in the belief rewards
    GOAL_REWARD: ClassVar[float] = 1.0
    INVALID_PENALTY: ClassVar[float] = -0.1  # a reply that is no move; costs a turn
    BLOCKED_PENALTY: ClassVar[float] = -0.05  # a move that changes nothing (into a wall)

    def __init__(
        self,
        max_steps: int = 8,
        reply_format: ReplyFormat = "answer",
        context: ContextPolicy | None = None,
        few_shot: bool = True,
    ) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if reply_format not in REPLY_FORMATS:
            raise ValueError(
                f"reply_format={reply_format!r}: choose one of {', '.join(REPLY_FORMATS)}"
            )
        super().__init__(max_steps=max_steps, context=context)
        self.reply_format = reply_format
        self.few_shot = few_shot
        self.game: GridGame | None = None
        self.turns = 0

    @classmethod
    @abstractmethod
    def game_of(cls, task: Task) -> GridGame:
        """The game's first state for `task` (from its meta)."""

    def reset(self, task: Task, rng: random.Random | None = None) -> Observation:
        self.game, self.turns = self.game_of(task), 0
        first = self.board_message("The board:", "Your move?")
        return self.start_history([{"role": "system", "content": self.system_prompt()}], [first])

    def system_prompt(self) -> str:
        example = relations_text(self.belief_example())
        rules = FORMAT_RULES[self.reply_format].format(objects=self.belief_objects, example=example)
        text = f"{self.rules}\n{self.legend}\nMoves: {', '.join(MOVES)}. {rules}"
        return text + (f"\nExample reply: {self.example_reply()}" if self.few_shot else "")

    def belief_example(self) -> list[Relation]:
        """Relations for the format rules' example (any plausible ones)."""
        kinds = list(self.belief_weights)
        return [Relation(kinds[0], "below", "right"), Relation(kinds[-1], "same", "left")]

    def example_reply(self) -> str:
        if self.reply_format == "answer":
            return "<answer>Down</answer>"
        example = relations_text(self.belief_example())
        return belief_reply(example, "I should go down.", example, "Down")

    def board_message(self, before: str, after: str) -> Message:
        """A user message showing the board between two lines of text (the image versions
        override this to show the board as an image)."""
        assert self.game is not None
        return {"role": "user", "content": f"{before}\n{self.game.text()}\n{after}"}

    def read_move(self, text: str) -> str | None:
        """The move a reply gives in this env's reply format, or None."""
        if self.reply_format == "belief":
            reply = parse_belief_reply(text)
            answer = reply.answer if reply.format_correct else None
        else:
            answer = parse_answer_reply(text)
        if answer is None:
            return None
        return {name.lower(): name for name in MOVES}.get(answer.strip().lower())

    def step(self, action: Action) -> StepResult:
        if self.game is None:
            raise RuntimeError(f"{type(self).__name__}.step before reset")
        self.turns += 1
        self.history.append({"role": "assistant", "content": action.text})
        before, move = self.game, self.read_move(action.text)
        if move is None:
            reward, note = self.INVALID_PENALTY, self.invalid_note()
        else:
            self.game = before.move(move)
            reward = self.reward_of(before, self.game)
            note = f"You moved {move}."
        info = self.step_info(before, move)
        done = self.game.done or self.turns >= self.max_steps
        if done:
            info["end"] = "goal" if self.game.success else "lost" if self.game.done else "max_steps"
            feedback = f"{note} {self.end_note()}"
            self.history.append({"role": "user", "content": feedback})
            return StepResult(None, reward, True, feedback, not self.game.done, info)
        # the board alone tells where the move led: naming the move would let a policy repeat
        # its last one, which the solver's games reward half the time, without reading the board
        stayed = move is not None and went_nowhere(before, self.game)
        shown = note if move is None else "That move went nowhere." if stayed else ""
        message = self.board_message(f"{shown} The board:".lstrip(), "Your move?")
        self.history.append(message)
        return StepResult(self.observe(), reward, False, feedback=note, info=info)

    def reward_of(self, before: GridGame, after: GridGame) -> float:
        if after.success:
            return self.GOAL_REWARD
        return self.BLOCKED_PENALTY if went_nowhere(before, after) else 0.0

    def invalid_note(self) -> str:
        return f"Invalid reply: no move found. {FORMAT_RULES['answer']} Moves: {', '.join(MOVES)}."

    def end_note(self) -> str:
        assert self.game is not None
        if self.game.success:
            return "You won!"
        return "You lost." if self.game.done else "Out of turns."

    def step_info(self, before: GridGame, move: str | None) -> dict[str, Any]:
        """success, the move, and the true state before and after it (belief rewards)."""
        assert self.game is not None
        return {
            "success": self.game.success,
            "valid_action": move is not None,
            "move": move,
            STATE_KEY: _triples(before.relations()),
            NEXT_STATE_KEY: _triples(self.game.relations()),
            WEIGHTS_KEY: dict(self.belief_weights),
        }

    def solve_step(self) -> str | None:
        """The first move of a shortest win, in this env's reply format (a belief reply states
        the true state now and after the move)."""
        if self.game is None or not self.game.solution():
            return None
        move = self.game.solution()[0]
        if self.reply_format == "answer":
            return f"<answer>{move}</answer>"
        now, after = self.game.relations(), self.game.move(move).relations()
        reasoning = f"A shortest way to win starts with {move}."
        return belief_reply(relations_text(now), reasoning, relations_text(after), move)

    def anchor_key(self) -> Hashable | None:
        return None if self.game is None else self.game.key()


def _triples(relations: list[Relation]) -> list[list[str]]:
    return [[r.object, r.vertical, r.horizontal] for r in relations]
