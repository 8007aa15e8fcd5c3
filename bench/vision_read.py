"""Can the built VLM read a grid board, and does a short supervised fine-tune teach it the move?
Two probes on a grid game's boards, training and held-out seeds apart:
`cells`: a linear classifier on the frozen vision encoder's per-patch features (no language
model) of each task's first board, held-out per-cell accuracy, at the patch embedding and at
the encoder's output;
`moves`: the policy fine-tuned on the solver's move (prompts as the env renders them, the board
as an image or, with --board text, as the text twin's symbol grid; encoder frozen, projector and
language model trained as the warm-up trains them), held-out accuracy of its most likely move
(any first move of a shortest win counts) against the best constant move on the same states.
Run: .venv/bin/python bench/vision_read.py --probe cells | --probe moves [--board text]
(cells: about a minute; moves: tens of minutes on 2 cores); --smoke: a tiny VLM, both probes.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

from offline import REPO, add_record_option, figure, prepare, write_record

MOVES = ("Left", "Down", "Right", "Up")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--probe", choices=("cells", "moves"), default="cells")
    parser.add_argument("--env", default="frozenlake_image", help="an image grid game")
    parser.add_argument("--board", choices=("image", "text"), default="image")
    parser.add_argument("--model", type=Path, default=REPO / ".models" / "SmolLM2-135M-VLM")
    parser.add_argument("--train-tasks", type=int, default=64, help="solver episodes to learn")
    parser.add_argument("--heldout-tasks", type=int, default=24, help="held-out solver episodes")
    parser.add_argument("--steps", type=int, default=13, help="moves: optimizer steps")
    parser.add_argument("--batch", type=int, default=16, help="moves: rows per step")
    parser.add_argument("--lr", type=float, default=5e-5, help="moves: language model's rate")
    parser.add_argument("--projector-lr", type=float, default=5e-5, help="moves: projector's")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--smoke", action="store_true", help="a tiny random VLM, tiny sizes")
    add_record_option(parser)
    args = parser.parse_args()
    if args.smoke:
        args.train_tasks, args.heldout_tasks, args.steps, args.batch = 4, 2, 2, 2
    return args


def smoke_vlm() -> Path:
    """The tiny random VLM of the tests, built once into the temp folder."""
    from agent_core.models import build_tiny_vlm

    return build_tiny_vlm(Path(tempfile.gettempdir()) / "steprl-bench-tiny-vlm")


def solver_states(env_name: str, board: str, seeds: range) -> list[tuple]:
    """(observation, solver reply, the moves that start a shortest win) at every step of the
    solver's episode on each seed; `board` text plays the image env's text twin."""
    from agent_core.core.records import Action
    from agent_core.envs import env_class

    cls = env_class(env_name.removesuffix("_image") if board == "text" else env_name)
    states = []
    for seed in seeds:
        env = cls(max_steps=8)
        obs = env.reset(cls.make_task(seed))
        while obs is not None and env.game.solution():
            game, reply = env.game, env.solve_step()
            best = {m for m in MOVES if _starts_a_win(game, m)}
            states.append((obs, reply, best))
            obs = env.step(Action(reply)).observation
    return states


def _starts_a_win(game, move: str) -> bool:
    after = game.move(move)
    return after.success or (not after.done and len(after.solution()) == len(game.solution()) - 1)


def cells_probe(args: argparse.Namespace, model, processor) -> None:
    """Held-out per-cell accuracy of a linear classifier on the encoder's patch features."""
    import torch

    from agent_core.envs import env_class

    cls = env_class(args.env)

    def boards(seeds: range) -> tuple[torch.Tensor, torch.Tensor, list]:
        images, kinds = [], []
        for seed in seeds:
            env = cls(max_steps=8)
            env.reset(cls.make_task(seed))
            images.append(_frame(env))
            kinds.extend(kind for row in _drawn_cells(env, images[-1]) for kind in row)
        pixels = processor.image_processor(images=images, return_tensors="pt")["pixel_values"]
        return pixels, kinds, images

    train_pix, train_kinds, _ = boards(range(args.train_tasks * 4))
    test_pix, test_kinds, _ = boards(range(100_000, 100_000 + args.heldout_tasks * 4))
    names = sorted(set(train_kinds) | set(test_kinds))
    tower = model.model.vision_tower
    with torch.no_grad():
        hidden_train = tower(train_pix, output_hidden_states=True).hidden_states
        hidden_test = tower(test_pix, output_hidden_states=True).hidden_states
    y_train = torch.tensor([names.index(k) for k in train_kinds])
    y_test = torch.tensor([names.index(k) for k in test_kinds])
    for layer, label in ((0, "patch embedding"), (-1, "encoder output")):
        width = hidden_train[layer].shape[-1]
        acc = _linear_probe(
            hidden_train[layer].reshape(-1, width), y_train, hidden_test[layer].reshape(-1, width)
        )
        acc = float((acc == y_test).float().mean())
        print(f"held-out cell accuracy, linear probe on the {label}: {acc:.3f}")
        figure(f"held-out cell accuracy, {label}", acc)
    majority = max(test_kinds.count(k) for k in names) / len(test_kinds)
    print(f"the most common cell kind alone: {figure('most common kind alone', majority):.3f}")
    figure("boards train / held-out", f"{len(train_pix)} / {len(test_pix)}")


