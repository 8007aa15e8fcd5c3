"""Tree against chain rollouts at equal generated tokens on an outsider env under `learn_general`.

The chain arm is the preset as it is: a whole `steprl train` run (the supervised warm-up, then
RL: GiGPO over groups of 4 chains per task). The tree arm starts RL from the chain run's warm-up
checkpoint (the same weights; `warmup.enabled=false`) with Tree-GRPO's budget mode
(`rollout.tree`: `--trees` trees per task, each expansion round starting one new episode per
tree from a state drawn among its task prompt and the states after its steps that did not end
an episode) and `algorithm.estimator=tree_grpo`; its generated tokens per task are capped
(`rollout.tree.token_budget`) at the chain run's mean generated tokens per episode times (the
chain's group size - trees / 2): a round starts while a task is under its budget and then
runs to its end, so its trees pass the budget by about half a round. Every other setting is
the preset's, refill of groups without a success included, in both arms.

Prints per arm: greedy held-out success after the warm-up (policy 0) and after iterations 4 and
8; generated tokens, episodes and seconds per iteration (the phases collect, refill, score,
write_replay, update, sync and log; held-out evaluations left out; --record keeps their means);
the tree / chain ratios of tokens and seconds; the box's load average at the start of each arm.

Run: nice -n 10 .venv/bin/python bench/trees.py --env corridor --seed 1 (two runs in runs/,
named trees-<env>-s<seed>-chain and -tree, logged to ./mlflow.db as any `steprl train` run;
`steprl eval` works on either; a run of that name already there is resumed, not redone);
--report: print (and with --record, keep) the figures of the two runs of those names as they
stand, training nothing (runs that finished earlier; no load average then);
--smoke: the tiny random model, 1 iteration each, in a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from offline import (
    DEFAULT_MODEL,
    REPO,
    SMOKE_HELP,
    add_record_option,
    figure,
    prepare,
    write_record,
)

LOGGED_MARK = "logged.json"  # agent_core.core.run_folder.LOGGED_MARK: an iteration's log record

ENVS = {
    "choice": [
        "env.name=tests.outsider.choice_env:ChoiceEnv", "env.max_steps=1",
    ],
    "corridor": [
        "env.name=tests.outsider.corridor_env:CorridorEnv", "env.max_steps=12",
        "env.context={name: window, last_turns: 1}",
    ],
    "code_guess": ["env.name=tests.outsider.code_guess_env:CodeGuessEnv", "env.max_steps=6"],
    "grid": ["env.name=tests.outsider.grid_env:GridEnv"],
}  # fmt: skip
# what a tiny random model needs (docs/extending.md, "The smallest run")
SMOKE = [
    "run.iterations=1",
    "warmup.tasks=8",
    "eval.every=1",
    "eval.episodes=4",
    "rollout.tasks_per_iteration=2",
    "rollout.max_prompt_tokens=4096",
    "refill.drop=[]",
    "reward.terms=[{name: answer_match}, {name: response_tokens, weight: -0.01}]",
]
PHASES = ["collect", "refill", "score", "write_replay", "update", "sync", "log"]
GROUP = 4  # learn_general's rollout.group_size: the chain's episodes per task


def train(name: str, args: argparse.Namespace, extra: list[str]) -> Path:
    """One `steprl train` run of `learn_general` on the env; returns its run folder."""
    runs = args.runs
    tracking = [f"tracking.tracking_uri=sqlite:///{runs / 'mlflow.db'}"] if args.smoke else []
    settings = [
        *ENVS[args.env],
        f"run.seed={args.seed}",
        f"run.name={name}",
        f"run.output_dir={runs}",
        *tracking,
        f"model.path={args.model}",
        *(SMOKE if args.smoke else []),
        *extra,
    ]
    cmd = [sys.executable, "-m", "flows.cli", "train", "--config", "learn_general"]
    for item in settings:
        cmd += ["--set", item]
    print(f"load average {os.getloadavg()[0]:.2f}: {shlex.join(cmd[2:])}", flush=True)
    figure(f"{name.rsplit('-', 1)[1]}: load average at its start", round(os.getloadavg()[0], 2))
    env = os.environ | {"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300"}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        print(done.stdout[-3000:], done.stderr[-3000:])
        raise SystemExit(f"{name} failed (exit {done.returncode})")
    return runs / name


def arm(name: str, args: argparse.Namespace, extra: list[str]) -> Path:
    """One arm's run folder: trained now, or with --report the run of that name as it stands
    (it must hold logged iterations)."""
    if not args.report:
        return train(name, args, extra)
    run_dir = args.runs / name
    if not any(run_dir.glob(f"iter_*/{LOGGED_MARK}")):
        raise SystemExit(f"--report: no logged iteration in {run_dir} (run the bench without it)")
    return run_dir


def per_iteration(run_dir: Path) -> list[dict[str, float]]:
    """Each logged iteration's metrics, in order, with `tokens` and `episodes` summed over all
    its rollout shards, refill rounds' included (the logged rollout/* count round 0 only)."""
    out = []
    for mark in sorted(run_dir.glob(f"iter_*/{LOGGED_MARK}")):
        metrics = json.loads(mark.read_text())["metrics"]
        records = mark.parent.glob("rollouts/*shard_*.json")  # round 0's and refill rounds'
        shards = [json.loads(p.read_text()) for p in records]
        metrics["tokens"] = float(sum(s["generated_tokens"] for s in shards))
        metrics["episodes"] = float(sum(s["episodes"] for s in shards))
        out.append(metrics)
    return out


