"""One agent-function episode in a process of its own (forked from a forkserver that imported
the agent's module once), in a session of its own whose process group is killed at the
deadline or the end: an agent that blocks, spins or leaves threads or child processes behind
stalls no other episode, and nothing of it outlives its iteration."""

from __future__ import annotations

import ast
import asyncio
import functools
import inspect
import multiprocessing
import os
import signal
import sys
import warnings
from contextlib import suppress
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import openai

from agent_core.core.records import Task
from agent_core.core.registry import resolve

KILL_WAIT_S = 5.0
# each episode's process runs a `python -m` main module again as '__mp_main__' (what
# multiprocessing does); runpy warns on every one that the module is loaded already (it is
# preloaded on purpose: main_imports). The forkserver imports this module, so they inherit this.
warnings.filterwarnings(
    "ignore", r"'.*' found in sys\.modules after import of package", RuntimeWarning, "runpy"
)


def _run_agent(agent: str, url: str, task: Task, timeout_s: float) -> Any:
    fn = resolve("agent", agent, {})
    options = {"base_url": url, "api_key": "steprl", "timeout": timeout_s, "max_retries": 0}
    if not inspect.iscoroutinefunction(fn):
        return fn(task, openai.OpenAI(**options))

    async def play() -> Any:
        async with openai.AsyncOpenAI(**options) as client:
            return await fn(task, client)

    return asyncio.run(play())


def _child(
    agent: str, url: str, task: Task, timeout_s: float, path: list[str], conn: Connection
) -> None:
    """The episode's process: the agent's result (a number or a string, else its type's name)
    or its error, sent to the rollout."""
    # its own session and process group, so the processes the agent starts (a tool's
    # subprocess, a shell) are killed with it; only one that starts a session of its own escapes
    os.setsid()
    # the rollout may import the agent from folders it added to sys.path after the forkserver
    # started (the server keeps the path it started with)
    sys.path[:0] = [p for p in path if p not in sys.path]
    try:
        result = _run_agent(agent, url, task, timeout_s)
        plain = isinstance(result, bool | int | float | str)
        message = ("ok", result) if plain else ("returned", type(result).__name__)
    except BaseException as exc:  # SystemExit included: every way the agent fails is reported
        message = ("error", repr(exc)[:2000])
    conn.send(message)
    conn.close()


@functools.cache
def _context(agent: str) -> multiprocessing.context.ForkServerContext:
    """The forkserver context; its server (started on first use) imports the agent's module
    and the OpenAI SDK once, so each episode's process starts in milliseconds. Forking the
    rollout process itself is unsafe (its engine and server threads hold locks). Made once per
    agent: the main module is read and parsed for its imports once, not per episode."""
    ctx = multiprocessing.get_context("forkserver")
    # the SDK's chat, completions and responses resources are imported on a client's first call
    sdk = ["openai", "openai.resources.chat.chat", "openai.resources.chat.completions",
           "openai.resources.completions", "openai.resources.responses.responses"]  # fmt: skip
    preload = ["__main__", __name__, *main_imports(), *sdk, agent.partition(":")[0]]
    ctx.set_forkserver_preload(preload)
    return ctx


def main_imports() -> list[str]:
    """The modules the main module needs, for the forkserver to import once. Each episode's
    process runs the main module again on starting (multiprocessing does, as '__mp_main__'),
    which is cheap only when its imports are loaded: without this, `python -m flows.train`
    or the `steprl` script cost every episode ~1.4 CPU-s and hundreds of MB of imports
    (Python 3.11's forkserver ignores its '__main__' preload: it reads a 'main_path' key its
    preparation data spells 'init_main_from_path')."""
    main = sys.modules["__main__"]
    name = getattr(main.__spec__, "name", None)
    if name:  # run with -m: the module itself
        return [name]
    try:  # a script: the modules its top level imports
        tree = ast.parse(Path(main.__file__).read_bytes())
    except (AttributeError, TypeError, OSError, SyntaxError, ValueError):
        return []  # no file (an interactive session, python -c)
    names = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


def _kill_group(pid: int) -> None:
    """Kill what is left of the episode's process group (its agent's children): after the
    agent's own process, so none is started meanwhile. The group's id is the episode process's
    pid, which Linux does not hand out again while the group has members."""
    with suppress(ProcessLookupError):  # no member left, or the child never reached setsid
        os.killpg(pid, signal.SIGKILL)


async def play(agent: str, url: str, task: Task, timeout_s: float) -> tuple[str, Any]:
    """('ok', result), ('returned', a type name) or ('error', repr) of `agent` on `task`;
    TimeoutError after `timeout_s`. The process is killed on the way out, whatever happened."""
    ctx = _context(agent)
    receiver, sender = ctx.Pipe(duplex=False)
    process = ctx.Process(
        target=_child, args=(agent, url, task, timeout_s, list(sys.path), sender), daemon=True,
        name=f"agent-{task.task_id}",
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(None, process.start)  # not on the loop: may start the server
        sender.close()  # the child holds the only sending end: its exit ends the pipe
        ready = loop.create_future()
        loop.add_reader(receiver.fileno(), lambda: ready.done() or ready.set_result(None))
        try:
            await asyncio.wait_for(ready, timeout_s)
        finally:
            loop.remove_reader(receiver.fileno())
        try:
            return receiver.recv()
        except EOFError:
            return "error", f"the agent's process died (exit code {process.exitcode})"
    finally:
        receiver.close()
        if process.pid is not None:
            process.kill()
            _kill_group(process.pid)
            await loop.run_in_executor(None, process.join, KILL_WAIT_S)
            if process.exitcode is not None:
                process.close()
