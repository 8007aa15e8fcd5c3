"""The base of every config section: a strict pydantic model (unknown keys are errors, assignments
are validated, floats are finite, types are not coerced)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are validated,
    every float must be finite (NaN or inf in a weight or a rate would train on garbage), and
    types are strict (`true` is no count, '3' no number; an integer is a float)."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, allow_inf_nan=False, strict=True
    )
