"""docs/results.md is what `python -m bench.results` makes of bench/results/records/, at most
31.5 KB (room for a section more); `add` files a bench's record or a run folder's and a record of the same row replaces the
old one; every link into the page (from README, docs/ and the code) names one of its headings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent_core.core.measurements import Machine, Measurement, read_measurement, write_measurement
from bench.results.__main__ import main
from bench.results.render import DOC_PATH, RECORDS, anchor, load_records, record_file, render
from tests.conftest import REPO

MAX_BYTES = 31_500


def test_results_doc_is_current_and_small() -> None:
    written = DOC_PATH.read_text()
    assert written == render(), (
        "docs/results.md differs from its records: run `python -m bench.results --write` and "
        "commit the result"
    )
    assert len(written.encode()) <= MAX_BYTES, "docs/results.md holds the current results only"


def test_every_record_sits_in_the_file_its_row_names() -> None:
    records = sorted(RECORDS.glob("*.json"))
    assert len(records) >= 40
    for path in records:
        assert record_file(read_measurement(path)) == path, path


def record(label: str, figure: float, setting: str = "bench/packing.py") -> Measurement:
    return Measurement(
        kind="bench",
        setting=setting,
        label=label,
        command=f".venv/bin/python {setting}",
        machine=Machine(cpu="a CPU", cores=2, isa=["avx2"]),
        commit="abc1234",
        date="2026-12-06",
        figures={"T=2: seconds unpacked / packed": figure},
    )


def test_add_files_a_record_and_a_newer_one_of_the_same_row_replaces_it(tmp_path: Path) -> None:
    folder, doc = tmp_path / "records", tmp_path / "results.md"
    folder.mkdir()
    for name, value in (("old.json", 1.5), ("new.json", 2.75)):
        write_measurement(tmp_path / name, record("defaults", value))
        assert main(["add", str(tmp_path / name)], folder, doc) == 0
    assert [p.name for p in folder.iterdir()] == ["bench-packing-py-defaults.json"]
    page = doc.read_text()
    assert "|T=2: seconds unpacked / packed|2.75|" in page and "1.5" not in page
    assert main(["add", str(tmp_path / "old.json"), "--label", "on a loaded box"], folder, doc) == 0
    assert "||defaults|on a loaded box|" in doc.read_text()


def test_add_takes_a_run_folder_and_says_what_is_missing(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "choice-s1"
    ran = record("choice-s1", 0.5, "learn_general").model_copy(update={"kind": "run"})
    write_measurement(run / "result.json", ran)
    main(["add", str(run), "--label", "choice, seed 1"], tmp_path, tmp_path / "results.md")
    assert "|choice, seed 1|0.500|" in (tmp_path / "results.md").read_text()
    with pytest.raises(SystemExit, match="no results record there"):
        main(["add", str(tmp_path / "runs")], tmp_path, tmp_path / "results.md")


def test_a_record_that_is_not_one_is_refused_naming_the_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "bench", "setting": "x"}')
    with pytest.raises(ValueError, match=r"(?s)bad\.json is not a results record.*label"):
        read_measurement(bad)


def test_unknown_settings_get_a_table_in_their_kinds_section() -> None:
    page = render(
        [*load_records(), record("mine", 0.5, "my_env_preset").model_copy(update={"kind": "run"})]
    )
    envs = page.index("## Envs nobody tuned a preset for")
    assert page.index("### `my_env_preset`") < envs


LINK = re.compile(r"results\.md#([\w-]+)")


def test_every_link_into_the_page_names_one_of_its_headings() -> None:
    headings = {anchor(h) for h in re.findall(r"^#+ (.+)$", DOC_PATH.read_text(), re.M)}
    sources = [REPO / "README.md", *(REPO / "docs").glob("*.md")]
    for folder in ("configs", "agent_core", "bench", "flows", "tasks"):
        sources += (REPO / folder).rglob("*.py")
    broken = [
        f"{path.relative_to(REPO)}: #{name}"
        for path in sources
        if path != DOC_PATH
        for name in LINK.findall(path.read_text())
        if name not in headings
    ]
    assert broken == []


def test_the_pages_own_links_to_other_docs_resolve() -> None:
    for page, name in re.findall(r"\]\((\w+\.md)#([\w-]+)\)", DOC_PATH.read_text()):
        target = (REPO / "docs" / page).read_text()
        assert name in {anchor(h) for h in re.findall(r"^#+ (.+)$", target, re.M)}, (page, name)


def test_a_tables_shared_command_start_is_written_once_and_never_cuts_a_quote() -> None:
    base = "steprl train --config learn_general --set env.name=tests.outsider.corridor_env:C"
    rows = [
        record(f"seed {seed}", 0.5, "learn_general").model_copy(
            update={"command": f"{base} --set 'env.context={{name: window}}' --set run.seed={seed}"}
        )
        for seed in (1, 2)
    ]
    page = render(rows)
    shared = f"{base} --set 'env.context={{name: window}}'"
    assert f"Each command below starts `{shared}`:" in page
    assert "- **seed 2**: `… --set run.seed=2`" in page
    quoted = [
        r.model_copy(update={"command": f"{base} --set 'env.context={{name: {r.label}}}'"})
        for r in rows
    ]  # the commands part inside a quoted argument: the start shown ends before it
    assert f"Each command below starts `{base}`:" in render(quoted)
    assert "starts" not in render(rows[:1])  # one row: its whole command


def test_options_rows_share_are_named_once_after_what_their_labels_share() -> None:
    base = "steprl train --config learn_general"
    corridor = "--set env.name=tests.outsider.corridor_env:CorridorEnv --set env.max_steps=12"
    grid = "--set env.name=tests.outsider.grid_env:GridEnv"
    rows = [
        record(label, 0.5, "learn_general").model_copy(update={"command": f"{base} {command}"})
        for label, command in (
            ("corridor, seed 1", f"{corridor} --set run.seed=1"),
            ("corridor, seed 2", f"{corridor} --set run.seed=2"),
            ("corridor, seed 3", f"{corridor} --set run.seed=3"),
            ("grid, seed 1", f"{grid} --set run.seed=1"),
        )
    ]
    page = render(rows)
    assert page.count(corridor) == 1 and f"- `<corridor>`: `{corridor}`" in page
    assert "- **corridor, seed 2**: `… <corridor> --set run.seed=2`." in page
    assert f"- **grid, seed 1**: `… {grid} --set run.seed=1`." in page  # one row: spelt out
    assert f"Every row: M1 · `abc1234`. Each command below starts `{base}`:" in page


def test_a_table_of_runs_comparing_two_arms_shows_them_side_by_side_in_a_cell() -> None:
    figures = {
        "chain: seconds": 27.0,
        "tree: seconds": 22.4,
        "chain: tokens": 146,
        "tree: tokens": 144,
    }
    rows = [
        record(label, 0.0, "bench/trees.py").model_copy(
            update={"figures": figures | {"ratio": 0.5}}
        )
        for label in ("choice", "corridor")
    ]
    page = render(rows)
    assert "|chain / tree|choice|corridor|" in page
    assert "|seconds|27 / 22.4|27 / 22.4|" in page and "|tokens|146 / 144|146 / 144|" in page
    assert "|ratio|0.500|0.500|" in page and "chain: seconds" not in page
