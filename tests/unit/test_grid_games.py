"""FrozenLake and Sokoban (text versions): deterministic solvable tasks, VAGEN's symbols and
reply formats, per-step rewards, the true state before and after each move, and solvers that
win."""

from __future__ import annotations

import pytest

from agent_core.config.env_contract import check_built
from agent_core.core.records import Action, Step, Task
from agent_core.envs import ENVS, make_env, make_tasks
from agent_core.envs.frozenlake import FrozenLakeEnv, Lake, shortest_path
from agent_core.envs.sokoban import Room, SokobanEnv, solve
from agent_core.rewards.terms import REWARDS
from agent_core.text.belief import parse_belief_reply, parse_relations
from configs.env import EnvSection


def _play(env, task: Task, replies=None):
    env.reset(task)
    results = []
    while True:
        text = env.solve_step() if replies is None else replies.pop(0)
        results.append(env.step(Action(text)))
        if results[-1].done:
            return results


@pytest.mark.parametrize("name", ["frozenlake", "sokoban"])
@pytest.mark.parametrize("reply_format", ["answer", "belief"])
def test_the_solver_wins_every_task_in_the_fewest_moves(name: str, reply_format: str) -> None:
    for task in make_tasks(name, list(range(40)), {}, "train"):
        env = make_env(name, max_steps=30, few_shot=True, kwargs={"reply_format": reply_format})
        results = _play(env, task)
        assert results[-1].info["success"] and results[-1].info["end"] == "goal"
        assert len(results) == task.answer  # the task's answer: its shortest solution's length
        assert [r.reward for r in results] == [0.0] * (len(results) - 1) + [1.0]


def test_tasks_are_deterministic_varied_and_solvable() -> None:
    lakes = [FrozenLakeEnv.make_task(s) for s in range(100)]
    assert lakes[7] == FrozenLakeEnv.make_task(7)
    assert len({tuple(t.meta["rows"]) for t in lakes}) > 90
    for t in lakes:
        path = shortest_path(t.meta["rows"], tuple(t.meta["start"]))
        assert path is not None and len(path) == t.answer >= 2
    rooms = [SokobanEnv.make_task(s, size=5, inner_walls=0, max_moves=4) for s in range(50)]
    assert all(3 <= t.answer <= 4 for t in rooms)
    with pytest.raises(ValueError, match="size must be 2 to 12"):
        FrozenLakeEnv.make_task(0, size=20)
    with pytest.raises(ValueError, match=r"widen min_moves\.\.max_moves"):
        SokobanEnv.make_task(0, size=4, inner_walls=0, min_moves=9)


def test_frozenlake_text_board_moves_holes_and_edges() -> None:
    lake = Lake(("FFH", "FHF", "FFG"), (0, 0))
    assert lake.text() == "P _ O\n_ O _\n_ _ G"
    assert lake.move("Up") == lake  # the edge stops the move
    fell = lake.move("Right").move("Down")
    assert fell.done and not fell.success and fell.text().splitlines()[1] == "_ X _"
    won = lake.move("Down").move("Down").move("Right").move("Right")
    assert won.success and won.text().splitlines()[2] == "_ _ √"
    assert lake.solution() == ["Down", "Down", "Right", "Right"]


def test_a_hole_ends_the_episode_lost_and_a_wall_costs_a_little() -> None:
    task = Task("t", "", meta={"rows": ["FFH", "FHF", "FFG"], "start": [0, 0]})
    env = FrozenLakeEnv(max_steps=5)
    first = env.reset(task)
    assert "P _ O" in first.messages[-1]["content"]
    replies = ["<answer>Up</answer>", "<answer>right</answer>", "<answer>DOWN</answer>"]
    blocked, moved, fell = _play(env, task, replies)
    assert blocked.reward == FrozenLakeEnv.BLOCKED_PENALTY and not blocked.done
    # the next board says a move went nowhere, never which move was played
    assert blocked.observation.messages[-1]["content"].startswith("That move went nowhere.")
    assert moved.observation.messages[-1]["content"].startswith("The board:")
    assert moved.feedback == "You moved Right."  # the step row's feedback keeps it
    assert fell.done and not fell.truncated and fell.info["end"] == "lost" and fell.reward == 0.0
    assert fell.info["state"] == [
        ["target", "below", "right"],
        ["hole", "same", "right"],
        ["hole", "below", "same"],
    ]  # seen from (0, 1), before the move; the next state from the hole at (1, 1)
    assert fell.info["next_state"][0] == ["target", "below", "right"]
    assert fell.info["next_state"][2] == ["hole", "same", "same"]


def test_invalid_replies_cost_a_turn_and_running_out_truncates() -> None:
    task = FrozenLakeEnv.make_task(3)
    env = FrozenLakeEnv(max_steps=2)
    invalid = ["Down", "<answer>Jump</answer>"]
    results = _play(env, task, invalid)
    assert [r.reward for r in results] == [FrozenLakeEnv.INVALID_PENALTY] * 2
    assert results[0].info["valid_action"] is False and "Invalid reply" in results[0].feedback
    assert results[-1].truncated and results[-1].info["end"] == "max_steps"
    # the belief format takes the move only from a reply that is exactly the format
    env = FrozenLakeEnv(reply_format="belief")
    env.reset(task)
    assert env.read_move("<answer>Down</answer>") is None
    assert env.read_move(env.solve_step() or "") in ("Left", "Down", "Right", "Up")


