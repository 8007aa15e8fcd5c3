"""Hidden unit tests of model-written code, run in the python sandbox and judged on the host.

Inside the sandbox a harness forks one child per test; the child silences its stdout/stderr,
runs the solution and the test's call, and sends the value's JSON through a pipe of its own;
the harness kills a child at its deadline and prints every outcome under a nonce. The expected
values never enter the sandbox: the host compares them, so a solution that exits early, forges
output or overrides `__eq__` gains nothing.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from agent_core.tools.python import PythonTool

HARNESS = """
import json, os, select, signal, sys, time
SOLUTION = {solution!r}
CALLS = {calls!r}
LIMIT_S = {limit_s!r}
MAX_BYTES = 65536

def run(call):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        try:
            namespace = {{"__name__": "solution"}}
            exec(compile(SOLUTION, "solution.py", "exec"), namespace)
            message = json.dumps({{"value": eval(call, namespace)}})
        except BaseException as exc:
            message = json.dumps({{"error": type(exc).__name__}})
        os.write(write, message.encode()[:MAX_BYTES])
        os._exit(0)
    os.close(write)
    data, deadline = b"", time.monotonic() + LIMIT_S
    while len(data) <= MAX_BYTES:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([read], [], [], left)[0]:
            data = None
            break
        chunk = os.read(read, MAX_BYTES)
        if not chunk:
            break
        data += chunk
    os.kill(pid, signal.SIGKILL) if data is None else None
    os.close(read)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    if data is None:
        return {{"error": "timeout"}}
    try:
        return json.loads(data)
    except ValueError:
        return {{"error": "no result"}}

print({nonce!r}, json.dumps([run(call) for call in CALLS]))
"""


@dataclass(frozen=True)
class HiddenTestsResult:
    """The outcome of one solution against its hidden tests."""

    passed: int
    total: int
    failures: list[str]  # one short reason per failed test

    @property
    def score(self) -> float:
        return self.passed / self.total if self.total else 0.0


def canonical(value: Any) -> str:
    """A value's JSON text: equal only for the same types and contents (1 != 1.0 != True)."""
    return json.dumps(value, sort_keys=True)


def harness_program(solution: str, calls: list[str], limit_s: float, nonce: str) -> str:
    """The sandbox program that runs `calls` against `solution` (nothing else in it)."""
    return HARNESS.format(solution=solution, calls=calls, limit_s=limit_s, nonce=nonce)


def judge(output: str, nonce: str, tests: list[dict[str, Any]]) -> HiddenTestsResult:
    """Compare the harness's report (the line under `nonce`) with the expected values."""
    lines = [line for line in output.splitlines() if line.startswith(nonce + " ")]
    try:
        outcomes = json.loads(lines[-1][len(nonce) + 1 :]) if lines else None
    except ValueError:
        outcomes = None
    if not isinstance(outcomes, list) or len(outcomes) != len(tests):
        reason = output.strip().splitlines()[0] if output.strip() else "no report"
        return HiddenTestsResult(0, len(tests), [f"the tests did not run: {reason}"[:200]])
    failures = []
    for test, outcome in zip(tests, outcomes, strict=True):
        if not isinstance(outcome, dict) or "value" not in outcome:
            error = outcome.get("error", "no result") if isinstance(outcome, dict) else "?"
            failures.append(f"{test['call']}: {error}")
        elif canonical(outcome["value"]) != canonical(test["expected"]):
            failures.append(f"{test['call']}: wrong value")
    return HiddenTestsResult(len(tests) - len(failures), len(tests), failures)


def run_hidden_tests(
    tool: PythonTool, solution: str, tests: list[dict[str, Any]], limit_s: float
) -> HiddenTestsResult:
    """Run `solution` against `tests` in `tool`'s sandbox (each test at most `limit_s`)."""
    if not tests:
        return HiddenTestsResult(0, 0, ["the task has no tests"])
    nonce = secrets.token_hex(16)
    program = harness_program(solution, [t["call"] for t in tests], limit_s, nonce)
    result = tool.execute({"code": program})
    return judge(result.text, nonce, tests)
