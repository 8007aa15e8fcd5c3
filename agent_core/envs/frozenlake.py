"""FrozenLake (as VAGEN plays it): walk a frozen lake to the goal without falling into a hole,
one move per reply. Random maps with a path from start to goal; the board shown as VAGEN's
symbol grid (frozenlake) or drawn as an image (frozenlake_image), same maps and dynamics.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

from agent_core.core.images import image_part, text_part
from agent_core.core.records import Message, Task
from agent_core.envs.grid_game import MOVES, GridGameEnv, ReplyFormat
from agent_core.envs.grid_images import CellLook, draw_board
from agent_core.prompting.context import ContextPolicy
from agent_core.text.belief import Relation, relation_of

Cell = tuple[int, int]


@dataclass(frozen=True)
class Lake:
    """A lake map (rows of 'F' frozen, 'H' hole, 'G' goal; the start is frozen) and the
    player's cell."""

    rows: tuple[str, ...]
    player: Cell

    @property
    def size(self) -> int:
        return len(self.rows)

    def at(self, cell: Cell) -> str:
        return self.rows[cell[0]][cell[1]]

    @property
    def done(self) -> bool:
        return self.at(self.player) in "HG"

    @property
    def success(self) -> bool:
        return self.at(self.player) == "G"

    def move(self, name: str) -> Lake:
        if self.done:
            return self
        d_row, d_col = MOVES[name]
        row, col = self.player[0] + d_row, self.player[1] + d_col
        if not (0 <= row < self.size and 0 <= col < self.size):
            return self  # the lake's edge stops the move
        return Lake(self.rows, (row, col))

    def cells_of(self, kind: str) -> list[Cell]:
        return [(r, c) for r, line in enumerate(self.rows) for c, x in enumerate(line) if x == kind]

    def relations(self) -> list[Relation]:
        goal = [relation_of("target", self.player, cell) for cell in self.cells_of("G")]
        return goal + [relation_of("hole", self.player, cell) for cell in self.cells_of("H")]

    def cells(self) -> list[list[str]]:
        kinds = {"F": "frozen", "H": "hole", "G": "goal"}
        grid = [[kinds[x] for x in line] for line in self.rows]
        row, col = self.player
        grid[row][col] = {"H": "player_in_hole", "G": "player_on_goal"}.get(
            self.at(self.player), "player"
        )
        return grid

    def text(self) -> str:
        """VAGEN's symbols: _ frozen, O hole, G goal, P player, X fell in a hole, √ on goal."""
        symbols = {
            "frozen": "_",
            "hole": "O",
            "goal": "G",
            "player": "P",
            "player_in_hole": "X",
            "player_on_goal": "√",
        }
        return "\n".join(" ".join(symbols[x] for x in row) for row in self.cells())

    @cached_property
    def _solution(self) -> list[str]:
        return shortest_path(self.rows, self.player) or []

    def solution(self) -> list[str]:
        return [] if self.done else list(self._solution)

    def key(self) -> str:
        return f"{self.player[0]},{self.player[1]}"


def shortest_path(rows: tuple[str, ...] | list[str], start: Cell) -> list[str] | None:
    """A shortest list of moves from `start` to the goal that steps on no hole, or None."""
    size = len(rows)
    paths: dict[Cell, list[str]] = {start: []}
    frontier = deque([start])
    while frontier:
        cell = frontier.popleft()
        if rows[cell[0]][cell[1]] == "G":
            return paths[cell]
        for name, (d_row, d_col) in MOVES.items():
            nxt = (cell[0] + d_row, cell[1] + d_col)
            inside = 0 <= nxt[0] < size and 0 <= nxt[1] < size
            if inside and nxt not in paths and rows[nxt[0]][nxt[1]] != "H":
                paths[nxt] = [*paths[cell], name]
                frontier.append(nxt)
    return None


