"""A full fine-tuning checkpoint holds its weights once: the HF folder has them (fp32), the
DeepSpeed state only the optimizer's; a trainer built from the folder resumes exactly (same
weights, the same next update as the trainer that saved it), value head included."""

from __future__ import annotations

from pathlib import Path

import torch

from agent_core.config.load import load_config
from agent_core.run import trainers
from tests.integration.test_lora import rows


def test_full_checkpoint_stores_weights_once_and_resumes_exactly(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    cfg = load_config(
        "smoke",
        [f"model.path={tiny_model_dir}", "trainer.learning_rate=1e-2", "trainer.value_head=true"],
    )
    trainer = trainers.build_trainer(cfg, tiny_model_dir, None)
    trainer.update(rows(), iteration=1)
    folder = tmp_path / "ck"
    trainer.save(folder, {"iteration": 1})
    assert all(p.requires_grad for p in trainer.engine.module.parameters())  # restored
    (states,) = (folder / "deepspeed").rglob("mp_rank_00_model_states.pt")
    saved = torch.load(states, weights_only=False)
    # only the output embedding, tied to the input one (DeepSpeed knows it by the input's name)
    assert [k for k in saved["module"] if k.endswith("weight")] == ["lm.lm_head.weight"]
    assert saved["optimizer"]["state"], "no optimizer state saved"
    resumed = trainers.build_trainer(cfg, folder, None)
    mine, theirs = trainer.engine.module.state_dict(), resumed.engine.module.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    a, b = trainer.update(rows(), iteration=2), resumed.update(rows(), iteration=2)
    assert a.policy_loss == b.policy_loss
    mine, theirs = trainer.engine.module.state_dict(), resumed.engine.module.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine), "optimizer state not restored"
