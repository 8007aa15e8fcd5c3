"""Final-answer extraction and comparison for tasks whose answer is a number."""

from __future__ import annotations

import math
import re

# `\s*\$?\s*` backtracked quadratically on long runs of spaces; the optional group does not.
ANSWER_RE = re.compile(r"Answer:\s*(?:\$\s*)?(-?[\d,]*\.?\d+)", re.IGNORECASE)


def extract_number_answer(text: str) -> float | None:
    """The number after the last 'Answer:' in `text`, or None when there is none."""
    matches = ANSWER_RE.findall(text)
    if not matches:
        return None
    try:
        return float(matches[-1].replace(",", ""))
    except ValueError:
        return None


def numbers_match(predicted: float | None, expected: float, rel_tol: float = 1e-6) -> bool:
    """Numeric equality with a small relative tolerance (answers may be rounded floats)."""
    if predicted is None:
        return False
    return math.isclose(predicted, float(expected), rel_tol=rel_tol, abs_tol=1e-6)
