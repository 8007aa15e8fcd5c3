"""Settings of the `search` tool (`env.tool_options.search`): which corpus, how many passages."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SearchToolOptions(BaseModel):
    """BM25 search over a corpus file (the index is built once per corpus and process)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)

    corpus: str = Field(
        "generated",
        description="The corpus: a .jsonl, .parquet or .csv file with a `text` column (and "
        "optionally `title`), one passage a row; 'generated' = the invented-entities corpus "
        "shipped with the search env.",
    )
    top_k: int = Field(3, ge=1, le=20, description="Passages returned for one query.")
    max_chars: int = Field(
        1200, ge=100, description="Characters of the observation (passages are cut to fit)."
    )
