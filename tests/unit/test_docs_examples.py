"""The extension snippets of docs/extending.md work as written: a tool, the envs (one with a
built-in tool and worked examples, one whose tool serves each task's data, one keeping
held-out content by split, one that shows images and its true state), a reward, an estimator,
and the configs that name them."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest
import yaml

from agent_core.algorithms import AdvantageOptions, StepArrays
from agent_core.collect.iteration_tasks import iteration_tasks
from agent_core.collect.loops import make_loop
from agent_core.config.load import load_config
from agent_core.core.records import Action
from agent_core.core.registry import resolve
from agent_core.envs import make_env, make_tasks
from agent_core.rewards.scoring import configured_terms, group_trajectories
from agent_core.rewards.terms import reward_fn
from agent_core.rollout.loop import RolloutMeta
from agent_core.run.evaluate import eval_tasks
from tests.conftest import REPO

PAGE = REPO / "docs" / "extending.md"
MARK = "# docs-example: my_ext.py"


@pytest.fixture(scope="module")
def my_ext(tmp_path_factory: pytest.TempPathFactory):
    page = PAGE.read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if b.startswith(MARK)]
    assert len(blocks) == 11
    folder = tmp_path_factory.mktemp("ext")
    (folder / "my_ext.py").write_text("\n".join(blocks))
    sys.path.insert(0, str(folder))
    yield page
    sys.path.remove(str(folder))
    sys.modules.pop("my_ext", None)


def _yaml_snippet(page: str) -> dict:
    block = re.search(r"```yaml\n(env: \{name: \"my_ext:WordCountEnv\"\}.*?)```", page, re.S)
    assert block, "docs/extending.md lost its config snippet"
    return yaml.safe_load(block.group(1))


def test_config_snippet_validates(my_ext: str) -> None:
    snippet = _yaml_snippet(my_ext)
    overrides = [
        f"env.name={snippet['env']['name']}",
        f"algorithm.estimator={snippet['algorithm']['estimator']}",
        "reward.terms="
        + yaml.safe_dump(snippet["reward"]["terms"], default_flow_style=True).strip(),
    ]
    config = load_config("smoke", overrides)
    assert config.env.name == "my_ext:WordCountEnv"


def test_env_and_tool_run(my_ext: str) -> None:
    env = make_env("my_ext:WordCountEnv", max_steps=3, few_shot=True, kwargs={})
    task = type(env).make_task(4)
    env.reset(task)
    call = '<tool_call>{"name": "word_count", "arguments": {"text": "a b c"}}</tool_call>'
    assert env.step(Action(text=call)).feedback == "3"
    done = env.step(Action(text=f"Answer: {task.answer}"))
    assert done.done and done.info["success"]


def test_guess_env_runs_with_its_config_snippet(my_ext: str) -> None:
    block = re.search(r"```yaml\n# docs-guess-config\n(.*?)```", my_ext, re.S)
    assert block, "docs/extending.md lost the guess env's config"
    section = yaml.safe_load(block.group(1))["env"]
    config = load_config("smoke", [f"env.{k}={json.dumps(v)}" for k, v in section.items()])
    env_cfg = config.env
    (task,) = make_tasks(env_cfg.name, [0], env_cfg.task_options, split="train")
    assert task.meta["top"] == 20
    secrets = set()
    for seed in range(8):
        env = make_env(env_cfg.name, env_cfg.max_steps, False, env_cfg.kwargs, env_cfg.context)
        env.start_episode(task, seed)
        secrets.add(env.secret)
        for _ in range(3):
            result = env.step(Action(text="0"))
        assert not result.done and result.info["success"] is False
        # a one-turn window: the task, then only the last guess and its hint
        assert [m["content"] for m in result.observation.messages] == [task.prompt, "0", "Higher."]
        assert env.step(Action(text=str(env.secret))).info["success"]
    assert len(secrets) > 1 and all(1 <= s <= 20 for s in secrets)


def test_env_reward_terms_are_the_default(my_ext: str) -> None:
    config = load_config("smoke", ["env.name=my_ext:WordCountEnv", "reward.terms=null"])
    assert [(t.name, t.weight) for t in configured_terms(config)] == [("answer_match", 1.0)]


def test_reward_and_estimator(my_ext: str) -> None:
    assert reward_fn("my_ext:short_answers").kind == "process"
    estimator = resolve("estimator", "my_ext:plain_reinforce", {})
    arrays = StepArrays.from_columns(["g", "g"], ["a", "b"], [0, 0], [1.0, 0.0])
    result = estimator(arrays, AdvantageOptions())
    np.testing.assert_allclose(result.advantages, [0.5, -0.5])


def _solver_episodes(env: str, tokenizer, tasks: int = 6):
    """The env's solver played through steprl's loop (one episode per task, all at once)."""
    cfg = load_config("smoke", [f"env.name=my_ext:{env}", "env.max_steps=3"])
    loop = make_loop(cfg, None, seed=0, tokenizer=tokenizer)
    chosen = make_tasks(cfg.env.name, list(range(tasks)), cfg.env.task_options, split="train")
    steps, _ = loop.run(chosen, 1, RolloutMeta("docs", 0, 0, env), solver=True)
    return chosen, list(group_trajectories(steps).values())


def test_builtin_tool_with_worked_examples(my_ext: str, tiny_tokenizer) -> None:
    from my_ext import WORKED

    tasks, episodes = _solver_episodes("EggsEnv", tiny_tokenizer)
    assert all(e[-1].success for e in episodes) and len(episodes) == len(tasks)
    for task, (call, answer) in zip(tasks, episodes, strict=True):
        assert call.feedback_text == str(task.answer)  # the built-in calculator computed it
        assert answer.response_text == f"Answer: {task.answer}"
    shown = [m["content"] for m in WORKED]
    for few_shot, expected in ((True, shown), (False, [])):
        cfg = load_config("smoke", ["env.name=my_ext:EggsEnv", f"env.few_shot={few_shot}"])
        env = make_env(cfg.env.name, 3, cfg.env.few_shot, cfg.env.kwargs)
        obs = env.reset(type(env).make_task(0))
        assert [m["content"] for m in obs.messages[1:-1]] == expected  # system, examples, task
        assert [t["function"]["name"] for t in obs.tools] == ["calculator"]


def test_tool_serves_each_tasks_own_data(my_ext: str, tiny_tokenizer) -> None:
    tasks, episodes = _solver_episodes("ShopEnv", tiny_tokenizer, tasks=12)
    assert len({json.dumps(t.meta["prices"], sort_keys=True) for t in tasks}) > 1
    assert len({t.answer for t in tasks}) > 1
    for task, (lookup, answer) in zip(tasks, episodes, strict=True):  # episodes ran at once
        assert lookup.feedback_text == str(task.answer)  # this task's price, not another's
        assert answer.success
    env = make_env("my_ext:ShopEnv", max_steps=3, few_shot=False, kwargs={})
    env.reset(tasks[0])
    call = '<tool_call>{"name": "price", "arguments": {"item": "caviar"}}</tool_call>'
    result = env.step(Action(text=call))
    assert "no item 'caviar' here" in result.feedback and not result.done


@pytest.mark.parametrize("eval_start", [10_000_000, 2_000_001])
def test_held_out_content_stays_held_out_by_split(my_ext: str, eval_start: int) -> None:
    from my_ext import CAPITALS

    overrides = ["env.name=my_ext:CapitalEnv", "env.max_steps=1", "eval.episodes=4"]
    cfg = load_config("smoke", [*overrides, f"env.eval_seed_start={eval_start}"])
    countries = {
        split: {t.prompt.removeprefix("The capital of ").rstrip("?") for t in tasks}
        for split, tasks in (("train", iteration_tasks(cfg, 0)), ("eval", eval_tasks(cfg)))
    }
    assert countries["eval"] == {country for country, _ in CAPITALS["eval"]}
    assert countries["train"] <= {country for country, _ in CAPITALS["train"]}


def test_first_turn_content_is_the_oldest_turn_under_a_window(my_ext: str) -> None:
    """The lamps env of "What the first turn shows, under a window": its task stays in every
    prompt, its first board only until a window drops it; `full` keeps both."""
    window = {"name": "window", "last_turns": 1}
    (task,) = make_tasks("my_ext:LampsEnv", [5], {}, split="train")  # lamps 0101
    seen = {}
    for name, context in (("window", window), ("full", "full")):
        env = make_env("my_ext:LampsEnv", 4, False, {}, context)
        first = env.start_episode(task, seed=0)
        assert [m["content"] for m in first.messages] == [task.prompt, "Lamps: 0101"]
        second = env.step(Action(text="1")).observation
        seen[name] = [m["content"] for m in second.messages]
        third = env.step(Action(text="3")).observation
        assert third is None  # 1111: solved
    assert seen["window"] == [task.prompt, "1", "Lamps: 1101"]
    assert seen["full"] == [task.prompt, "Lamps: 0101", "1", "Lamps: 1101"]
    config = load_config("smoke", ["env.name=my_ext:LampsEnv", f"env.context={json.dumps(window)}"])
    assert config.env.context == window  # built and reset at load under the window


def test_the_offline_check_prints_what_the_page_says(my_ext: str, capsys) -> None:
    """The "Offline, without a model" block, run as written: the solver wins every held-out
    episode and the constant answer the share the page quotes."""
    block = re.search(r"```python\n# docs-offline-check\n(.*?)```", my_ext, re.S)
    assert block, "docs/extending.md lost its offline check"
    exec(block.group(1), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["solver 1.000", "constant answer 0.042"]
    assert "prints `solver 1.000` and `constant answer 0.042`" in my_ext


def test_the_image_env_shows_its_board_and_states_its_state(my_ext: str) -> None:
    """The goal board of "An image env of your own": its solver wins every task in the fewest
    moves, each board is an image part whose red and green squares are where the env says,
    its info holds the goal's true relation before and after each move, and the preset's
    config takes it (built and reset at load)."""
    from agent_core.core.records import Step
    from agent_core.rewards.terms import REWARDS
    from agent_core.text.belief import belief_reply

    for task in make_tasks("my_ext:GoalBoardEnv", list(range(20)), {}, split="train"):
        env = make_env("my_ext:GoalBoardEnv", 8, True, {}, {"name": "window", "last_turns": 1})
        obs = env.start_episode(task, seed=0)
        frame = obs.images[-1]
        (row, col), (g_row, g_col) = task.meta["start"], task.meta["goal"]
        assert frame.getpixel((col * 16 + 8, row * 16 + 8)) == (255, 0, 0)
        assert frame.getpixel((g_col * 16 + 8, g_row * 16 + 8)) == (0, 128, 0)
        caption = [line.split(" ") for line in env.image_caption().splitlines()]
        assert caption[row][col] == "R" and caption[g_row][g_col] == "G"
        turns, result = 0, None
        while result is None or not result.done:
            result = env.step(Action(text=env.solve_step()))
            turns += 1
            if result.observation is not None:
                assert len(result.observation.images) == 1  # the window keeps the newest board
        assert result.info["success"] and turns == abs(row - g_row) + abs(col - g_col)
        assert result.info["next_state"] == [["goal", "same", "same"]]
    reply = belief_reply("goal below right", "", "goal same same", "Down")
    step = Step(
        "r",
        1,
        0,
        "g",
        "t",
        0,
        "task",
        "my_ext:GoalBoardEnv",
        [1],
        [2],
        [0.0],
        reply,
        "",
        0.0,
        True,
        False,
        info={"state": [["goal", "below", "right"]]},
    )
    assert REWARDS["belief_observation"].fn(step, task) == 1.0
    config = load_config(
        "learn_visual",
        [
            "env.name=my_ext:GoalBoardEnv",
            "model.source=tiny-random-vlm",
            "model.path=.models/tiny-random-vlm",
        ],
    )
    assert config.env.name == "my_ext:GoalBoardEnv"
    # the preset's alignment stage reads the env's boards and captions as the docs say
    from agent_core.run.vision_align import captions

    (image, caption), *_ = captions(config, [task])
    assert image.size == (64, 64) and caption.count("R") == 1


def test_the_colour_env_shows_its_picture_to_a_vlm(my_ext: str, tiny_vlm_dir) -> None:
    """The colour env of "Envs that show images": its observation is a text part then an image
    part, which a VLM's processor renders as the image's run of tokens; a text model is refused
    it; its solver names the colour."""
    from transformers import AutoProcessor, AutoTokenizer

    from agent_core.prompting.renderer import PromptRenderer

    env = make_env("my_ext:ColourEnv", 1, False, {})
    task = type(env).make_task(2)
    obs = env.start_episode(task, seed=0)
    assert [p["type"] for p in obs.messages[0]["content"]] == ["text", "image"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_vlm_dir)
    flow = PromptRenderer(tokenizer, "none", AutoProcessor.from_pretrained(tiny_vlm_dir))
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    assert flow.encode(obs).count(image_id) == 16
    with pytest.raises(ValueError, match="the policy is a text model"):
        PromptRenderer(tokenizer).encode(obs)
    assert env.step(Action(text=env.solve_step())).info["success"]
