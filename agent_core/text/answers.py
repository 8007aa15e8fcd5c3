"""Final-answer extraction and comparison: numbers (with a tolerance) and text (exact or
normalised, SQuAD-style).
"""

from __future__ import annotations

import math
import re
import string
from typing import Literal

# `\s*\$?\s*` backtracked quadratically on long runs of spaces; the optional group does not.
ANSWER_RE = re.compile(r"Answer:\s*(?:\$\s*)?(-?[\d,]*\.?\d+)", re.IGNORECASE)
TEXT_ANSWER_RE = re.compile(r"Answer:[ \t]*([^\n]*)", re.IGNORECASE)
ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
MatchMode = Literal["exact", "normalized", "numeric"]


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


def extract_text_answer(text: str) -> str | None:
    """The rest of the line after the last 'Answer:' in `text` (stripped), or None when there
    is none or it is empty."""
    matches = TEXT_ANSWER_RE.findall(text)
    if not matches or not matches[-1].strip():
        return None
    return matches[-1].strip()


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (SQuAD's answer normalisation)."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return " ".join(ARTICLES_RE.sub(" ", text).split())


def answers_match(predicted: str | None, expected: object, mode: MatchMode, rel_tol: float) -> bool:
    """Whether an extracted answer equals the reference: 'exact' = the same text (stripped);
    'normalized' = the same after `normalize_answer`; 'numeric' = the same number within
    `rel_tol` (the first number of the answer; a reference that is no number never matches)."""
    if predicted is None or expected is None:
        return False
    if mode == "exact":
        return predicted.strip() == str(expected).strip()
    if mode == "normalized":
        return normalize_answer(predicted) == normalize_answer(str(expected))
    number = extract_number_answer(f"Answer: {predicted}")
    try:
        reference = float(str(expected).replace(",", ""))
    except ValueError:
        return False
    return number is not None and math.isclose(number, reference, rel_tol=rel_tol, abs_tol=1e-9)
