"""The code env's shipped tasks file, written from the generated task set: the functions of
`code_tasks.HELD_OUT` only in the held-out split, so evaluation measures functions training
never saw (`python -m agent_core.envs.code_tasks_file --out configs/data/code_tasks.jsonl`).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from agent_core.envs.code_tasks import HELD_OUT, PROBLEMS, CodeProblem, instance


def task_rows(train_per_function: int, held_out_per_function: int) -> list[dict[str, Any]]:
    """The rows of the shipped tasks file: every training function's tasks, then the held-out
    functions' tasks one function after the other in turn (so the first rows of the held-out
    split already cover every held-out function). `tests` is JSON text: its expected values
    mix types that one Parquet/JSONL column type could not hold."""
    rows: list[dict[str, Any]] = []

    def add(problem: CodeProblem, split: str, k: int) -> None:
        rng = random.Random(f"{problem.function}/{split}/{k}")
        prompt, tests = instance(problem, rng)
        rows.append(
            {
                "id": f"{problem.function}-{split}-{k}",
                "split": split,
                "function": problem.function,
                "prompt": prompt,
                "tests": json.dumps(tests),
                "reference": problem.reference,
            }
        )

    for problem in PROBLEMS:
        if problem.function not in HELD_OUT:
            for k in range(train_per_function):
                add(problem, "train", k)
    for k in range(held_out_per_function):
        for problem in PROBLEMS:
            if problem.function in HELD_OUT:
                add(problem, "held_out", k)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description="Write the code env's tasks file (JSONL).")
    parser.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    parser.add_argument("--train-per-function", type=int, default=8)
    parser.add_argument("--held-out-per-function", type=int, default=8)
    args = parser.parse_args()
    rows = task_rows(args.train_per_function, args.held_out_per_function)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"{args.out}: {len(rows)} tasks, {len(HELD_OUT)} held-out functions")


if __name__ == "__main__":
    main()
