"""docs/configuration.md is what `python -m configs.reference` prints, and every config field it
documents has a description (the reference is generated from them)."""

from __future__ import annotations

import inspect
import re

from pydantic import BaseModel

from configs import reference
from configs.run_config import RunConfig
from configs.trainer import TRAINER_GROUPS, TrainerSection


def _models(model: type[BaseModel]) -> list[type[BaseModel]]:
    """`model` and every config model nested in its fields, each once."""
    found = [model]
    for field in model.model_fields.values():
        for nested in reference.nested_models(field.annotation)[0]:
            found += [m for m in _models(nested) if m not in found]
    return found


def test_configuration_doc_is_current() -> None:
    written = reference.DOC_PATH.read_text() if reference.DOC_PATH.exists() else ""
    assert written == reference.render(), (
        "docs/configuration.md differs from the config's descriptions: "
        "run `python -m configs.reference --write` and commit the result"
    )


def test_every_field_has_a_description() -> None:
    missing = [
        f"{model.__name__}.{name}"
        for model in _models(RunConfig)
        for name, field in model.model_fields.items()
        if not (field.description or "").strip()
    ]
    assert missing == [], f"fields without a description: {missing}"


def test_nested_sections_are_documented() -> None:
    names = {model.__name__ for model in _models(RunConfig)}
    assert {"LoraSection", "VLLMEngineSection", "JudgeTerm", "TaskSplit"} <= names
    text = reference.render()
    for key in ("rollout.vllm.port", "trainer.lora.r", "reward.terms[].rubric", "env.tasks.train"):
        assert f"| `{key}` |" in text


def test_trainer_groups_hold_every_field_once_in_order() -> None:
    grouped = [name for names in TRAINER_GROUPS.values() for name in names]
    assert grouped == list(TrainerSection.model_fields)
    # the comment block opening each group in the class names the same groups, in order
    opened = re.findall(r"^    # --- (.+) ---$", inspect.getsource(TrainerSection), re.M)
    assert opened == list(TRAINER_GROUPS)