def random_lake(rng: random.Random, size: int, frozen: float, min_moves: int) -> Lake:
    """A map where each cell is frozen with probability `frozen` (else a hole), with a start
    and a goal whose shortest safe path takes at least `min_moves` moves (VAGEN's
    generate_random_map, plus the minimum)."""
    for _ in range(10_000):
        board = [["F" if rng.random() < frozen else "H" for _ in range(size)] for _ in range(size)]
        start = (rng.randrange(size), rng.randrange(size))
        goal = (rng.randrange(size), rng.randrange(size))
        if start == goal:
            continue
        board[start[0]][start[1]], board[goal[0]][goal[1]] = "F", "G"
        rows = tuple("".join(line) for line in board)
        path = shortest_path(rows, start)
        if path is not None and len(path) >= min_moves:
            return Lake(rows, start)
    raise ValueError(f"no {size}x{size} lake with a path of {min_moves}+ moves: lower min_moves")


class FrozenLakeEnv(GridGameEnv):
    """FrozenLake with the board as text; +1 at the goal, a hole ends the episode with 0."""

    name = "frozenlake"
    rules = "FrozenLake: walk to the goal without stepping into a hole; off the edge is no move."
    legend = "The board, one line per row: _ ice, O hole, G goal, P you."
    belief_objects = "the target (the goal) and each hole"
    belief_weights: ClassVar[dict[str, float]] = {"target": 0.7, "hole": 0.3}  # VAGEN's

    @classmethod
    def make_task(cls, seed: int, size: int = 4, frozen: float = 0.8, min_moves: int = 2) -> Task:
        if not 2 <= size <= 12:
            raise ValueError(f"size must be 2 to 12, got {size}")
        if not 0.0 < frozen <= 1.0:
            raise ValueError(f"frozen must be in (0, 1], got {frozen}")
        lake = random_lake(random.Random(f"frozenlake-{seed}"), size, frozen, min_moves)
        return Task(
            task_id=f"frozenlake-{seed}",
            prompt="Reach the goal.",
            answer=len(lake.solution()),
            meta={"rows": list(lake.rows), "start": list(lake.player)},
        )

    @classmethod
    def game_of(cls, task: Task) -> Lake:
        rows = tuple(task.meta["rows"])
        if any(len(line) != len(rows) or set(line) - set("FHG") for line in rows):
            raise ValueError(f"task {task.task_id}: rows must be a square of F, H and G")
        return Lake(rows, (int(task.meta["start"][0]), int(task.meta["start"][1])))


ICE, HOLE, GIFT, PLAYER = (205, 232, 250), (25, 55, 140), (245, 200, 40), (215, 40, 40)
LAKE_LOOKS = {
    "frozen": CellLook(ICE),
    "hole": CellLook(ICE, "disc", HOLE),
    "goal": CellLook(ICE, "gift", GIFT),
    "player": CellLook(ICE, "disc", PLAYER),
    "player_in_hole": CellLook(ICE, "disc", HOLE, inner=PLAYER),
    "player_on_goal": CellLook(ICE, "gift", GIFT, inner=PLAYER),
}


class FrozenLakeImageEnv(FrozenLakeEnv):
    """FrozenLake with the board drawn as an image (`cell_px` pixels a cell: a 4x4 lake at 16
    px is 64x64), everything else as the text version."""

    name = "frozenlake_image"
    legend = "The board is an image, a square per cell: ice, dark disc hole, gift goal, red you."

    def __init__(
        self,
        max_steps: int = 8,
        reply_format: ReplyFormat = "answer",
        context: ContextPolicy | None = None,
        few_shot: bool = True,
        cell_px: int = 16,
    ) -> None:
        if not 4 <= cell_px <= 128:
            raise ValueError(f"cell_px must be 4 to 128, got {cell_px}")
        super().__init__(max_steps, reply_format, context, few_shot)
        self.cell_px = cell_px

    def board_message(self, before: str, after: str) -> Message:
        assert self.game is not None
        frame = draw_board(self.game.cells(), LAKE_LOOKS, self.cell_px)
        return {"role": "user", "content": [text_part(before), image_part(frame), text_part(after)]}

    def image_caption(self) -> str | None:
        return None if self.game is None else self.game.text()
