"""The warm-up's alignment stage for a VLM (LLaVA's stage 1, on the env's own images): before
the demonstrations, the projector alone learns to write out what each image shows.

The env names what its images hold (`image_caption`: a grid game's board in its text twin's
symbols); the solver walks `warmup.align_tasks` training tasks and every board it passes becomes
a row: the image and a fixed question as the prompt, the caption as the reply. Only the
projector trains, at its own learning rate, for `warmup.align_epochs` passes; the language
model and the vision encoder keep their weights. A random projector gives the language model
nothing it can read; demonstrations of one move token a board leave it so.
"""

from __future__ import annotations

import logging
import math

from PIL import Image

from agent_core.collect.iteration_tasks import train_tasks
from agent_core.core.images import image_part, message_images, text_part
from agent_core.core.records import Action, Observation, Task
from agent_core.envs import env_factory
from agent_core.models import load_processor
from agent_core.prompting.renderer import PromptRenderer
from agent_core.run.evaluate import eval_tasks
from agent_core.trainer.batching import TrainRow
from agent_core.trainer.policy_module import PROJECTORS
from configs.run_config import RunConfig

log = logging.getLogger(__name__)
ALIGN_STREAM = -2  # seed stream of alignment tasks, apart from the demonstrations' (-1)
QUESTION = "What does the image show? Write it out."
HELDOUT_TASKS = 16  # held-out tasks whose boards the stage's before/after figure reads


def shows_images(cfg: RunConfig, task: Task) -> bool:
    """Whether the env's first observation of `task` shows an image."""
    return bool(message_images(env_factory(cfg.env)().start_episode(task, cfg.run.seed).messages))


def captions(cfg: RunConfig, tasks: list[Task]) -> list[tuple[Image.Image, str]]:
    """(image, caption) of every board the env's solver shows on `tasks`: each task's
    first observation, then one after each solver move until the episode ends."""
    pairs = []
    for task in tasks:
        env = env_factory(cfg.env)()
        obs = env.start_episode(task, cfg.run.seed)
        while obs is not None:
            pairs.append((_newest_image(env, obs), _caption(env)))
            reply = env.solve_step()
            if reply is None:
                break
            obs = env.step(Action(reply)).observation
    return pairs


def _newest_image(env, obs: Observation) -> Image.Image:
    shown = message_images(obs.messages)
    if not shown:
        raise ValueError(
            f"warmup.align_tasks: env {env.name!r} shows no image in its observations; the "
            "alignment stage is for image envs: set warmup.align_tasks=0"
        )
    return shown[-1]


def _caption(env) -> str:
    caption = env.image_caption()
    if not caption:
        raise ValueError(
            f"warmup.align_tasks: env {env.name!r} gives no image_caption() for its images; "
            "define it (what the newest image shows, as text) or set warmup.align_tasks=0"
        )
    return caption


def caption_rows(cfg: RunConfig, tokenizer, pairs: list[tuple[Image.Image, str]]) -> list[TrainRow]:
    """Training rows of (image, caption) pairs: the image and `QUESTION` as a user message,
    rendered with the model folder's processor and chat template; the caption, then the end
    of turn, as the reply."""
    renderer = PromptRenderer(tokenizer, cfg.env.tool_prompt, load_processor(cfg.model.path))
    rows = []
    for index, (image, caption) in enumerate(pairs):
        message = {"role": "user", "content": [image_part(image), text_part(QUESTION)]}
        reply = [*tokenizer.encode(caption, add_special_tokens=False), tokenizer.eos_token_id]
        rows.append(
            TrainRow(
                renderer.encode(Observation([message])),
                reply,
                [0.0] * len(reply),
                0.0,
                trajectory_id=f"align-{index}",
                images=(image,),
            )
        )
    return rows


def caption_token_prob(trainer, rows: list[TrainRow]) -> float:
    """The policy's mean probability per caption token on `rows` (the geometric mean of a
    row's token probabilities, averaged over rows)."""
    sums = trainer.log_ratios(rows)
    return sum(math.exp(s / len(r.response_ids)) for s, r in zip(sums, rows, strict=True)) / len(
        rows
    )


def align(cfg: RunConfig, trainer) -> dict[str, float]:
    """The stage on `trainer`: the projector trained on the captions of the solver's boards
    on training tasks, with the caption-token probability on held-out boards before and
    after. A no-op returning {} when warmup.align_tasks is 0 or the env shows no image (the
    text twin of an image game, run with the same preset)."""
    warm = cfg.warmup
    tasks = train_tasks(cfg, ALIGN_STREAM, warm.align_tasks) if warm.align_tasks else []
    if not tasks or not shows_images(cfg, tasks[0]):
        if tasks:
            log.info("warmup.align_tasks: env %s shows no image: no alignment", cfg.env.name)
        return {}
    pairs = captions(cfg, tasks)  # an env whose images have no caption stops here
    rows = caption_rows(cfg, trainer.tokenizer, pairs)
    heldout = caption_rows(cfg, trainer.tokenizer, captions(cfg, eval_tasks(cfg)[:HELDOUT_TASKS]))
    figures = {"caption_token_prob_base": caption_token_prob(trainer, heldout)} if heldout else {}
    metrics = trainer.sft_update(rows, warm.align_epochs, warm.align_learning_rate, PROJECTORS)
    if heldout:  # none when the run holds no task out (a task file without held-out rows)
        figures["caption_token_prob"] = caption_token_prob(trainer, heldout)
    return figures | {
        "rows": float(len(rows)),
        "optimizer_steps": float(metrics.optimizer_steps),
        "seconds": float(metrics.seconds),
    }