def _drawn_cells(env, image) -> list[list[str]]:
    """The cell kinds the image shows, row by row: all of the board's, or those inside its
    outer wall when the image leaves the wall out (sokoban_image)."""
    cells, drawn = env.game.cells(), image.height // env.cell_px
    if len(cells) == drawn + 2:
        cells = [row[1:-1] for row in cells[1:-1]]
    if len(cells) != drawn:
        raise SystemExit(f"{env.name}: its image does not show one cell per {env.cell_px} px")
    return cells


def _frame(env):
    from agent_core.core.images import message_images

    return message_images(env.observe().messages)[-1]


def _linear_probe(x_train, y_train, x_test, steps: int = 300):
    """Fit a softmax classifier on standardised features; its predictions on `x_test`."""
    import torch

    mean, std = x_train.mean(0), x_train.std(0) + 1e-6
    head = torch.nn.Linear(x_train.shape[1], int(y_train.max()) + 1)
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(head((x_train - mean) / std), y_train).backward()
        optimizer.step()
    with torch.no_grad():
        return head((x_test - mean) / std).argmax(-1)


def encode(renderer, tokenizer, states: list[tuple]):
    """Padded batch of prompt + solver reply, labels on the reply, each row's image list and
    the position whose logits predict the move."""
    import torch

    ids, labels, images, at = [], [], [], []
    for obs, reply, _ in states:
        prompt = renderer.encode(obs)
        # the reply's opening tag, then the move: the logits there pick the move
        before = tokenizer.encode(reply.split(">", 1)[0] + ">", add_special_tokens=False)
        reply_ids = tokenizer.encode(reply + tokenizer.eos_token, add_special_tokens=False)
        ids.append(prompt + reply_ids)
        labels.append([-100] * len(prompt) + reply_ids)
        images.append(renderer.images(obs))
        at.append(len(prompt) + len(before) - 1)
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id or 0
    mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids])
    ids = torch.tensor([i + [pad] * (width - len(i)) for i in ids])
    labels = torch.tensor([x + [-100] * (width - len(x)) for x in labels])
    return ids, mask, labels, images, at


def pixel_inputs(processor, images: list[list]) -> dict:
    from agent_core.prompting.vision import vision_inputs

    return vision_inputs(processor, "llava", images)


