"""`PolicyTrainer`: one run's policy update in this process, composed of its roles: the
DeepSpeed engine (`engine`), the reference model (`reference`), the no-grad forwards
(`forwards`), the RL loss (`policy_loss`), the supervised losses (`supervised`) and the update
loop over them (`rl_update`). Its methods are what the run and a `TrainerGroup`'s ranks call.
"""

from __future__ import annotations

from pathlib import Path

import torch

from agent_core.trainer.batching import TrainRow
from agent_core.trainer.engine import TrainEngine
from agent_core.trainer.forwards import NoGradForwards
from agent_core.trainer.policy_loss import PolicyLoss
from agent_core.trainer.reference import ReferenceModel
from agent_core.trainer.rl_update import RLUpdate
from agent_core.trainer.supervised import SupervisedLoss
from agent_core.trainer.update_metrics import UpdateMetrics
from configs.trainer import TrainerSection


class PolicyTrainer:
    """The policy, its optimizer and its losses for one run (built once per process, reused
    across iterations)."""

    def __init__(
        self,
        model_path: str | Path,
        cfg: TrainerSection,
        temperature: float,
        seed: int,
        reference_path: str | Path | None = None,
        roles: dict[str, str] | None = None,
    ) -> None:
        """`roles`: a team's env.roles; each adapter role trains an adapter of its own."""
        self.train_engine = TrainEngine(model_path, cfg, seed, roles)
        self.reference = ReferenceModel(reference_path, self.train_engine)
        self.forwards = NoGradForwards(self.train_engine, self.reference, temperature)
        self.policy_loss = PolicyLoss(self.train_engine, self.reference, cfg, temperature)
        self.supervised = SupervisedLoss(self.train_engine, cfg, seed)
        self.rl_update = RLUpdate(
            self.train_engine, cfg, seed, self.policy_loss, self.supervised, self.forwards
        )

    @property
    def cfg(self) -> TrainerSection:
        """The trainer section the roles read."""
        return self.train_engine.cfg

    @cfg.setter
    def cfg(self, cfg: TrainerSection) -> None:
        # a setting changed between updates (a loss term, its aggregation) reaches every role
        for role in (self.train_engine, self.policy_loss, self.supervised, self.rl_update):
            role.cfg = cfg

    @property
    def engine(self):
        """DeepSpeed's engine (its `module` is the `PolicyModule`, its `optimizer` AdamW)."""
        return self.train_engine.engine

    @property
    def tokenizer(self):
        """The policy's tokenizer."""
        return self.train_engine.tokenizer

    @property
    def rank(self) -> int:
        """This process's rank in the trainer's group."""
        return self.train_engine.rank

    def update(
        self,
        rows: list[TrainRow],
        iteration: int,
        epochs: int | None = None,
        demonstrations: list[TrainRow] | None = None,
    ) -> UpdateMetrics:
        """One RL update over `rows` (`RLUpdate.update`)."""
        return self.rl_update.update(rows, iteration, epochs, demonstrations)

    def sft_update(
        self, rows: list[TrainRow], epochs: int, learning_rate: float, only: tuple[str, ...] = ()
    ) -> UpdateMetrics:
        """The supervised warm-up over demonstration rows (`RLUpdate.sft_update`)."""
        return self.rl_update.sft_update(rows, epochs, learning_rate, only)

    def step_values(self, rows: list[TrainRow]) -> list[float]:
        """The value head's estimate at each row's last prompt token."""
        return self.forwards.step_values(rows)

    def log_ratios(self, rows: list[TrainRow]) -> list[float]:
        """Per row: log pi(response) now minus its `old_logprobs`, summed over its tokens."""
        return self.forwards.log_ratios(rows)

    def reference_kl(self, rows: list[TrainRow]) -> list[float]:
        """Per row: the k1 KL of the sampling policy to the reference (KL-in-reward)."""
        return self.forwards.reference_kl(rows)

    def stop(self) -> None:
        """Nothing to stop: an in-process trainer holds no other process (a `TrainerGroup`'s
        ranks do); its memory goes with its last reference."""

    def lm_state_dict(self) -> dict[str, torch.Tensor]:
        """Full (gathered) LM weights (`TrainEngine.lm_state_dict`)."""
        return self.train_engine.lm_state_dict()

    def save(self, checkpoint_dir: Path, metadata: dict, on_half_written=None) -> Path:
        """Write checkpoint `checkpoint_dir` (every rank calls this; see `save_checkpoint`)."""
        return self.train_engine.save(checkpoint_dir, metadata, on_half_written)

    def load_state(self, checkpoint_dir: Path) -> bool:
        """Restore optimizer + weights from a checkpoint's DeepSpeed state (`TrainEngine`)."""
        return self.train_engine.load_state(checkpoint_dir)
