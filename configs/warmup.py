"""The `warmup` section: an optional supervised cold start on demonstrations (the env's solver
or a file of steps) before the first RL iteration."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from configs.base import Section


class WarmupSection(Section):
    """Optional supervised cold start before RL: fine-tune on demonstrations first."""

    enabled: bool = Field(
        False, description="Run the warm-up once at the start of the run (before iteration 1)."
    )
    source: Literal["solver", "file"] = Field(
        "solver",
        description="'solver' = demonstrations played by the env's own solver (solve_step) on "
        "training seeds, the episodes its keep_demonstration keeps (by default the successful "
        "ones); 'file' = a Parquet/JSONL of steps with prompt_ids and response_ids "
        "(e.g. a run's steps.parquet; rows with success=false are skipped).",
    )
    path: str | None = Field(None, description="The demonstrations file when source='file'.")
    tasks: int = Field(64, ge=1, description="Solver demonstration episodes (training seeds).")
    epochs: int = Field(2, ge=1, description="Passes over the demonstrations.")
    learning_rate: float = Field(1e-5, gt=0.0, description="AdamW learning rate of the warm-up.")
    align_tasks: int = Field(
        0,
        ge=0,
        description="A VLM's alignment stage before the demonstrations (LLaVA's stage 1 on the "
        "env's own images): the env's solver walks this many training tasks and the projector "
        "alone learns to write out each board it shows (the env's image_caption()), the "
        "language model and vision encoder untouched. A built VLM's random projector gives "
        "the language model nothing it can read, and one move token a board does not teach it "
        "to. An env whose images have no image_caption() is refused with the fix; one that "
        "shows no image (a game's text twin) skips the stage. Needs trainer.zero_stage 0. "
        "0 = off.",
    )
    align_epochs: int = Field(4, ge=1, description="Passes over the alignment stage's captions.")
    align_learning_rate: float = Field(
        1e-3,
        gt=0.0,
        description="AdamW learning rate of the alignment stage (the projector alone, from "
        "random: LLaVA's stage 1 uses 1e-3).",
    )
    heldout_episodes: int = Field(
        16,
        ge=0,
        description="Held-out tasks (the first eval tasks) on which the solver also plays, so "
        "that the warm-up reports how likely its policy is to sample the solver's replies on "
        "tasks it never saw, before and after it trains (warmup/heldout_* metrics and a "
        "console line; a warning when the warm-up lowered it): per step, and for a whole "
        "episode, where the per-step figure compounds over the horizon. Costs two no-grad "
        "forwards over these episodes' steps; solver warm-ups only; 0 = off.",
    )
    keep_optimizer_state: bool = Field(
        True,
        description="Whether RL goes on with the warm-up's AdamW moments (true, the default) or "
        "starts from the warm-up's weights with fresh ones (false, as RL after a separate SFT "
        "job in verl or TRL). Carried moments keep pushing toward the demonstrations in RL's "
        "first steps; fresh ones make those steps lr-sized on every weight whatever its "
        "gradient, which trainer.lr_warmup_steps ramps up (learn_general: fresh, with 10).",
    )
