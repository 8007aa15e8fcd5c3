"""Telling a silent actor from a busy one: a rollout worker or trainer rank answers heartbeats
on a thread of its own while a long call runs, so one that stops answering (a stopped or
frozen process, which Ray still takes for alive) is found in seconds, not at the phase timeout.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

HEALTH = "health"  # the actors' concurrency group for heartbeats, beside their one call thread


def actor_class(cls: type) -> Any:
    """`cls` as a Ray actor class whose `heartbeat` method can answer while another runs."""
    import ray

    return ray.remote(concurrency_groups={HEALTH: 1})(cls)


def identity() -> str:
    """How an actor names itself in errors: its process id and node."""
    import ray

    return f"pid {os.getpid()} on {ray.util.get_node_ip_address()}"


class Heartbeats:
    """Pings `actors` while the caller waits on their long calls: an actor is silent once its
    ping has gone unanswered for `interval_s` (its first ping may take `first_s`: an actor
    Ray is still starting answers only once its process is up). Each answered ping is
    followed by the next at the caller's next check."""

    def __init__(self, actors: list[Any], interval_s: float, first_s: float) -> None:
        self.actors = actors
        self.interval_s = interval_s
        self.names = ["(pid unknown: it never answered)"] * len(actors)
        self._allowed = [max(interval_s, first_s)] * len(actors)
        self._pings = [self._ping(i) for i in range(len(actors))]

    def _ping(self, i: int) -> tuple[Any, float]:
        return self.actors[i].heartbeat.options(concurrency_group=HEALTH).remote(), time.monotonic()

    def silent(self) -> list[int]:
        """Indexes of the actors whose ping is unanswered past the allowed time."""
        import ray

        silent = []
        for i, (ping, sent_at) in enumerate(self._pings):
            if ray.wait([ping], timeout=0)[0]:
                # a dead actor's ping fails: its long call reports that itself
                with contextlib.suppress(Exception):
                    self.names[i] = ray.get(ping)
                self._allowed[i] = self.interval_s
                self._pings[i] = self._ping(i)
            elif time.monotonic() - sent_at >= self._allowed[i]:
                silent.append(i)
        return silent


class SilentActorError(TimeoutError):
    """Actor `index` (named `name`: pid and node) answered no heartbeat within the interval
    while its call ran."""

    def __init__(self, index: int, name: str, interval_s: float) -> None:
        self.index, self.name = index, name
        super().__init__(
            f"{name} answered no heartbeat within ray.heartbeat_timeout_s={interval_s:g} s "
            "(a stopped or frozen process)"
        )


class CallTimeoutError(TimeoutError):
    """The calls of actors `pending` (indexes) were still running at the phase timeout,
    though those actors kept answering heartbeats."""

    def __init__(self, pending: list[int], timeout_s: float) -> None:
        self.pending = pending
        super().__init__(f"still running after {timeout_s:g} s")


def ready_in_turn(
    refs: list[Any], actors: list[Any], timeout_s: float, interval_s: float, first_s: float
) -> Iterator[int]:
    """Yields the index of each call `refs[i]` (running on `actors[i]`) as it finishes,
    successfully or not (the caller fetches it). Raises SilentActorError for the first
    actor with a call still running that stops answering heartbeats, and CallTimeoutError
    when calls are still running after `timeout_s`."""
    import ray

    beats = Heartbeats(actors, interval_s, first_s)
    deadline = time.monotonic() + timeout_s
    pending = list(refs)
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CallTimeoutError(sorted(refs.index(r) for r in pending), timeout_s)
        # checked twice per interval: a stall is found within about twice the interval
        ready, pending = ray.wait(pending, timeout=min(interval_s / 2, left))
        yield from (refs.index(r) for r in ready)
        running = {refs.index(r) for r in pending}
        for i in beats.silent():
            if i in running:
                raise SilentActorError(i, beats.names[i], interval_s)