def move_accuracy(
    model, renderer, processor, states, move_ids: list[int], chunk: int = 8
) -> tuple[float, dict[str, int]]:
    """Share of held-out states whose most likely move (of the four) starts a shortest win
    (`chunk` states a forward: a whole vocabulary's logits per token add up fast)."""
    import torch

    picks = []
    for first in range(0, len(states), chunk):
        part = states[first : first + chunk]
        ids, mask, _, images, at = encode(renderer, processor.tokenizer, part)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(
                input_ids=ids, attention_mask=mask, **pixel_inputs(processor, images)
            ).logits
        picks += [MOVES[int(logits[i, at[i], move_ids].argmax())] for i in range(len(part))]
    right = sum(pick in best for pick, (_, _, best) in zip(picks, states, strict=True))
    return right / len(states), {m: picks.count(m) for m in MOVES}


def moves_probe(args: argparse.Namespace, model, processor) -> None:
    """Fine-tune on the solver's moves; held-out move accuracy before, halfway and after."""
    import torch

    from agent_core.prompting.renderer import PromptRenderer

    tokenizer = processor.tokenizer
    renderer = PromptRenderer(tokenizer, "none", processor)
    train = solver_states(args.env, args.board, range(args.train_tasks))
    test = solver_states(args.env, args.board, range(100_000, 100_000 + args.heldout_tasks))
    move_ids = [tokenizer.encode(m, add_special_tokens=False)[0] for m in MOVES]
    constant = {m: sum(m in best for _, _, best in test) / len(test) for m in MOVES}
    best = max(MOVES, key=constant.get)
    figure("best constant move", f"{constant[best]:.3f} ({best})")
    figure("rows train / held-out", f"{len(train)} / {len(test)}")
    print(f"{len(train)} train rows, {len(test)} held-out; constant {best}: {constant[best]:.3f}")
    for param in model.model.vision_tower.parameters():
        param.requires_grad_(False)
    projector = list(model.model.multi_modal_projector.parameters())
    chosen = {id(p) for p in projector}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in chosen]
    optimizer = torch.optim.AdamW(
        [{"params": projector, "lr": args.projector_lr}, {"params": rest, "lr": args.lr}],
        weight_decay=0.0,
    )
    rng = random.Random(0)
    acc, picks = move_accuracy(model, renderer, processor, test, move_ids)
    print(f"step 0: held-out move accuracy {acc:.3f} {picks}")
    figure("held-out move accuracy, step 0", acc)
    for step in range(1, args.steps + 1):
        rows = rng.sample(train, args.batch)
        optimizer.zero_grad()
        for first in range(0, len(rows), 4):  # micro-batches of 4: a row's activations are big
            part = rows[first : first + 4]
            ids, mask, labels, images, _ = encode(renderer, tokenizer, part)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(
                    input_ids=ids,
                    attention_mask=mask,
                    labels=labels,
                    **pixel_inputs(processor, images),
                ).loss
            (loss * len(part) / len(rows)).backward()
        optimizer.step()
        if step in (args.steps // 2, args.steps) and step:
            acc, picks = move_accuracy(model, renderer, processor, test, move_ids)
            print(f"step {step}: loss {loss.item():.3f}, held-out move accuracy {acc:.3f} {picks}")
            figure(f"held-out move accuracy, step {step}", acc)
            figure(f"picks, step {step}", ", ".join(f"{m} {n}" for m, n in picks.items()))


def main() -> None:
    args = parse_args()
    if not prepare(args):
        return
    if args.smoke:
        args.model = smoke_vlm()
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    torch.manual_seed(0)
    processor = AutoProcessor.from_pretrained(args.model)
    model = AutoModelForImageTextToText.from_pretrained(args.model, dtype=torch.float32)
    print(f"{args.env}, board as {args.board}, model {args.model.name}")
    for probe in ("cells", "moves") if args.smoke else (args.probe,):
        (cells_probe if probe == "cells" else moves_probe)(args, model, processor)
    label = f"{args.probe}, {args.env}" + (f", {args.board} board" if args.probe == "moves" else "")
    write_record(args, label="" if args.smoke else label)


if __name__ == "__main__":
    main()
