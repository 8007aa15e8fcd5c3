"""docs/results.md from the records in bench/results/records/: a table per setting (a preset's
runs, a bench's runs), and under each table every row's command, machine and commit, with what
the rows share written once. The page holds the current results; a record replaced by a newer
one of the same row leaves (git keeps it).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from agent_core.core.measurements import Figure, Machine, Measurement, read_measurement

REPO = Path(__file__).resolve().parents[2]
RECORDS = Path(__file__).resolve().parent / "records"
DOC_PATH = REPO / "docs" / "results.md"
# the last docs/results.md that held every dated measurement, superseded ones included
HISTORY_COMMIT = "84816fe"
WALL = "wall s"
# a list longer than this (a figure per iteration) shows its first and last values and its
# range; the record holds them all
MAX_LIST_CELLS = 4
# the most arms a one-record table shows as columns
MAX_ARMS = 8
# the most arms a table of several records shows in one cell ('a / b / c')
MAX_CELL_ARMS = 3
# the fewest characters of command that a table's rows share before the page writes them once
MIN_SHARED = 30
# the fewest bytes that naming a run of options the rows of a table share must save
MIN_SAVED = 60


@dataclass(frozen=True)
class Setting:
    """A table: its heading and what its rows measure (conditions, not figures)."""

    title: str
    about: str


@dataclass(frozen=True)
class Section:
    """A part of the page: its heading, what it holds, its settings in order, and the kind of
    record whose setting no section names that lands here."""

    title: str
    about: str
    settings: tuple[str, ...]
    kind: str


SECTIONS = (
    Section(
        "Learning results",
        "One row per `steprl train` run. Held-out success is greedy, on eval seeds disjoint "
        "from training: `base` before the warm-up, `iter k` after RL iteration k (0: after "
        "the warm-up). Per-iteration lists (first … last (count; range)) are of the sampled "
        "training episodes. `wall`: the whole command. With 64 held-out episodes one "
        "standard error is at most 0.0625. The rows of a table share seeds and held-out tasks "
        "unless their labels say otherwise.",
        (
            "calculator_grpo",
            "learn_calculator",
            "learn_calculator_lora",
            "learn_numberline",
            "learn_search",
            "learn_code",
            "learn_visual",
            "bench/baselines.py",
            "bench/vision_read.py",
            "bench/teams.py",
        ),
        "run",
    ),
    Section(
        "Envs nobody tuned a preset for",
        "`learn_general` on the envs of `tests/outsider`, written without a preset of their "
        "own ([extending](extending.md#envs-nobody-tuned-a-preset-for)). Held-out success: 48 "
        "greedy episodes.",
        ("learn_general", "bench/trees.py"),
        "run",
    ),
    Section(
        "Performance per phase",
        "A column per run of a bench, or per arm of a one-run comparison. Benches print "
        "ratios and never assert timings; how they work: "
        "[scaling](scaling.md#performance-on-one-machine).",
        (
            "bench/rollout.py",
            "bench/prefix_cache.py",
            "bench/lora_rows.py",
            "bench/update.py",
            "bench/packing.py",
            "bench/dtype.py",
            "bench/demonstrations.py",
            "bench/update_drift.py",
            "bench/vs_trl.py",
            "bench/overhead.py",
            "bench/memory.py",
            "bench/replay.py",
            "bench/scale.py",
            "bench/async.py",
            "bench/serve.py",
        ),
        "bench",
    ),
    Section("Test suite", "", ("test suite",), "tests"),
)


SETTINGS = {
    "calculator_grpo": Setting(
        "The demo (`calculator_grpo`)",
        "`make demo`: 3 iterations of GRPO on the calculator env from the base model, no "
        "warm-up and no held-out evaluation.",
    ),
    "learn_calculator": Setting(
        "The calculator tool (`learn_calculator`)",
        "A warm-up on solver demonstrations, then 8 iterations of GRPO (8 tasks x 4), up "
        "to 3 steps, 64 held-out episodes. `agent` rows run through the policy server "
        "([agents](agents.md)); the overlap row collects during the update "
        "([async](async.md))."
        + "\n\n![learning curve](../bench/results/learn_calculator.png)\n"
        + "![learning curve, plain-SDK agent](../bench/results/learn_calculator_agent.png)",
    ),
    "learn_calculator_lora": Setting(
        "The calculator with LoRA (`learn_calculator_lora`)",
        "`learn_calculator` with LoRA adapters (r=16, alpha 32) instead of full fine-tuning.",
    ),
    "learn_numberline": Setting(
        "NumberLine (`learn_numberline`)",
        "A game of up to 6 moves, GiGPO, 8 tasks x 4, 48 held-out episodes, a window of the "
        "last turn as context.\n\n![learning curve](../bench/results/learn_numberline.png)",
    ),
    "learn_search": Setting(
        "Search-QA (`learn_search`)",
        "Two hops over a BM25 corpus, up to 4 steps, GRPO, 8 tasks x 4, 64 held-out episodes."
        "\n\n![learning curve](../bench/results/learn_search.png)",
    ),
    "learn_code": Setting(
        "Code with hidden tests (`learn_code`)",
        "One reply per task, GRPO, 8 tasks x 4; the 72 held-out episodes ask for 9 functions "
        "no training task asks for (8 episodes each, which succeed or fail together).",
    ),
    "learn_visual": Setting(
        "Visual grid games (`learn_visual`)",
        "The VLM `prepare-vlm` builds (SmolLM2-135M-Instruct, a random SigLIP encoder and "
        "projector); a warm-up (the projector aligned on board captions, then the solver's "
        "moves; text games skip the alignment); 8 iterations of GiGPO (8 tasks x 4), up to 8 "
        "moves, 48 held-out episodes; each image game beside its text twin on the same model. "
        "Baselines: the next table.",
    ),
    "bench/baselines.py": Setting(
        "Trivial baselines of the grid games (`bench/baselines.py`)",
        "Held-out success of random moves and of the best constant move on the held-out tasks "
        "of `learn_visual`'s rows (the image and text versions of a game share them), the "
        "solver beside them.",
    ),
    "bench/vision_read.py": Setting(
        "Does the built VLM read the board? (`bench/vision_read.py`)",
        "`cells`: a linear classifier on the frozen encoder's per-patch features (a cell a "
        "patch), held-out cell accuracy. `moves`: the policy fine-tuned on the warm-up's rows "
        "(encoder frozen), held-out accuracy of its most likely move (any first move of a "
        "shortest win) against the best constant move.",
    ),
    "bench/teams.py": Setting(
        "A team: shared against an adapter per role (`bench/teams.py`)",
        "`learn_team` (LoRA r=16): one adapter for both roles (warm-up included), and an "
        "adapter per role from that warm-up; same seeds ([teams](teams_and_trees.md#teams)). "
        "Held-out: 48 greedy episodes; `team`: the solver's last answer right; `verdicts`: "
        "the verifier's right; `solver alone`: its first answer. Trained MiB per role: fp32 "
        "weights, gradients, AdamW moments.",
    ),
    "learn_general": Setting(
        "The outsider envs (`learn_general`)",
        "The trivial baseline: the best constant or random policy on the held-out tasks. `same "
        "tasks`: the warm-up and the last checkpoint sampled (T = 1) on 96 held-out tasks (384 "
        "for the choice; `steprl eval ... --set eval.temperature=1.0 --set eval.episodes=96`). "
        "`RL only` rows start from the warm-up of the same seed's whole run.",
    ),
    "bench/trees.py": Setting(
        "Tree against chain rollouts at equal tokens (`bench/trees.py`)",
        "`learn_general` (warm-up, 8 iterations of GiGPO, 4 chains per task) against RL from "
        "its warm-up with Tree-GRPO's budget mode (2 trees per task) and `tree_grpo`, tokens "
        "per task capped near the chain's ([trees](teams_and_trees.md#trees)). Tokens count "
        "refill rounds; seconds: collect to log.",
    ),
    "bench/rollout.py": Setting(
        "Rollout (`bench/rollout.py`)",
        "steprl's engine against HF `generate` per episode (goal: at least 5x) and the compute "
        "roofline, fp32 and bf16, calculator prompts of about 230 tokens, 64 new tokens, T = 1; "
        "with `.vllm-venv`, a vLLM server on the same prompts ([engines](engines.md)).",
    ),
    "bench/prefix_cache.py": Setting(
        "The prefix cache in multi-turn rollouts (`bench/prefix_cache.py`)",
        "The same 32 NumberLine episodes (8 tasks x 4, up to 6 turns, 24-token replies) with "
        "`rollout.prefix_cache_mib` 0 and 1024, under full history and a window of one turn.",
    ),
    "bench/lora_rows.py": Setting(
        "An adapter per row in one generate call (`bench/lora_rows.py`)",
        "A turn's calculator prompts over 3 roles, each row sampled with its role's LoRA "
        "adapter (r=16, every linear layer) in one call (deltas by slicing the batch per "
        "adapter, or one masked stacked GEMM), against no adapter and one call per role "
        "([teams](teams_and_trees.md#teams)).",
    ),
    "bench/update.py": Setting(
        "Prefix-tree micro-batches (`bench/update.py`)",
        "One update of the demo's batch shape before (left-padded micro-batches of 8 unpacked "
        "rows) and after (packing and prefix trees), full and LoRA, and the DeepSpeed trainer "
        "against a plain torch loop on the same batches (goal: at most 1.1x).",
    ),
    "bench/packing.py": Setting(
        "Append-only packing (`bench/packing.py`)",
        "Forward and backward of one trajectory of T steps on the trainer's path, unpacked "
        "(one sequence per step) against packed (one per trajectory).",
    ),
    "bench/dtype.py": Setting(
        "bf16 against fp32 (`bench/dtype.py`)",
        "What `trainer.dtype: auto` picks on the CPU and what the pick is worth: the start-up "
        "probe, a 2048² matmul and the prefix-tree update in each dtype.",
    ),
    "bench/demonstrations.py": Setting(
        "The demonstration loss (`bench/demonstrations.py`)",
        "One update of 64 RL rows under `learn_general`'s trainer settings without the "
        "demonstration term, with it drawing rows one by one, and with it drawing whole "
        "episodes, on the env's own solver demonstrations.",
    ),
    "bench/update_drift.py": Setting(
        "An update replayed under other settings (`bench/update_drift.py`)",
        "A committed update of a finished run replayed from the checkpoint that sampled it, "
        "under the run's settings and under each variant: its steps, `actor/approx_kl`, the "
        "probability of the replies' first two tokens, and its time.",
    ),
    "bench/vs_trl.py": Setting(
        "A GRPO iteration against TRL (`bench/vs_trl.py`)",
        "The same task, model, 4 x 4 group shape and 32 new tokens in steprl and TRL's "
        "`GRPOTrainer`, both updating in the dtype `trainer.dtype: auto` resolves to (goal: "
        "steprl at least 1.5x faster).",
    ),
    "bench/overhead.py": Setting(
        "Orchestration overhead (`bench/overhead.py`)",
        "The train flow's wall time outside the phase bodies (Prefect's task machinery and "
        "flow code; goal: at most 3 %), and the `log` task's MLflow work.",
    ),
    "bench/memory.py": Setting(
        "Peak memory per phase (`bench/memory.py`)",
        "Peak RSS of each phase of one run in one process; bytes/param: RSS above the "
        "process's after its imports over the parameters; beside it a plain torch AdamW step "
        "and the load-time estimate. Goals, general preset on the 135M model: whole-run peak "
        "<= 5 GB, update <= 24 bytes/param ([scaling](scaling.md#memory-fitting-a-larger-model)).",
    ),
    "bench/replay.py": Setting(
        "Replay store (`bench/replay.py`)",
        "100k calculator-sized step rows written and read through the replay store against "
        "plain pyarrow (goal: at least 1 M steps/min each way), and bytes per step on disk.",
    ),
    "bench/scale.py": Setting(
        "Scaling out (`bench/scale.py`)",
        "The demo preset's second iteration in each layout of rollout workers x trainer "
        "ranks ([scaling](scaling.md)); on one box every layout shares its cores, so the "
        "figures show where the time goes, not a speed-up.",
    ),
    "bench/async.py": Setting(
        "Asynchronous training (`bench/async.py`)",
        "The demo preset (4 tasks x 4, 4 iterations) with collection overlapping the update "
        "(S = `overlap.max_staleness`) against sequential, without and with two rollout "
        "workers ([async](async.md)).",
    ),
    "bench/serve.py": Setting(
        "Policy server (`bench/serve.py`)",
        "The server against the engine called directly on the same prompts at 1, 8 and 32 "
        "concurrent clients ([agents](agents.md#serve-any-checkpoint)).",
    ),
    "test suite": Setting("Durations", "A clean clone: `make test`, and CI (`.ci/run`)."),
}


def load_records(folder: Path = RECORDS) -> list[Measurement]:
    """Every record in `folder`."""
    return [read_measurement(path) for path in sorted(folder.glob("*.json"))]


def anchor(title: str) -> str:
    """The id GitHub gives a heading (lower case, punctuation dropped, spaces as '-')."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def record_file(record: Measurement, folder: Path = RECORDS) -> Path:
    """Where a record's row lives: one file per setting and label, so a newer record of the
    same row replaces it."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"{record.setting} {record.label}".lower()).strip("-")
    if len(slug) > 80:  # a label of long arguments: cut, and told apart by a digest
        slug = f"{slug[:70]}-{hashlib.sha256(slug.encode()).hexdigest()[:8]}"
    return folder / f"{slug}.json"


def fmt(name: str, value: Figure) -> str:
    """A figure as a table cell: wall seconds as minutes and seconds, numbers to 4 figures."""
    if isinstance(value, list) and len(value) > MAX_LIST_CELLS:  # per iteration: its ends
        low, high = min(value), max(value)  # type: ignore[type-var]
        ends = f"{fmt('', value[0])} … {fmt('', value[-1])}"
        return f"{ends} ({len(value)}; {fmt('', low)}-{fmt('', high)})"
    if isinstance(value, list):
        return ", ".join(fmt("", v) for v in value)
    if isinstance(value, str):
        return value.replace("|", "\\|")
    if name == WALL:
        minutes, seconds = divmod(round(value), 60)
        return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"
    if isinstance(value, int):
        return str(value)
    if 0 <= value <= 1:  # success rates and ratios: the third decimal is what moves
        return f"{value:.3f}"
    return f"{value:.4g}" if abs(value) < 1e6 else f"{value:,.0f}"


def machine_key(machine: Machine) -> tuple:
    return machine.cpu, machine.cores, tuple(machine.isa), machine.gpu


def machine_names(records: list[Measurement]) -> dict[tuple, str]:
    """M1, M2, ... for each machine, in the order the page first shows it."""
    names: dict[tuple, str] = {}
    for record in records:
        names.setdefault(machine_key(record.machine), f"M{len(names) + 1}")
    return names


def table_row(cells: list[str]) -> str:
    """A Markdown table row, its cells unpadded (the page renders the same, in fewer bytes)."""
    return "|" + "|".join(cells) + "|"


def rule(columns: int) -> str:
    return "|---" * columns + "|"


# the machines table's columns, and how a value every machine shares is said above it
MACHINE_COLUMNS = {
    "CPU": "CPU {}",
    "cores": "{} cores",
    "CPU features": "CPU features {}",
    "GPU": "GPU: {}",
}


def machines_table(records: list[Measurement], names: dict[tuple, str]) -> list[str]:
    """A row per machine; a column with one value for every machine is said once above."""
    rows: dict[tuple, dict[str, str]] = {}
    for record in records:
        m = record.machine
        rows.setdefault(
            machine_key(m),
            {
                "CPU": m.cpu,
                "cores": str(m.cores),
                "CPU features": ", ".join(m.isa) or "not recorded",
                "GPU": m.gpu or "none",
            },
        )
    heads = list(MACHINE_COLUMNS)
    same = [h for h in heads if len(rows) > 1 and len({row[h] for row in rows.values()}) == 1]
    heads = [h for h in heads if h not in same]
    first = next(iter(rows.values()), {})
    said = ", ".join(MACHINE_COLUMNS[h].format(first[h]) for h in same)
    lines = [f"Every machine: {said}.", ""] if same else []
    lines += [table_row(["machine", *heads]), rule(len(heads) + 1)]
    for key, row in rows.items():
        lines.append(table_row([names[key], *(row[h] for h in heads)]))
    return lines


def column_rank(name: str) -> tuple:
    """Held-out success first (base, then by iteration), wall time last, the rest between."""
    if name == "held-out base":
        return (0, -1)
    if match := re.fullmatch(r"held-out iter (\d+)", name):
        return (0, int(match[1]))
    return (2, 0) if name == WALL else (1, 0)


def columns(records: list[Measurement]) -> list[str]:
    """Every figure name of the records, ranked by `column_rank`, else in the order they
    first appear."""
    names = list(dict.fromkeys(name for r in records for name in r.figures))
    return sorted(names, key=column_rank)


def run_table(records: list[Measurement]) -> list[str]:
    """A row per record, a column per figure."""
    names = columns(records)
    headers = ["wall" if n == WALL else n.removeprefix("held-out ") for n in names]
    lines = [table_row(["run", *headers]), rule(len(names) + 1)]
    for r in records:
        cells = [fmt(n, r.figures[n]) if n in r.figures else "" for n in names]
        lines.append(table_row([fmt("", r.label), *cells]))
    return lines


def arms(names: list[str]) -> list[str]:
    """The prefixes of figure names ('shared: x', 'roles: x') of which two or more figures
    each share their name's rest with another prefix's, when they name half the figures or
    more: the arms of a comparison; [] when fewer than two."""
    by_rest: dict[str, list[str]] = {}
    for prefix, _, rest in (n.partition(": ") for n in names if ": " in n):
        by_rest.setdefault(rest, []).append(prefix)
    shared = [p for ps in by_rest.values() if len(ps) > 1 for p in ps]
    found = [p for p in dict.fromkeys(shared) if shared.count(p) > 1]
    armed = [n for n in names if n.partition(": ")[0] in found]
    return found if 1 < len(found) <= MAX_ARMS and 2 * len(armed) >= len(names) else []


def arms_table(record: Measurement, sides: list[str], corner: str = "") -> list[str]:
    """One record's figures with a column per arm (a row per figure name's rest; `corner` in
    the top left), then its other figures on one line."""
    lines = [table_row([corner, *sides]), rule(len(sides) + 1)]
    rests = dict.fromkeys(
        n.partition(": ")[2] for n in record.figures if n.partition(": ")[0] in sides
    )
    for rest in rests:
        cells = [
            fmt(rest, record.figures[f"{side}: {rest}"])
            if f"{side}: {rest}" in record.figures
            else ""
            for side in sides
        ]
        lines.append(table_row([rest, *cells]))
    others = [
        f"{name} **{fmt(name, value)}**"
        for name, value in record.figures.items()
        if name.partition(": ")[0] not in sides
    ]
    return [*lines, "", " · ".join(others)] if others else lines


def arm_cell(rest: str, figures: dict[str, Figure], sides: list[str]) -> str:
    """A record's figures of each arm for one rest as 'a / b' ('-' for a missing one)."""
    cells = [
        fmt(rest, figures[f"{s}: {rest}"]) if f"{s}: {rest}" in figures else "-" for s in sides
    ]
    return "" if set(cells) == {"-"} else " / ".join(cells)


