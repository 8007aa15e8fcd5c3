"""The code env's generated task set: small string and list functions, each with a reference
solution that computes the expected values of 3-5 hidden tests drawn from a seed.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Args = tuple[Any, ...]


@dataclass(frozen=True)
class CodeProblem:
    """One function to write: its signature, what it does, a reference and an input drawer."""

    function: str
    signature: str
    does: str
    reference: str  # source of a correct solution (the env's solver; computes expected values)
    draw: Callable[[random.Random], Args]


def _word(r: random.Random) -> str:
    return "".join(r.choice(string.ascii_lowercase) for _ in range(r.randint(2, 7)))


def _sentence(r: random.Random) -> tuple[str]:
    return (" ".join(_word(r) for _ in range(r.randint(2, 6))),)


def _palindrome(r: random.Random) -> tuple[str]:
    half = _word(r)
    text = half + half[::-1] if r.random() < 0.5 else _word(r) + _word(r)
    return ("".join(c.upper() if r.random() < 0.3 else c for c in text),)


def _ints(r: random.Random) -> tuple[list[int]]:
    return ([r.randint(-20, 40) for _ in range(r.randint(3, 9))],)


def _ints_and_k(r: random.Random) -> tuple[list[int], int]:
    return _ints(r)[0], r.randint(0, 12)


def _repeats(r: random.Random) -> tuple[list[int]]:
    return ([r.randint(0, 6) for _ in range(r.randint(4, 10))],)


STANDALONE: tuple[CodeProblem, ...] = (
    CodeProblem(
        "reverse_words",
        "reverse_words(s: str) -> str",
        "returns the words of s (separated by single spaces) in reverse order, joined by spaces",
        "def reverse_words(s):\n    return ' '.join(reversed(s.split(' ')))",
        _sentence,
    ),
    CodeProblem(
        "is_palindrome",
        "is_palindrome(s: str) -> bool",
        "returns True when s reads the same backwards, ignoring case",
        "def is_palindrome(s):\n    return s.lower() == s.lower()[::-1]",
        _palindrome,
    ),
    CodeProblem(
        "capitalize_words",
        "capitalize_words(s: str) -> str",
        "returns s with the first letter of every space-separated word upper-cased",
        "def capitalize_words(s):\n"
        "    return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))",
        _sentence,
    ),
    CodeProblem(
        "dedupe",
        "dedupe(xs: list[int]) -> list[int]",
        "returns xs without repeated values, keeping the first occurrence of each, in order",
        "def dedupe(xs):\n    return list(dict.fromkeys(xs))",
        _repeats,
    ),
    CodeProblem(
        "running_sum",
        "running_sum(xs: list[int]) -> list[int]",
        "returns the list whose i-th item is the sum of xs[0] .. xs[i]",
        "def running_sum(xs):\n    out, total = [], 0\n    for x in xs:\n        total += x\n"
        "        out.append(total)\n    return out",
        _ints,
    ),
    CodeProblem(
        "rotate_left",
        "rotate_left(xs: list[int], k: int) -> list[int]",
        "returns xs rotated left by k places (k may exceed the length; [] stays [])",
        "def rotate_left(xs, k):\n    if not xs:\n        return []\n    k %= len(xs)\n"
        "    return xs[k:] + xs[:k]",
        _ints_and_k,
    ),
    CodeProblem(
        "max_gap",
        "max_gap(xs: list[int]) -> int",
        "returns the largest absolute difference between two neighbouring items of xs",
        "def max_gap(xs):\n    return max(abs(a - b) for a, b in zip(xs, xs[1:]))",
        _ints,
    ),
    CodeProblem(
        "longest_word",
        "longest_word(s: str) -> str",
        "returns the longest space-separated word of s (the first one on a tie)",
        "def longest_word(s):\n    return max(s.split(' '), key=len)",
        _sentence,
    ),
)

# Three families of functions built from parts: an operation on the items of a class. Each
# part appears in several functions, so a function held out of training (HELD_OUT) is a new
# combination of parts that training shows in other combinations.
NUMBER_FILTERS: dict[str, tuple[str, str]] = {  # name: (what the numbers are, the test on x)
    "evens": ("even", "x % 2 == 0"),
    "odds": ("odd", "x % 2 != 0"),
    "positives": ("positive (> 0)", "x > 0"),
    "negatives": ("negative (< 0)", "x < 0"),
}
NUMBER_MAPS: dict[str, tuple[str, str]] = {  # name: (what happens to x, the expression)
    "double": ("doubled", "2 * x"),
    "square": ("squared", "x * x"),
    "negate": ("negated", "-x"),
    "increment": ("increased by one", "x + 1"),
}
CHAR_CLASSES: dict[str, tuple[str, str]] = {  # name: (what the characters are, the test on c)
    "vowels": ("vowels (a, e, i, o, u, in either case)", "c in 'aeiouAEIOU'"),
    "digits": ("digits (0-9)", "c.isdigit()"),
    "uppercase": ("upper-case letters", "c.isupper()"),
    "spaces": ("spaces", "c == ' '"),
}


def _mixed(sample: Callable[[random.Random], Any], var: str, test: str) -> Callable:
    """A drawer of one argument from `sample` (a list or a string) that holds at least one
    item passing `test` (on the item named `var`) and one failing it, so that no test has a
    trivial answer."""
    check = eval(f"lambda {var}: {test}")  # trusted: the test strings above

    def draw(r: random.Random) -> Args:
        while True:
            items = sample(r)
            if any(map(check, items)) and not all(map(check, items)):
                return (items,)

    return draw


def _numbers(r: random.Random) -> list[int]:
    return [r.randint(-20, 40) for _ in range(r.randint(4, 9))]


def _text(r: random.Random) -> str:
    alphabet = string.ascii_lowercase * 2 + string.ascii_uppercase + string.digits + "   "
    return "".join(r.choice(alphabet) for _ in range(r.randint(6, 14)))


def _families() -> tuple[CodeProblem, ...]:
    problems = []
    for m, (verb, expr) in NUMBER_MAPS.items():
        for f, (kind, test) in NUMBER_FILTERS.items():
            name = f"{m}_{f}"
            problems.append(
                CodeProblem(
                    name,
                    f"{name}(xs: list[int]) -> list[int]",
                    f"returns a list of the {kind} numbers of xs, each {verb}, in their order "
                    "(the other numbers are dropped)",
                    f"def {name}(xs):\n    return [{expr} for x in xs if {test}]",
                    _mixed(_numbers, "x", test),
                )
            )
    for f, (kind, test) in NUMBER_FILTERS.items():
        for name, does, body in (
            (f"sum_of_{f}", f"returns the sum of the {kind} numbers in xs", "sum(x for x"),
            (f"count_{f}", f"returns how many numbers in xs are {kind}", "sum(1 for x"),
        ):
            problems.append(
                CodeProblem(
                    name,
                    f"{name}(xs: list[int]) -> int",
                    does,
                    f"def {name}(xs):\n    return {body} in xs if {test})",
                    _mixed(_numbers, "x", test),
                )
            )
    for c, (kind, test) in CHAR_CLASSES.items():
        for name, returns, does, body in (
            (
                f"count_{c}",
                "int",
                f"returns how many characters of s are {kind}",
                f"sum(1 for c in s if {test})",
            ),
            (
                f"remove_{c}",
                "str",
                f"returns s with all its {kind} removed",
                f"''.join(c for c in s if not ({test}))",
            ),
            (
                f"keep_{c}",
                "str",
                f"returns only the {kind} of s, in their order, as one string",
                f"''.join(c for c in s if {test})",
            ),
        ):
            problems.append(
                CodeProblem(
                    name,
                    f"{name}(s: str) -> {returns}",
                    does,
                    f"def {name}(s):\n    return {body}",
                    _mixed(_text, "c", test),
                )
            )
    return tuple(problems)


PROBLEMS: tuple[CodeProblem, ...] = STANDALONE + _families()
# Held out of training in the shipped tasks file: one combination per part, so that every
# map, filter, aggregate, character class and string operation still appears in training.
HELD_OUT: frozenset[str] = frozenset(
    {
        "double_odds",
        "square_positives",
        "negate_negatives",
        "increment_evens",
        "sum_of_negatives",
        "count_odds",
        "remove_vowels",
        "keep_digits",
        "count_uppercase",
    }
)


def reference_function(problem: CodeProblem) -> Callable[..., Any]:
    """The problem's reference solution as a callable (steprl's own code, run on the host)."""
    namespace: dict[str, Any] = {}
    exec(problem.reference, namespace)  # trusted: the source strings above
    return namespace[problem.function]


def hidden_tests(problem: CodeProblem, rng: random.Random, count: int) -> list[dict[str, Any]]:
    """`count` tests {call, expected} with distinct inputs (the expected values never enter
    the sandbox: they are compared on the host)."""
    fn = reference_function(problem)
    tests: list[dict[str, Any]] = []
    for _ in range(50 * count):
        args = problem.draw(rng)
        call = f"{problem.function}({', '.join(repr(a) for a in args)})"
        if all(t["call"] != call for t in tests):
            tests.append({"call": call, "expected": fn(*args)})
        if len(tests) == count:
            break
    return tests


def instance(problem: CodeProblem, rng: random.Random) -> tuple[str, list[dict[str, Any]]]:
    """One task of `problem`: its prompt (signature, behaviour and one worked call) and 3-5
    hidden tests, all drawn from `rng`."""
    example_args = problem.draw(rng)
    example = f"{problem.function}({', '.join(map(repr, example_args))})"
    result = reference_function(problem)(*example_args)
    prompt = (
        f"Write a Python function `{problem.signature}` that {problem.does}. "
        f"For example, {example} returns {result!r}."
    )
    return prompt, hidden_tests(problem, rng, rng.randint(3, 5))
