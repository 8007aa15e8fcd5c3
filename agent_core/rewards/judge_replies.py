"""Scores read from a judge model's free-text reply: one score ('Score: 7', '7/10',
{"score": 0.7}) or a group's scores as JSON; anything unreadable is None, never an exception.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

_NUMBER = r"[-+]?\d+(?:\.\d+)?"
# 'Score: 7', '**score** = 7.5', 'score of 8/10', 'Rating: 3 out of 5'
_GAP = r"[^\w+-]"  # punctuation and spaces, but never a number's sign
_KEYWORD = re.compile(
    rf"(?:score|rating|grade){_GAP}{{0,4}}(?:is|of|=)?{_GAP}{{0,3}}({_NUMBER})"
    rf"(?:\s*(?:/|out of)\s*({_NUMBER}))?",
    re.IGNORECASE,
)
_FRACTION = re.compile(rf"({_NUMBER})\s*(?:/|out of)\s*({_NUMBER})", re.IGNORECASE)
_BARE = re.compile(rf"\s*\**\s*({_NUMBER})\s*\**\s*\.?\s*")
_SCORE_KEYS = ("score", "rating", "grade", "reward")
_ID_KEYS = ("id", "trajectory_id", "attempt", "index")
_LAST_INTEGER = re.compile(r"(\d+)\D*$")


def normalise(value: float, scale: float) -> float | None:
    """`value` out of `scale`, clamped into [0, 1]; None for NaN, inf or a scale <= 0."""
    if not (math.isfinite(value) and math.isfinite(scale)) or scale <= 0:
        return None
    return min(1.0, max(0.0, value / scale))


def json_values(text: str) -> Iterator[Any]:
    """Every JSON object or array embedded in `text` (in code fences or prose), in order;
    nested ones inside an object already yielded are not yielded again."""
    decoder = json.JSONDecoder()
    i = 0
    while i < len(text):
        if text[i] in "{[":
            try:
                value, end = decoder.raw_decode(text, i)
            except json.JSONDecodeError:
                i += 1
                continue
            yield value
            i = end
        else:
            i += 1


def _number(value: Any) -> float | None:
    """A JSON number, or a string holding one (not a bool)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _scored(item: Any) -> float | None:
    """The score of a JSON value: a number, or an object with a 'score' (or alike) key."""
    if isinstance(item, dict):
        for key in _SCORE_KEYS:
            if key in item:
                return _number(item[key])
        return None
    return _number(item)


def parse_score(reply: str, scale: float) -> float | None:
    """The score in [0, 1] a reply gives out of `scale` (a fraction's own denominator wins),
    or None when it holds none. The last JSON score, else the last 'score: x', else the last
    'x/y', else a reply that is only a number."""
    for value in reversed(list(json_values(reply))):
        if isinstance(value, dict) and (found := _scored(value)) is not None:
            return normalise(found, scale)
    for pattern in (_KEYWORD, _FRACTION):
        matches = pattern.findall(reply)
        if matches:
            value, denominator = matches[-1]
            return normalise(float(value), float(denominator) if denominator else scale)
    bare = _BARE.fullmatch(reply)
    return normalise(float(bare.group(1)), scale) if bare else None


def _group_entries(value: Any) -> list[Any] | dict[str, Any] | None:
    """The per-trajectory part of a relative reply: {"scores": [...]} -> the list; a list or
    an id -> score mapping as is."""
    if isinstance(value, dict) and isinstance(value.get("scores"), list | dict):
        return value["scores"]
    if isinstance(value, list | dict):
        return value
    return None


def _trajectory_number(key: Any) -> int | None:
    """The 1-based trajectory number an entry names: 2, "2", "Attempt 2", "#2"."""
    if isinstance(key, int | float) and not isinstance(key, bool):
        return int(key) if float(key).is_integer() else None
    if isinstance(key, str) and (match := _LAST_INTEGER.search(key)):
        return int(match.group(1))
    return None


def _by_id(entries: list[Any] | dict[str, Any], n: int) -> dict[int, float | None]:
    """Scores keyed by 1-based trajectory number, from entries that name their trajectory."""
    found: dict[int, float | None] = {}
    pairs: list[tuple[Any, Any]] = (
        list(entries.items())
        if isinstance(entries, dict)
        else [
            (next((e[k] for k in _ID_KEYS if k in e), None), e)
            for e in entries
            if isinstance(e, dict)
        ]
    )
    for key, item in pairs:
        number = _trajectory_number(key)
        if number is not None and 1 <= number <= n:
            found[number] = _scored(item)
    return found


def parse_group_scores(reply: str, n: int, scale: float) -> list[float | None]:
    """The scores in [0, 1] of trajectories 1..n from a relative judge's JSON reply: entries
    naming their trajectory ({"id": 2, "score": 7}, or {"2": 7}) go where they say, in any
    order; a bare list of n scores goes in order. A trajectory with no readable score is None."""
    for value in reversed(list(json_values(reply))):
        entries = _group_entries(value)
        if not entries:
            continue
        if isinstance(entries, list) and all(not isinstance(e, dict) for e in entries):
            if len(entries) != n:
                continue  # a positional list of the wrong length cannot be attributed
            raw = [_scored(e) for e in entries]
        else:
            found = _by_id(entries, n)
            if not found:
                continue
            raw = [found.get(i) for i in range(1, n + 1)]
        return [None if r is None else normalise(r, scale) for r in raw]
    return [None] * n