def records_table(records: list[Measurement]) -> list[str]:
    """A row per figure, a column per record; where the figures compare arms ('chain: x',
    'tree: x'), a row per rest every arm has, with 'a / b' in its cells."""
    names = columns(records)
    sides = arms(names)
    sides = sides if len(sides) <= MAX_CELL_ARMS else []
    both = [
        rest
        for rest in dict.fromkeys(n.partition(": ")[2] for n in names)
        if sides and all(f"{s}: {rest}" in names for s in sides)
    ]
    sides = sides if both else []
    lines = [table_row([" / ".join(sides), *(fmt("", r.label) for r in records)])]
    lines.append(rule(len(records) + 1))
    for rest in both:
        lines.append(table_row([rest, *(arm_cell(rest, r.figures, sides) for r in records)]))
    for name in names:
        if name.partition(": ")[0] in sides and name.partition(": ")[2] in both:
            continue
        cells = [fmt(name, r.figures[name]) if name in r.figures else "" for r in records]
        lines.append(table_row([name, *cells]))
    return lines


def apart(records: list[Measurement]) -> list[list[Measurement]]:
    """The records as tables: a record comparing arms of its own (no figure name shared with
    another record) alone, the others together; in the order of their first records."""
    alone = [
        r
        for r in records
        if arms(list(r.figures))
        and not any(set(r.figures) & set(o.figures) for o in records if o is not r)
    ]
    together = [r for r in records if all(r is not a for a in alone)]
    tables = [[r] for r in alone] + ([together] if together else [])
    return sorted(tables, key=lambda t: next(i for i, r in enumerate(records) if r is t[0]))


