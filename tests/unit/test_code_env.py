"""The code env: hidden tests run in the python sandbox and are judged on the host; correct,
partly correct and malicious solutions (infinite loop, reading a host file, early exit, forged
output, an always-equal object) get the share of tests they really pass."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from agent_core.collect.iteration_tasks import train_tasks
from agent_core.config.load import config_from_dict, load_config
from agent_core.config.presets import ConfigError
from agent_core.core.records import Action, Task
from agent_core.envs import make_env
from agent_core.envs.code import CodeEnv, extract_code
from agent_core.envs.code_tasks import (
    HELD_OUT,
    PROBLEMS,
    hidden_tests,
    reference_function,
)
from agent_core.envs.code_tasks_file import task_rows
from agent_core.envs.code_tests import HiddenTestsResult, judge
from agent_core.run.evaluate import eval_tasks
from agent_core.tools import python as python_tool
from agent_core.tools.sandbox.run import sandbox_problem

PROBLEM = sandbox_problem("namespaces")
needs_sandbox = pytest.mark.skipif(PROBLEM is not None, reason=f"no namespaces: {PROBLEM}")

TASK = Task(
    "rev",
    "Write reverse_words(s).",
    meta={
        "tests": [
            {"call": "reverse_words('a b c')", "expected": "c b a"},
            {"call": "reverse_words('hello world')", "expected": "world hello"},
            {"call": "reverse_words('x')", "expected": "x"},
            {"call": "reverse_words('one two three four')", "expected": "four three two one"},
        ]
    },
)


def _score(code: str, **kwargs: float) -> tuple[float, dict]:
    env = CodeEnv(test_timeout_s=kwargs.get("test_timeout_s", 1.0))
    env.reset(TASK)
    result = env.step(Action(f"Here it is:\n```python\n{code}\n```"))
    assert result.done
    return result.reward, result.info


@needs_sandbox
def test_correct_solution_scores_one() -> None:
    reward, info = _score("def reverse_words(s):\n    return ' '.join(s.split()[::-1])")
    assert reward == 1.0 and info["success"] and info["tests_passed"] == 4


@needs_sandbox
def test_partly_correct_solution_scores_its_share() -> None:
    # right only when the input has at most two words
    code = "def reverse_words(s):\n    w = s.split()\n    return ' '.join([w[-1]] + w[:-1])"
    reward, info = _score(code)
    assert reward == 0.5 and not info["success"]
    assert info["test_failures"] == [
        "reverse_words('a b c'): wrong value",
        "reverse_words('one two three four'): wrong value",
    ]


@needs_sandbox
def test_infinite_loop_is_stopped_per_test() -> None:
    code = (
        "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "def reverse_words(s):\n    if len(s) > 1:\n        while True:\n            pass\n"
        "    return s"
    )
    reward, info = _score(code, test_timeout_s=0.5)
    assert reward == 0.25  # only 'x' returns; the three loops are killed at their deadline
    assert info["test_failures"][0] == "reverse_words('a b c'): timeout"


@needs_sandbox
def test_reading_the_answers_from_a_host_file_gains_nothing(tmp_path: Path) -> None:
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({t["call"]: t["expected"] for t in TASK.meta["tests"]}))
    answers.chmod(0o644)
    code = (
        "import json, inspect\n"
        "def reverse_words(s):\n"
        f"    return json.load(open({str(answers)!r}))[f'reverse_words({{s!r}})']"
    )
    reward, info = _score(code)
    assert reward == 0.0
    assert set(info["test_failures"]) == {
        f"{t['call']}: FileNotFoundError" for t in TASK.meta["tests"]
    }


# Finds the nonce in the harness's source, prints a full report under it, and kills the harness
# so that its own report never comes: only a silenced stdout stops this.
FORGED_REPORT = (
    "import json, os, re, signal, sys\n"
    "nonce = re.findall(r\"print\\('([0-9a-f]{32})'\", open(sys.argv[0]).read())[-1]\n"
    "values = ['c b a', 'world hello', 'x', 'four three two one']\n"
    "print(nonce, json.dumps([{'value': v} for v in values]), flush=True)\n"
    "os.kill(os.getppid(), signal.SIGKILL)"
)


@needs_sandbox
@pytest.mark.parametrize(
    "code",
    [
        "import os\nos._exit(0)",  # exit before any test: no result, not a pass
        "class E:\n    def __eq__(self, other):\n        return True\n"
        "def reverse_words(s):\n    return E()",  # compared on the host as JSON: no such value
        FORGED_REPORT,
    ],
    ids=["early-exit", "always-equal", "forged-report"],
)
def test_cheats_score_zero(code: str) -> None:
    reward, _ = _score(code)
    assert reward == 0.0


def test_no_code_scores_zero_without_running() -> None:
    env = CodeEnv()
    env.reset(TASK)
    result = env.step(Action("I cannot write this."))
    assert result.reward == 0.0 and result.info["test_failures"] == ["the reply holds no code"]


def test_judge_needs_the_nonce_line() -> None:
    tests = TASK.meta["tests"][:1]
    assert judge('n0 [{"value": "c b a"}]', "n0", tests) == HiddenTestsResult(1, 1, [])
    assert judge('other [{"value": "c b a"}]', "n0", tests).passed == 0
    assert judge('n0 [{"value": 1}]', "n0", [{"call": "f()", "expected": True}]).passed == 0


def test_extract_code() -> None:
    assert extract_code("x\n```python\ndef f(): pass\n```\n```py\ndef g(): pass\n```") == (
        "def g(): pass\n"
    )
    assert extract_code("def f():\n    return 1") == "def f():\n    return 1"
    assert extract_code("no code here") is None


def problem_named(function: str):
    return next(p for p in PROBLEMS if p.function == function)


def test_generated_tasks_have_three_to_five_tests_the_reference_passes() -> None:
    seen = set()
    for seed in range(600):
        task = CodeEnv.make_task(seed)
        assert task == CodeEnv.make_task(seed)
        tests = task.meta["tests"]
        assert 3 <= len(tests) <= 5 and len({t["call"] for t in tests}) == len(tests)
        namespace: dict = {}
        exec(task.meta["reference"], namespace)
        for test in tests:
            assert eval(test["call"], namespace) == test["expected"]
        seen.add(task.meta["function"])
    assert seen == {p.function for p in PROBLEMS}
    assert len(hidden_tests(PROBLEMS[0], random.Random(0), 3)) == 3
    assert reference_function(problem_named("count_vowels"))("Hello") == 2
    assert reference_function(problem_named("square_positives"))([-3, 2, 0, 5]) == [4, 25]
    assert reference_function(problem_named("keep_digits"))("a1 B22") == "122"


SHIPPED = Path(__file__).parents[2] / "configs" / "data" / "code_tasks.jsonl"


def test_shipped_tasks_file_is_the_generated_one_with_its_held_out_functions_apart() -> None:
    rows = [json.loads(line) for line in SHIPPED.read_text().splitlines()]
    assert rows == task_rows(8, 8), "regenerate: python -m agent_core.envs.code_tasks_file"
    train = {r["function"] for r in rows if r["split"] == "train"}
    held_out = {r["function"] for r in rows if r["split"] == "held_out"}
    assert held_out == HELD_OUT and not train & held_out
    assert len(train) + len(held_out) == len(PROBLEMS)
    # every part of a held-out function (map, filter, operation, class) trains elsewhere
    for name in held_out:
        for part in name.replace("sum_of", "sum").split("_"):
            assert any(part in t.split("_") for t in train), (name, part)
    for row in rows:
        namespace: dict = {}
        exec(row["reference"], namespace)
        for test in json.loads(row["tests"]):
            assert eval(test["call"], namespace) == test["expected"], row["id"]


def test_learn_code_evaluates_only_functions_training_never_sees() -> None:
    cfg = load_config("learn_code", ["model.source=tiny-random"])
    held_out = eval_tasks(cfg)
    assert len(held_out) == cfg.eval.episodes == 72
    assert {t.meta["function"] for t in held_out} == HELD_OUT
    seen = set()
    for stream in range(-1, cfg.run.iterations):
        seen |= {t.meta["function"] for t in train_tasks(cfg, stream, 64)}
    assert seen and not seen & HELD_OUT


@needs_sandbox
def test_solver_passes_and_sandbox_settings_come_from_tool_options() -> None:
    env = make_env("code", 1, True, {}, tool_options={"python": {"memory_mb": 128}})
    assert isinstance(env, CodeEnv)
    env.reset(CodeEnv.make_task(7))
    result = env.step(Action(env.solve_step() or ""))
    assert result.reward == 1.0
    assert env.runner(4).limits.memory_mb == 128


def test_a_sandbox_this_machine_lacks_fails_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(python_tool, "sandbox_problem", lambda level: "unshare: not permitted")
    data = {"model": {"source": "tiny-random", "path": "unused"}, "env": {"name": "code"}}
    with pytest.raises(ConfigError, match=r"env\.tool_options\.python: .*unshare: not permitted"):
        config_from_dict(data)