def report(arm: str, run_dir: Path) -> dict[str, list[float]]:
    """Print and keep one arm's figures; returns its per-iteration tokens and seconds."""
    logged = per_iteration(run_dir)
    tokens = [m["tokens"] for m in logged]
    episodes = [m["episodes"] for m in logged]
    seconds = [round(sum(m.get(f"timing_s/{p}", 0.0) for p in PHASES), 1) for m in logged]
    from agent_core.run.run_record import held_out

    success = held_out(run_dir)
    print(f"== {arm} ({run_dir.name})")
    shown = {f"held-out {k}": v for k, v in success.items() if k in ("iter 0", "iter 4", "iter 8")}
    shown |= {
        "generated tokens per iteration": tokens,
        "episodes per iteration": episodes,
        "seconds per iteration": seconds,
    }
    for name, value in shown.items():  # a per-iteration list is kept as its mean
        kept = round(sum(value) / max(len(value), 1), 1) if isinstance(value, list) else value
        figure(f"{arm}: {name}" + (", mean" if isinstance(value, list) else ""), kept)
        print(f"  {name}: {value}")
    return {"tokens": tokens, "episodes": episodes, "seconds": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", choices=sorted(ENVS), default="choice")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--trees", type=int, default=2, help="tree arm's rollout.group_size")
    parser.add_argument("--expansions", type=int, default=8, help="rollout.tree.expansions")
    parser.add_argument(
        "--runs",
        type=Path,
        default=REPO / "runs",
        help="run.output_dir (--smoke: a new temporary folder, with its own MLflow database)",
    )
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    parser.add_argument(
        "--report", action="store_true", help="figures of the two runs in --runs; trains nothing"
    )
    add_record_option(parser)
    args = parser.parse_args()
    if args.report:
        sys.path.insert(0, str(REPO))  # the runs are only read: no model needed
    elif not prepare(args):
        return 0
    args.runs = Path(tempfile.mkdtemp(prefix="steprl-trees-")) if args.smoke else args.runs
    args.runs = args.runs.resolve()
    start = time.perf_counter()
    prefix = f"trees-{args.env}-s{args.seed}{'-smoke' if args.smoke else ''}"
    chain_dir = arm(f"{prefix}-chain", args, [])
    chain = report("chain", chain_dir)
    per_episode = sum(chain["tokens"]) / max(sum(chain["episodes"]), 1.0)
    # the chain's tokens per task less half a round of expansions (one episode per tree): the
    # budget is checked as a round starts, so a tree passes it by half a round on average
    budget = max(1, round(per_episode * (GROUP - args.trees / 2)))
    tree_settings = [
        f"model.path={chain_dir / 'checkpoints' / 'warmup'}",
        "warmup.enabled=false",
        "algorithm.estimator=tree_grpo",
        f"rollout.group_size={args.trees}",
        "rollout.tree.mode=budget",
        f"rollout.tree.expansions={args.expansions}",
        "rollout.tree.nodes_per_expansion=1",
        f"rollout.tree.token_budget={budget}",
    ]
    print(f"tree arm: token budget per task {figure('tree: token budget per task', budget)}")
    tree = report("tree", arm(f"{prefix}-tree", args, tree_settings))
    for what in ("tokens", "seconds"):
        ratio = figure(f"tree / chain: {what}", sum(tree[what]) / max(sum(chain[what]), 1e-9))
        print(f"tree / chain, {what} over the iterations: {ratio:.3f}")
    print(f"bench wall: {time.perf_counter() - start:.0f} s")
    write_record(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