def bench_table(records: list[Measurement]) -> list[str]:
    """A row per figure, a column per record (`records_table`); a record comparing arms
    ('chain: ...', 'tree: ...') of its own, a table with a column per arm."""
    lines: list[str] = []
    tables = apart(records)
    for table in tables:
        lines += [""] if lines else []
        if len(table) == 1 and (sides := arms(list(table[0].figures))):
            corner = fmt("", table[0].label) if len(tables) > 1 else ""
            lines += arms_table(table[0], sides, corner)
        else:
            lines += records_table(table)
    return lines


def shared_command(records: list[Measurement]) -> str:
    """The whole words every record's command starts with (never cutting a quoted argument;
    a row's whole command may be all of it), when there are two records or more and it is at
    least MIN_SHARED characters, or the one command of every record; else ''."""
    if len(records) < 2:
        return ""
    if len({r.command for r in records}) == 1:  # one command for every row
        return records[0].command
    words = [r.command.split(" ") for r in records]
    shared: list[str] = []
    for column in zip(*words, strict=False):
        if len(set(column)) > 1:
            break
        shared.append(column[0])
    while shared and (" ".join(shared).count("'") % 2 or shared[-1][0] == "-"):
        shared.pop()  # inside a quote, or a flag without its value
    prefix = " ".join(shared)
    return prefix if len(prefix) >= MIN_SHARED else ""


