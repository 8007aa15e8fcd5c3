"""`RequestBatcher`: gathers generate requests that arrive within a short window into one
batched `RolloutEngine.generate` call, run on one engine thread (a request that arrives while a
batch decodes waits for the next batch), and passes each request its tokens as they are sampled
when it asks and the engine streams."""

from __future__ import annotations

import asyncio
import inspect
import secrets
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from agent_core.rollout.engine import Generation, RolloutEngine, SamplingParams, StepCallback

T = TypeVar("T")
# (the request's prompt index, a token it sampled, its log-prob), called on the event loop
TokenCallback = Callable[[int, int, float], None]


class EngineError(RuntimeError):
    """The engine failed on a request (alone, not because of its batch companions)."""


@dataclass
class _Request:
    prompts: list[list[int]]
    params: SamplingParams
    seeded: bool
    future: asyncio.Future
    on_tokens: TokenCallback | None = None
    streamed: bool = False  # tokens reached on_tokens (so the request cannot be retried)


class RequestBatcher:
    """Batches concurrent requests into engine calls; `calls` counts the engine calls made.

    Requests with equal sampling parameters share a call. Unseeded requests get one fresh
    random seed per call (so repeated requests differ); a seeded request is batched only with
    requests of the same seed, and its sample then depends on its batch companions.
    """

    def __init__(self, engine: RolloutEngine, window_s: float = 0.01, max_batch: int = 64) -> None:
        self.engine, self.window_s, self.max_batch = engine, window_s, max_batch
        self.calls = 0
        self.batch_sizes: list[int] = []
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="policy-engine")
        self._queue: asyncio.Queue[_Request] | None = None
        self._worker: asyncio.Task | None = None
        self.streams = "on_step" in inspect.signature(engine.generate).parameters

    async def generate(
        self, prompts: list[list[int]], params: SamplingParams, seeded: bool,
        on_tokens: TokenCallback | None = None,
    ) -> list[Generation]:  # fmt: skip
        """One generation per prompt, sampled in a batch with whatever else is pending;
        `on_tokens` sees its tokens as they are sampled when the engine streams (else none)."""
        if self._queue is None or self._worker is None or self._worker.done():
            self._queue = asyncio.Queue()
            self._worker = asyncio.get_running_loop().create_task(self._run(self._queue))
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Request(prompts, params, seeded, future, on_tokens))
        return await future

    async def exclusive(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` on the engine thread, between batches (e.g. a scoring forward)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _run(self, queue: asyncio.Queue[_Request]) -> None:
        while True:
            pending = [await queue.get()]
            await asyncio.sleep(self.window_s)
            size = len(pending[0].prompts)
            while not queue.empty() and size < self.max_batch:
                pending.append(queue.get_nowait())
                size += len(pending[-1].prompts)
            groups: dict[SamplingParams, list[_Request]] = {}
            for request in pending:
                key = request.params if request.seeded else replace(request.params, seed=-1)
                groups.setdefault(key, []).append(request)
            for key, group in groups.items():
                await self._call(key, group)

    async def _call(self, key: SamplingParams, group: list[_Request]) -> None:
        params = key if key.seed != -1 else replace(key, seed=secrets.randbits(31))
        prompts = [p for request in group for p in request.prompts]
        self.calls += 1
        self.batch_sizes.append(len(prompts))
        try:
            if self.streams and any(r.on_tokens for r in group):
                step = self._step_callback(group)
                out = await self.exclusive(self.engine.generate, prompts, params, step)
            else:
                out = await self.exclusive(self.engine.generate, prompts, params)
        except Exception as exc:
            error = EngineError(f"the engine failed on this request: {exc!r}"[:2000])
            # a request that streamed tokens has sent them: it fails rather than start over
            for request in [r for r in group if r.streamed and not r.future.done()]:
                request.future.set_exception(error)
            group = [r for r in group if not r.future.done()]
            if len(group) > 1:  # one request's prompt can fail the whole call: retry each
                for request in group:  # alone, so that only its own caller gets the error
                    await self._call(key, [request])
                return
            if group:
                group[0].future.set_exception(error)
            return
        start = 0
        for request in group:
            if not request.future.done():
                request.future.set_result(out[start : start + len(request.prompts)])
            start += len(request.prompts)

    def _step_callback(self, group: list[_Request]) -> StepCallback:
        """The engine's per-step callback for `group`: hands each row's token to its request's
        `on_tokens` on the event loop (the engine calls it from its own thread)."""
        loop = asyncio.get_running_loop()
        owners = [(r, i) for r in group for i in range(len(r.prompts))]

        def dispatch(rows: list[int], tokens: list[int], logprobs: list[float]) -> None:
            for row, token, logprob in zip(rows, tokens, logprobs, strict=True):
                request, index = owners[row]
                if request.on_tokens is not None and not request.future.done():
                    request.streamed = True
                    request.on_tokens(index, token, logprob)

        return lambda *step: loop.call_soon_threadsafe(dispatch, *step)
