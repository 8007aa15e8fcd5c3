"""Progress reporting hooks: agent_core reports phase progress; a front end (the CLI's rich
bars) may listen. Without a listener the calls cost nothing."""

from __future__ import annotations

from typing import Protocol


class ProgressSink(Protocol):
    """Receives phase progress (e.g. 'rollout' episodes finished, 'update' optimizer steps)."""

    def start(self, phase: str, total: int) -> None: ...

    def advance(self, phase: str, amount: int = 1) -> None: ...

    def finish(self, phase: str) -> None: ...


_SINK: ProgressSink | None = None


def set_sink(sink: ProgressSink | None) -> None:
    """Install (or with None remove) the process-wide progress listener."""
    global _SINK
    _SINK = sink


def start(phase: str, total: int) -> None:
    if _SINK is not None:
        _SINK.start(phase, total)


def advance(phase: str, amount: int = 1) -> None:
    if _SINK is not None:
        _SINK.advance(phase, amount)


def finish(phase: str) -> None:
    if _SINK is not None:
        _SINK.finish(phase)