WORD = re.compile(r"(?:[^\s']+|'[^']*'|')+")  # a quote without its end is a character


def options(rest: str) -> list[str]:
    """A command's arguments, one option a string: a word starting with '-' and the words up to
    the next such word (a quoted argument is one word)."""
    out: list[str] = []
    for word in WORD.findall(rest):
        if word.startswith("-") or not out:
            out.append(word)
        else:
            out[-1] += f" {word}"
    return out


def label_parts(label: str) -> list[str]:
    return [part.strip() for part in label.split(",")]


def group_name(labels: list[str], users: list[str]) -> str:
    """The comma-separated parts of a label that the `users` labels all have, when every label
    with those parts is a user (so the name says which rows have the group); else ''."""
    common = [p for p in label_parts(users[0]) if all(p in label_parts(u) for u in users)]
    named = [label for label in labels if set(common) <= set(label_parts(label))]
    return ", ".join(common) if common and sorted(named) == sorted(users) else ""


def contains(items: list[str], run: tuple[str, ...]) -> bool:
    return any(tuple(items[i : i + len(run)]) == run for i in range(len(items) - len(run) + 1))


def named_groups(rows: dict[str, list[str]]) -> dict[str, str]:
    """Runs of options that two rows or more have, each named after what those rows' labels
    share ('<name>' replaces the run in `rows`, in place), while naming one saves MIN_SAVED
    bytes or more; the names, in the order the rows first use them, with their options."""
    groups: dict[str, str] = {}
    while True:
        best: tuple[int, str, tuple[str, ...]] | None = None
        runs = dict.fromkeys(
            tuple(opts[i:j])
            for opts in rows.values()
            for i in range(len(opts))
            for j in range(i + 1, len(opts) + 1)
        )
        for run in runs:
            text = " ".join(run)
            if len(text) < MIN_SHARED or any(f"<{name}>" in run for name in groups):
                continue
            users = [label for label, opts in rows.items() if contains(opts, run)]
            name = group_name(list(rows), users) if len(users) > 1 else ""
            if not name or name in groups:
                continue
            saved = len(users) * (len(text) - len(name) - 2) - (len(text) + len(name) + 10)
            if best is None or saved > best[0]:
                best = (saved, name, run)
        if best is None or best[0] < MIN_SAVED:
            break
        _, name, run = best
        groups[name] = " ".join(run)
        for label, opts in rows.items():
            i = next((i for i in range(len(opts)) if tuple(opts[i : i + len(run)]) == run), -1)
            if i >= 0:
                rows[label] = [*opts[:i], f"<{name}>", *opts[i + len(run) :]]
    first = [o[1:-1] for opts in rows.values() for o in opts if o[1:-1] in groups]
    return {name: groups[name] for name in dict.fromkeys(first)}


