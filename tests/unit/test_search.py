"""The search tool and env: BM25 (bm25s) returns the expected passage for a known query, over
the generated corpus and over a user's corpus file; the index is built once per corpus; the
generated two-hop questions are answerable with two searches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_core.config.load import load_config
from agent_core.core.records import Action
from agent_core.envs import make_env
from agent_core.envs.search import SearchEnv
from agent_core.tools import make_tool
from agent_core.tools.search import SearchTool, corpus_index
from agent_core.tools.search_world import corpus_passages, question, world


def _corpus(path: Path) -> Path:
    rows = [
        {"title": "Harbour", "text": "The old harbour of Lindqvist handles grain ships."},
        {"title": "Zephyrine", "text": "Zephyrine Okonkwo invented the brass astrolabe in 1721."},
        {"title": "Orchard", "text": "Apple orchards line the river valley."},
        {"title": None, "text": "Grain ships sail in autumn."},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_bm25_finds_the_passage_of_a_known_query(tmp_path: Path) -> None:
    tool = SearchTool(str(_corpus(tmp_path / "c.jsonl")), top_k=2)
    result = tool.run({"query": "who invented the astrolabe?"})
    assert result.text.startswith("[1] Zephyrine: Zephyrine Okonkwo invented the brass")
    assert result.info["passages"][0] == 1
    assert [i for i, _ in tool.search("grain ships")] == [3, 0]  # the shorter passage first
    assert tool.run({"query": "qqqq"}).text == "No passage matches that query."


def test_the_index_is_built_once_per_corpus_version(tmp_path: Path) -> None:
    path = _corpus(tmp_path / "c.jsonl")
    first = corpus_index(str(path))
    assert corpus_index(str(path)) is first
    assert SearchTool(str(path)).index is first[1]
    path.write_text(path.read_text() + json.dumps({"text": "A new passage."}) + "\n")
    assert len(corpus_index(str(path))[0]) == 5  # the edited file is indexed again


def test_bad_corpus_files_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "c.jsonl"
    bad.write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"c.jsonl has no column 'text'"):
        SearchTool(str(bad))
    with pytest.raises(ValueError, match=r"nope.jsonl does not exist"):
        SearchTool(str(tmp_path / "nope.jsonl"))


def test_generated_corpus_answers_two_hop_questions_with_two_searches() -> None:
    tool = SearchTool(top_k=1)
    passages = corpus_passages()
    assert len(passages) == len(set(passages)) == 280
    for seed in range(40):
        q = question(seed)
        first, second = (tool.run({"query": hop}).text for hop in q.hops)
        assert q.hops[1] in first  # the first search names the second hop
        assert q.answer in second  # the second search holds the answer
    names = [c[0] for c in world().companies]
    assert len(set(names)) == len(names)


def test_search_env_solver_succeeds_in_three_steps() -> None:
    env = make_env("search", 4, True, {}, tool_options={"search": {"top_k": 2}})
    assert isinstance(env, SearchEnv) and env.tools["search"].top_k == 2
    for seed in (3, 11):
        env.reset(SearchEnv.make_task(seed))
        results = [env.step(Action(env.solve_step() or "")) for _ in range(3)]
        assert [r.done for r in results] == [False, False, True]
        assert results[-1].info["success"] and results[-1].reward == 1.0


def test_qa_env_with_a_users_corpus(tmp_path: Path) -> None:
    corpus = str(_corpus(tmp_path / "c.jsonl"))
    env = make_env("qa", 3, True, {}, tools=["search"], tool_options={"search": {"corpus": corpus}})
    assert isinstance(make_tool("search", {"search": {"corpus": corpus}}), SearchTool)
    env.reset(SearchEnv.make_task(0))
    call = '<tool_call>{"name": "search", "arguments": {"query": "astrolabe"}}</tool_call>'
    assert "Zephyrine Okonkwo" in env.step(Action(call)).feedback


def test_learn_search_preset_loads() -> None:
    cfg = load_config("learn_search")
    assert cfg.env.name == "search" and cfg.env.tool_options.search.top_k == 2
