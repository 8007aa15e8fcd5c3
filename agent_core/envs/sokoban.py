"""Sokoban with one box (as VAGEN plays it by default): push the box onto the target, one move
per reply. Random walled rooms whose box can reach the target; the board shown as VAGEN's
symbol grid (sokoban) or drawn as an image (sokoban_image), same rooms and dynamics.
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
class Room:
    """A room of `size` x `size` cells (`walls`, the border included), the target, the box and
    the player."""

    size: int
    walls: frozenset[Cell]
    target: Cell
    box: Cell
    player: Cell

    @property
    def done(self) -> bool:
        return self.box == self.target

    @property
    def success(self) -> bool:
        return self.box == self.target

    def move(self, name: str) -> Room:
        if self.done:
            return self
        d_row, d_col = MOVES[name]
        step = (self.player[0] + d_row, self.player[1] + d_col)
        if step in self.walls:
            return self
        if step != self.box:
            return Room(self.size, self.walls, self.target, self.box, step)
        pushed = (step[0] + d_row, step[1] + d_col)
        if pushed in self.walls:
            return self
        return Room(self.size, self.walls, self.target, pushed, step)

    def relations(self) -> list[Relation]:
        return [
            relation_of("target", self.player, self.target),
            relation_of("box", self.player, self.box),
        ]

    def cells(self) -> list[list[str]]:
        grid = [["floor"] * self.size for _ in range(self.size)]
        for row, col in self.walls:
            grid[row][col] = "wall"
        grid[self.target[0]][self.target[1]] = "target"
        box = "box_on_target" if self.box == self.target else "box"
        grid[self.box[0]][self.box[1]] = box
        player = "player_on_target" if self.player == self.target else "player"
        grid[self.player[0]][self.player[1]] = player
        return grid

    def text(self) -> str:
        """VAGEN's symbols: # wall, _ floor, O target, X box, √ box on target, P player, S
        player on target."""
        symbols = {
            "wall": "#",
            "floor": "_",
            "target": "O",
            "box": "X",
            "box_on_target": "√",
            "player": "P",
            "player_on_target": "S",
        }
        return "\n".join(" ".join(symbols[x] for x in row) for row in self.cells())

    @cached_property
    def _solution(self) -> list[str]:
        return solve(self) or []

    def solution(self) -> list[str]:
        return [] if self.done else list(self._solution)

    def key(self) -> str:
        return f"player {self.player[0]},{self.player[1]} box {self.box[0]},{self.box[1]}"


def solve(room: Room) -> list[str] | None:
    """A shortest list of moves that puts the box on the target (breadth-first over player and
    box cells), or None when none does."""
    paths: dict[tuple[Cell, Cell], list[str]] = {(room.player, room.box): []}
    frontier = deque([room])
    while frontier:
        state = frontier.popleft()
        path = paths[(state.player, state.box)]
        if state.success:
            return path
        for name in MOVES:
            nxt = state.move(name)
            if (nxt.player, nxt.box) not in paths:
                paths[(nxt.player, nxt.box)] = [*path, name]
                frontier.append(nxt)
    return None


def random_room(
    rng: random.Random, size: int, inner_walls: int, min_moves: int, max_moves: int | None
) -> Room:
    """A walled room with `inner_walls` extra wall cells inside, a target, a box off it and the
    player, whose shortest solution takes `min_moves` to `max_moves` (None: any) moves."""
    border = {
        (r, c) for r in range(size) for c in range(size) if r in (0, size - 1) or c in (0, size - 1)
    }
    inside = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1)]
    for _ in range(10_000):
        cells = rng.sample(inside, inner_walls + 3)
        walls = frozenset(border | set(cells[3:]))
        room = Room(size, walls, cells[0], cells[1], cells[2])
        path = solve(room)
        if path is not None and min_moves <= len(path) <= (max_moves or len(path)):
            return room
    raise ValueError(
        f"no {size}x{size} room with {inner_walls} inner walls and a solution of {min_moves} to "
        f"{max_moves} moves: widen min_moves..max_moves or change inner_walls"
    )


class SokobanEnv(GridGameEnv):
    """Sokoban with the board as text; +1 when the box is on the target."""

    name = "sokoban"
    rules = "Sokoban: push the box onto the target by walking into it; boxes cannot be pulled."
    legend = "The board, one line per row: # wall, _ floor, O target, X box, P you."
    belief_objects = "the target and the box"
    belief_weights: ClassVar[dict[str, float]] = {"target": 0.5, "box": 0.5}  # VAGEN's

    @classmethod
    def make_task(
        cls,
        seed: int,
        size: int = 6,
        inner_walls: int = 2,
        min_moves: int = 3,
        max_moves: int | None = None,
    ) -> Task:
        if not 4 <= size <= 10:
            raise ValueError(f"size must be 4 to 10, got {size}")
        if not 0 <= inner_walls <= (size - 2) ** 2 - 3:
            raise ValueError(f"inner_walls must be 0 to {(size - 2) ** 2 - 3}, got {inner_walls}")
        rng = random.Random(f"sokoban-{seed}")
        room = random_room(rng, size, inner_walls, min_moves, max_moves)
        return Task(
            task_id=f"sokoban-{seed}",
            prompt="Push the box onto the target.",
            answer=len(room.solution()),
            meta={
                "size": size,
                "walls": sorted([list(w) for w in room.walls]),
                "target": list(room.target),
                "box": list(room.box),
                "player": list(room.player),
            },
        )

    @classmethod
    def game_of(cls, task: Task) -> Room:
        meta = task.meta
        walls = frozenset((int(r), int(c)) for r, c in meta["walls"])
        target, box, player = (tuple(int(x) for x in meta[k]) for k in ("target", "box", "player"))
        return Room(int(meta["size"]), walls, target, box, player)  # type: ignore[arg-type]


FLOOR, BRICK, MORTAR = (190, 190, 190), (125, 70, 40), (80, 45, 25)
TARGET, BOX, BOX_DONE, PLAYER = (210, 30, 30), (215, 145, 50), (60, 170, 60), (40, 80, 225)
ROOM_LOOKS = {
    "wall": CellLook(BRICK, "bricks", MORTAR),
    "floor": CellLook(FLOOR),
    "target": CellLook(FLOOR, "outline", TARGET),
    "box": CellLook(FLOOR, "square", BOX),
    "box_on_target": CellLook(FLOOR, "square", BOX_DONE),
    "player": CellLook(FLOOR, "disc", PLAYER),
    "player_on_target": CellLook(FLOOR, "outline", TARGET, inner=PLAYER),
}


class SokobanImageEnv(SokobanEnv):
    """Sokoban with the room drawn as an image (`cell_px` pixels a cell), everything else as
    the text version. The image shows the room inside its outer wall (a 6x6 room is a 4x4
    image: 64x64 at 16 px); the outer wall is always there and is not drawn."""

    name = "sokoban_image"
    legend = (
        "The board is an image of the room inside its outer wall, a square per cell: grey floor, "
        "brown wall, red outline target, orange box (green on the target), blue disc you."
    )

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
        inside = [row[1:-1] for row in self.game.cells()[1:-1]]
        frame = draw_board(inside, ROOM_LOOKS, self.cell_px)
        return {"role": "user", "content": [text_part(before), image_part(frame), text_part(after)]}

    def image_caption(self) -> str | None:
        """The text twin's symbols of the cells the image shows (the room inside its wall)."""
        if self.game is None:
            return None
        rows = self.game.text().splitlines()[1:-1]
        return "\n".join(" ".join(row.split(" ")[1:-1]) for row in rows)