def where(record: Measurement, names: dict[tuple, str]) -> str:
    machine = names[machine_key(record.machine)]
    return machine + (f", {record.dtype}" if record.dtype else "")


def provenance_lines(
    records: list[Measurement], names: dict[tuple, str], shown: bool = False
) -> list[str]:
    """Under a table: every row's command, machine (and dtype) and commit, and its note. What
    all rows share is written once: their command's start, options that rows of the same name
    share (named after it), their machine and their commit."""
    shared = shared_command(records)
    rests = {r.label: r.command[len(shared) :].strip() if shared else r.command for r in records}
    rows = {label: options(rest) for label, rest in rests.items()}
    exact = all(" ".join(rows[label]) == rest for label, rest in rests.items())
    groups = named_groups(rows) if shared and exact else {}
    common = {
        field: values.pop()
        for field, values in (
            ("machine", {where(r, names) for r in records}),
            ("commit", {r.commit for r in records}),
        )
        if len(records) > 1 and len(values) == 1
    }
    lines = []
    if groups:
        lines += [
            "In the commands below, `<name>` stands for these options (the rows whose label "
            "says *name* have them):",
            "",
            *(f"- `<{name}>`: `{text}`" for name, text in groups.items()),
            "",
        ]
    same = " · ".join(f"`{v}`" if k == "commit" else v for k, v in common.items())
    head = [f"Every row: {same}."] if same else []
    if shared and not any(rests.values()):
        head.append(f"Every row's command: `{shared}`.")
    elif shared:
        head.append(f"Each command below starts `{shared}`:")
    lines += [" ".join(head), ""] if head else []
    for record in records:
        rest = " ".join(rows[record.label]) if groups else rests[record.label]
        if shared and not any(rests.values()):
            command = ""
        elif shared:
            command = f"`… {rest}`" if rest else "no more arguments"
        else:
            command = f"`{rest}`"
        fields = [command] if command else []
        fields += [] if "machine" in common else [where(record, names)]
        fields += [] if "commit" in common else [f"`{record.commit}`"]
        if shown or (record.label.startswith("-") and command.endswith(f" {record.label}`")):
            line = "- " + " · ".join(fields) + "."  # the label: in the table, or the arguments
        else:
            line = f"- **{record.label}**" + (": " + " · ".join(fields) if fields else "") + "."
        lines.append(f"{line} {record.note}" if record.note else line)
    return lines