def test_sokoban_pushes_and_walls() -> None:
    walls = frozenset({(r, c) for r in range(5) for c in range(5) if r in (0, 4) or c in (0, 4)})
    room = Room(5, walls, target=(1, 3), box=(2, 2), player=(2, 1))
    assert room.text().splitlines()[1:4] == ["# _ _ O #", "# P X _ #", "# _ _ _ #"]
    pushed = room.move("Right")
    assert (pushed.player, pushed.box) == ((2, 2), (2, 3))
    assert pushed.move("Right") == pushed  # the box against the wall does not move
    assert room.move("Up").move("Up") == room.move("Up")  # into the wall: no move
    path = solve(room)
    state = room
    for move in path or []:
        state = state.move(move)
    assert state.success and state.text().splitlines()[1].count("√") == 1
    assert room.relations()[1].object == "box"


def test_belief_solver_states_the_true_state_and_scores_full_marks() -> None:
    env = make_env("sokoban", max_steps=20, few_shot=False, kwargs={"reply_format": "belief"})
    task = SokobanEnv.make_task(5)
    env.reset(task)
    reply = env.solve_step() or ""
    parsed = parse_belief_reply(reply)
    assert parsed.format_correct
    assert [
        [r.object, r.vertical, r.horizontal] for r in parse_relations(parsed.observation or "")
    ] == [[r.object, r.vertical, r.horizontal] for r in env.game.relations()]
    result = env.step(Action(reply))
    step = Step(
        "r",
        1,
        0,
        "g",
        "t",
        0,
        task.task_id,
        "sokoban",
        [1],
        [2],
        [0.0],
        reply,
        "",
        0.0,
        False,
        False,
        info=result.info,
    )
    assert REWARDS["belief_observation"].fn(step, task) == 1.0
    assert REWARDS["belief_prediction"].fn(step, task) == 1.0


def test_registered_with_the_contract_checked_at_load() -> None:
    for name in ("frozenlake", "sokoban", "frozenlake_image", "sokoban_image"):  # at load
        section = EnvSection(name=name, kwargs={"reply_format": "belief"})
        check_built(ENVS[name], name, section)
    assert ENVS["frozenlake"] is FrozenLakeEnv and ENVS["sokoban"] is SokobanEnv
    assert ENVS["frozenlake_image"].__mro__[1] is FrozenLakeEnv
    assert ENVS["sokoban_image"].__mro__[1] is SokobanEnv
    with pytest.raises(ValueError, match="reply_format='json': choose one of answer, belief"):
        make_env("frozenlake", max_steps=3, few_shot=True, kwargs={"reply_format": "json"})
    env = make_env("frozenlake", max_steps=3, few_shot=True, kwargs={})
    env.reset(FrozenLakeEnv.make_task(0))
    assert isinstance(env.anchor_key(), str)


@pytest.mark.parametrize(
    ("text", "image"), [("frozenlake", "frozenlake_image"), ("sokoban", "sokoban_image")]
)
def test_the_image_versions_play_the_same_game_as_the_text_ones(text: str, image: str) -> None:
    for task in make_tasks(text, list(range(12)), {}, "train"):
        replies = ["<answer>Up</answer>", "<answer>Left</answer>", "Jump", "<answer>Down</answer>"]
        plays = []
        for name in (text, image):
            env = make_env(name, max_steps=4, few_shot=True, kwargs={})
            plays.append(_play(env, task, list(replies)))
        for a, b in zip(*plays, strict=True):
            assert (a.reward, a.done, a.truncated, a.feedback, a.info) == (
                b.reward,
                b.done,
                b.truncated,
                b.feedback,
                b.info,
            )
            if a.observation is not None:
                assert b.observation is not None and not b.observation.messages[-1]["content"][
                    1
                ].get("text")
                assert a.observation.images == [] and len(b.observation.images) >= 1


def test_a_lake_image_puts_each_cell_in_its_own_16_pixel_square() -> None:
    from agent_core.envs.frozenlake import GIFT, HOLE, ICE, PLAYER

    task = Task("t", "", meta={"rows": ["FFH", "FHF", "FFG"], "start": [0, 0]})
    env = make_env("frozenlake_image", max_steps=5, few_shot=True, kwargs={})
    obs = env.reset(task)
    user = obs.messages[-1]["content"]
    assert [p["type"] for p in user] == ["text", "image", "text"]
    frame = obs.images[0]
    assert frame.size == (48, 48)
    centre = {(r, c): frame.getpixel((c * 16 + 8, r * 16 + 8)) for r in range(3) for c in range(3)}
    assert centre[(0, 0)] == PLAYER and centre[(0, 2)] == centre[(1, 1)] == HOLE
    assert centre[(0, 1)] == ICE and frame.getpixel((2 * 16 + 3, 2 * 16 + 3)) == GIFT
    assert "image" in obs.messages[0]["content"] and "_ frozen" not in obs.messages[0]["content"]
    with pytest.raises(ValueError, match="cell_px must be 4 to 128"):
        make_env("frozenlake_image", max_steps=5, few_shot=True, kwargs={"cell_px": 2})


def test_a_room_image_shows_the_room_inside_its_outer_wall() -> None:
    from agent_core.envs.sokoban import BOX, BRICK, PLAYER

    env = make_env("sokoban_image", max_steps=5, few_shot=True, kwargs={})
    task = SokobanEnv.make_task(1)
    frame = env.reset(task).images[0]
    room = SokobanEnv.game_of(task)
    assert frame.size == (16 * (room.size - 2),) * 2

    def at(cell):
        return frame.getpixel(((cell[1] - 1) * 16 + 8, (cell[0] - 1) * 16 + 8))

    assert at(room.player) == PLAYER and at(room.box) == BOX
    inner_walls = [w for w in room.walls if 0 < w[0] < room.size - 1 and 0 < w[1] < room.size - 1]
    assert inner_walls and all(
        frame.getpixel(((w[1] - 1) * 16 + 1, (w[0] - 1) * 16 + 1)) == BRICK for w in inner_walls
    )
