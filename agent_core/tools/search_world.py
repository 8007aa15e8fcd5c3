"""The search env's invented world: companies, founders, towns and regions with made-up names
(so a model cannot know them), the corpus of passages stating their facts, and multi-hop
questions whose answer needs two searches ("Where was the founder of X born?").
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

WORLD_SEED = 16
N_REGIONS, N_TOWNS, N_PEOPLE, N_COMPANIES = 8, 40, 120, 120
ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr",
          "gl", "kr", "st", "th", "tr", "vel", "qu", "sh"]  # fmt: skip
VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "y"]
CODAS = ["", "n", "r", "s", "l", "th", "nd", "rk", "sk", "m", "x"]
TOWN_TAILS = ["ford", "mere", "holt", "wick", "stead", "bridge", "vale", "port"]
COMPANY_TAILS = ["Dynamics", "Works", "Labs", "Foundry", "Textiles", "Robotics", "Mills",
                 "Instruments", "Shipping", "Optics"]  # fmt: skip
PRODUCTS = ["glass lenses", "river barges", "wool blankets", "clock springs", "solar kites",
            "paper lanterns", "harbour cranes", "bicycle bells", "ink pens",
            "tin boxes"]  # fmt: skip


@dataclass(frozen=True)
class World:
    """Every invented fact: the region of each town, the birthplace of each person, and the
    founder, town and product of each company."""

    regions: list[str]
    town_region: dict[str, str]
    birthplace: dict[str, str]
    companies: list[tuple[str, str, str, str, int]]  # name, founder, seat town, product, year


def _syllables(r: random.Random, n: int) -> str:
    return "".join(r.choice(ONSETS) + r.choice(VOWELS) + r.choice(CODAS) for _ in range(n))


def _unique(r: random.Random, make, count: int, taken: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < count:
        name = make(r)
        if name not in taken:
            taken.add(name)
            out.append(name)
    return out


@functools.lru_cache(maxsize=1)
def world() -> World:
    """The one invented world (fixed seed: the corpus and questions never change)."""
    r = random.Random(WORLD_SEED)
    taken: set[str] = set()
    regions = _unique(r, lambda r: _syllables(r, 2).capitalize() + "ia", N_REGIONS, taken)
    towns = _unique(
        r, lambda r: _syllables(r, 1).capitalize() + r.choice(TOWN_TAILS), N_TOWNS, taken
    )
    people = _unique(
        r,
        lambda r: f"{_syllables(r, 1).capitalize()} {_syllables(r, 2).capitalize()}",
        N_PEOPLE,
        taken,
    )
    names = _unique(
        r,
        lambda r: f"{_syllables(r, 2).capitalize()} {r.choice(COMPANY_TAILS)}",
        N_COMPANIES,
        taken,
    )
    town_region = {t: r.choice(regions) for t in towns}
    birthplace = {p: r.choice(towns) for p in people}
    founders = r.sample(people, N_COMPANIES)  # each person founds at most one company
    companies = [
        (name, founder, r.choice(towns), r.choice(PRODUCTS), r.randint(1850, 2010))
        for name, founder in zip(names, founders, strict=True)
    ]
    return World(regions, town_region, birthplace, companies)


@functools.lru_cache(maxsize=1)
def corpus_passages() -> list[str]:
    """One passage per fact, in a fixed order."""
    w = world()
    passages = [
        f"{name}: {name} is a maker of {product} with its seat in {town}. It was founded in "
        f"{year} by {founder}."
        for name, founder, town, product, year in w.companies
    ]
    passages += [
        f"{person}: {person} is an engineer and entrepreneur. {person} was born in {town}."
        for person, town in w.birthplace.items()
    ]
    passages += [
        f"{town}: {town} is a town in the region of {region}."
        for town, region in w.town_region.items()
    ]
    return passages


@dataclass(frozen=True)
class Question:
    """A two-hop question, its answer, and the two searches that find it."""

    text: str
    answer: str
    kind: str
    hops: tuple[str, str]


def question(seed: int) -> Question:
    """The two-hop question about one company for `seed`."""
    r = random.Random(seed)
    w = world()
    name, founder, town, _, _ = w.companies[r.randrange(N_COMPANIES)]
    if r.random() < 2 / 3:
        text = f"In which town was the founder of {name} born?"
        return Question(text, w.birthplace[founder], "founder_birthplace", (name, founder))
    text = f"In which region is the town where {name} has its seat?"
    return Question(text, w.town_region[town], "seat_region", (name, town))