def setting_lines(setting: str, records: list[Measurement], names: dict) -> list[str]:
    known = SETTINGS.get(setting, Setting(f"`{setting}`", ""))
    lines = [f"### {known.title}", ""]
    lines += [known.about, ""] if known.about else []
    table = (bench_table if records[0].kind == "bench" else run_table)(records)
    # one row whose label the table shows: its command, machine and commit need no label
    shown = len(records) == 1 and f"|{fmt('', records[0].label)}|" in "\n".join(table)
    return [*lines, *table, "", *provenance_lines(records, names, shown), ""]


def placed(records: list[Measurement]) -> list[tuple[Section, list[tuple[str, list]]]]:
    """Each section with its settings' records, in page order; a setting no section names
    goes to the first section of its kind, after the named ones."""
    by_setting: dict[str, list[Measurement]] = {}
    for record in sorted(records, key=lambda r: (r.setting, r.label)):
        by_setting.setdefault(record.setting, []).append(record)
    named = {s for section in SECTIONS for s in section.settings}
    out = []
    for section in SECTIONS:
        settings = [s for s in section.settings if s in by_setting]
        if section is next(x for x in SECTIONS if x.kind == section.kind):
            kind = section.kind
            settings += [s for s, rs in by_setting.items() if s not in named and rs[0].kind == kind]
        if settings:
            out.append((section, [(s, by_setting[s]) for s in settings]))
    return out


