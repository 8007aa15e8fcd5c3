"""docs/results.md from the records in bench/results/records/: a table per setting (a preset's
runs, a bench's runs), and under each table every row's command, machine and commit. The page
holds the current results; a record replaced by a newer one of the same row leaves (git keeps it).
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
# the fewest characters of command that a table's rows share before the page writes them once
MIN_SHARED = 30


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
        "standard error is at most 0.0625.",
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
        "own ([extending](extending.md#envs-nobody-tuned-a-preset-for)).",
        ("learn_general", "bench/trees.py"),
        "run",
    ),
    Section(
        "Performance per phase",
        "One column per run of a bench, with the figures it prints (`--record FILE` writes "
        "them). Benches print ratios and never assert timings; how they work: "
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


def _seeds(what: str) -> str:
    return f"{what} The same seeds and held-out tasks as the other rows of this table."


SETTINGS = {
    "calculator_grpo": Setting(
        "The demo (`calculator_grpo`)",
        "`make demo`: 3 iterations of GRPO on the calculator env from the base model, no "
        "warm-up and no held-out evaluation.",
    ),
    "learn_calculator": Setting(
        "The calculator tool (`learn_calculator`)",
        _seeds(
            "A warm-up on solver demonstrations, then 8 iterations of GRPO (8 tasks x 4), up "
            "to 3 steps, 64 held-out episodes. `agent` rows run through the policy server "
            "([agents](agents.md)); the overlap row collects during the update "
            "([async](async.md))."
        )
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
        "The VLM `prepare-vlm` builds from SmolLM2-135M-Instruct (a random SigLIP encoder and "
        "projector), a supervised warm-up on the solver's moves, then 8 iterations of GiGPO "
        "(8 tasks x 4), up to 8 moves, 48 held-out episodes; each image game beside the same "
        "game as text on the same model (`--set env.name=...`). Random and constant moves on "
        "the same held-out tasks: the next table.",
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
        "The docs' commands with `--set run.seed=<seed>`. Held-out: 48 greedy episodes; the "
        "trivial baseline: the best constant or random policy there. `same tasks`: the "
        "warm-up and the last checkpoint sampled (T = 1) on 96 held-out tasks (384 for the "
        "choice; `steprl eval ... --set eval.temperature=1.0 --set eval.episodes=96`). `RL "
        "only` rows start from the warm-up of the same seed's whole run.",
    ),
    "bench/trees.py": Setting(
        "Tree against chain rollouts at equal tokens (`bench/trees.py`)",
        "`learn_general` (warm-up, 8 iterations of GiGPO, 4 chains per task) against RL from "
        "its warm-up with Tree-GRPO's budget mode (2 trees per task) and `tree_grpo`, tokens "
        "per task capped near the chain's ([trees](teams_and_trees.md#trees)). Held-out: 48 "
        "greedy episodes; tokens count refill rounds; seconds: collect to log.",
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


def machines_table(records: list[Measurement], names: dict[tuple, str]) -> list[str]:
    lines = ["| machine | CPU | cores | CPU features | GPU |", "|---|---|---|---|---|"]
    shown = set()
    for record in records:
        m = record.machine
        if (key := machine_key(m)) not in shown:
            shown.add(key)
            isa = ", ".join(m.isa) or "not recorded"
            lines.append(f"| {names[key]} | {m.cpu} | {m.cores} | {isa} | {m.gpu or 'none'} |")
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
    lines = ["| run | " + " | ".join(headers) + " |", "|---" * (len(names) + 1) + "|"]
    for r in records:
        cells = [fmt(n, r.figures[n]) if n in r.figures else "" for n in names]
        lines.append(f"| {fmt('', r.label)} | " + " | ".join(cells) + " |")
    return lines


def arms(names: list[str]) -> list[str]:
    """The prefixes of figure names ('shared: x', 'roles: x') of which two or more figures
    each share their name's rest with another prefix's: the arms of a one-record comparison;
    [] when fewer than two."""
    by_rest: dict[str, list[str]] = {}
    for prefix, _, rest in (n.partition(": ") for n in names if ": " in n):
        by_rest.setdefault(rest, []).append(prefix)
    shared = [p for ps in by_rest.values() if len(ps) > 1 for p in ps]
    found = [p for p in dict.fromkeys(shared) if shared.count(p) > 1]
    return found if 1 < len(found) <= MAX_ARMS else []


def arms_table(record: Measurement, sides: list[str]) -> list[str]:
    """One record's figures with a column per arm (a row per figure name's rest), then its
    other figures on one line."""
    lines = ["| | " + " | ".join(sides) + " |", "|---" * (len(sides) + 1) + "|"]
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
        lines.append(f"| {rest} | " + " | ".join(cells) + " |")
    others = [
        f"{name} **{fmt(name, value)}**"
        for name, value in record.figures.items()
        if name.partition(": ")[0] not in sides
    ]
    return [*lines, "", " · ".join(others)] if others else lines


def bench_table(records: list[Measurement]) -> list[str]:
    """A row per figure, a column per record; one record comparing arms ('chain: ...',
    'tree: ...'), a column per arm."""
    if len(records) == 1 and (sides := arms(list(records[0].figures))):
        return arms_table(records[0], sides)
    lines = ["| | " + " | ".join(fmt("", r.label) for r in records) + " |"]
    lines.append("|---" * (len(records) + 1) + "|")
    for name in columns(records):
        cells = [fmt(name, r.figures[name]) if name in r.figures else "" for r in records]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def shared_command(records: list[Measurement]) -> str:
    """The whole words every record's command starts with (never cutting a quoted argument),
    when there are two records or more and it is at least MIN_SHARED characters; else ''."""
    if len(records) < 2:
        return ""
    words = [r.command.split(" ") for r in records]
    shared: list[str] = []
    for column in zip(*words, strict=False):
        if len(set(column)) > 1:
            break
        shared.append(column[0])
    whole = len(min(words, key=len))  # a whole command: nothing would be left to show
    while shared and (
        " ".join(shared).count("'") % 2 or shared[-1][0] == "-" or len(shared) == whole
    ):
        shared.pop()  # inside a quote, or a flag without its value
    prefix = " ".join(shared)
    return prefix if len(prefix) >= MIN_SHARED else ""


def provenance(record: Measurement, names: dict[tuple, str], shared: str = "") -> str:
    """A row's command (`…` for the `shared` words its table's commands start with), machine
    (and dtype) and commit, and its note."""
    machine = names[machine_key(record.machine)]
    machine += f", {record.dtype}" if record.dtype else ""
    command = f"… {record.command[len(shared) + 1 :]}" if shared else record.command
    line = f"- **{record.label}**: `{command}` · {machine} · `{record.commit}`."
    return f"{line} {record.note}" if record.note else line


def setting_lines(setting: str, records: list[Measurement], names: dict) -> list[str]:
    known = SETTINGS.get(setting, Setting(f"`{setting}`", ""))
    lines = [f"### {known.title}", ""]
    lines += [known.about, ""] if known.about else []
    table = bench_table if records[0].kind == "bench" else run_table
    shared = shared_command(records)
    start = [f"Each command below starts `{shared}`:", ""] if shared else []
    rows = [provenance(r, names, shared) for r in records]
    return [*lines, *table(records), "", *start, *rows, ""]


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
command (from the repository's root), machine and commit. For planning and comparison, not
promises: rerun a row's command for your machine's figures.

A bench writes its record with `--record FILE`, `steprl train` into `runs/<name>/result.json`;
`python -m bench.results add FILE_OR_RUN_FOLDER [--label NAME] [--note TEXT]` files it,
replacing the row of the same setting and label (git keeps the old one), and rewrites this
page. Superseded measurements: [earlier results](#earlier-results)."""

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