INTRO = """# Results

The current measurements, a table per setting, generated by `python -m bench.results --write`
from `bench/results/records/` (never edit this page by hand); under each table, every row's
command (from the repository's root), machine and commit, what the rows share written once.
For planning and comparison, not promises: rerun a row's command for your machine's figures.

A bench writes its record with `--record FILE`, `steprl train` into `runs/<name>/result.json`;
`python -m bench.results add FILE_OR_RUN_FOLDER [--label NAME] [--note TEXT]` files it,
replacing the row of the same setting and label (git keeps the old one), and rewrites this
page."""

HISTORY = f"""## Earlier results

Until commit `{HISTORY_COMMIT}` this page was a dated lab notebook: every run of every preset
as it changed, the ablations behind each choice of `learn_general` and why some runs failed.
Its sections are cited by name from the other docs (as "earlier results, <section>"); read
them with `git show {HISTORY_COMMIT}:docs/results.md`."""


def render(records: list[Measurement] | None = None) -> str:
    """The page, from `records` (default: every record in bench/results/records/)."""
    records = load_records() if records is None else records
    sections = placed(records)
    in_order = [r for _, settings in sections for _, rs in settings for r in rs]
    names = machine_names(in_order)
    index = [f"- [{s.title}](#{anchor(s.title)})" for s, _ in sections]
    index.append("- [Earlier results](#earlier-results)")
    lines = [INTRO, "", *index, "", "## Machines", "", *machines_table(in_order, names), ""]
    for section, settings in sections:
        lines += [f"## {section.title}", ""] + ([section.about, ""] if section.about else [])
        for setting, rs in settings:
            lines += setting_lines(setting, rs, names)
    return "\n".join([*lines, HISTORY, ""])
