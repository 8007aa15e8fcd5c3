"""The `python` sandbox tool: results, limits, isolation; a ToolEnv episode survives attacks."""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_core.core.records import Action, StepResult, Task
from agent_core.envs.tool_env import ToolEnv
from agent_core.tools import TOOLS
from agent_core.tools.python import PythonTool
from agent_core.tools.sandbox.levels import UID_BASE
from agent_core.tools.sandbox.run import sandbox_problem

PROBLEM = sandbox_problem("namespaces")
LEVEL = "namespaces"
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"no namespaces here: {PROBLEM}")
REPO_FILE = Path(__file__).resolve().parents[2] / "pyproject.toml"

FORK_BOMB = "import os\nwhile True:\n    os.fork()"
MEMORY_HOG = "x = bytearray(2 * 1024**3)\nprint(len(x))"
READ_PROJECT = f"print(open({str(REPO_FILE)!r}).read())"
HUGE_OUTPUT = "print('x' * 1_000_000)"
# Five children of 100 MB each: every process stays under a 256 MB RLIMIT_AS, the call does not.
FORKED_HOGS = """
import os, time
children = []
for _ in range(5):
    pid = os.fork()
    if pid == 0:
        block = b"x" * (100 * 1024 * 1024)  # written, so resident
        time.sleep(10)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
print("500 MB in five children")
"""


class PythonEnv(ToolEnv):
    """A minimal concrete ToolEnv with only the python tool."""

    name = "python_test"

    @classmethod
    def make_task(cls, seed: int) -> Task:
        return Task(task_id=f"python-{seed}", prompt="Compute 2 ** 10 with the python tool.")


@pytest.fixture(scope="module")
def tool() -> PythonTool:
    return PythonTool(timeout_s=2)


def _sandbox_processes() -> list[int]:
    """Host pids running as a sandbox uid (there must be none once a call returned; zombies
    waiting for the host's init to reap them hold nothing and are not counted)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:  # the process exited while we looked
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) >= UID_BASE and fields["State"].strip()[0] not in "ZX":
            found.append(int(entry.name))
    return found


def test_registered_and_prints_result(tool: PythonTool) -> None:
    assert TOOLS["python"] is PythonTool
    result = tool.run({"code": "print(6 * 7)"})
    assert not result.error
    assert result.text.strip() == "42"
    assert result.info["exit_code"] == 0
    assert result.info["timed_out"] is False and result.info["killed_by"] is None
    assert result.info["sandbox"].startswith(f"{LEVEL}:")


def test_errors_are_observations_not_exceptions(tool: PythonTool) -> None:
    crash = tool.run({"code": "1 / 0"})
    assert crash.error and crash.text.startswith("Error: exit code 1")
    assert "ZeroDivisionError" in crash.text
    silent = tool.run({"code": "x = 1"})
    assert not silent.error and "no output" in silent.text
    for bad in ({"code": 5}, {}, {"code": "x", "extra": 1}, ["print(1)"], {"code": "x" * 20_001}):
        result = tool.run(bad)
        assert result.error and result.text.startswith("Error:")


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        PythonTool(timeout_s=0)
    with pytest.raises(ValueError, match="isolation"):
        PythonTool(isolation="docker")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("code", "killed_by"),
    [
        ("import time\ntime.sleep(60)", {"timeout"}),
        ("while True:\n    pass", {"timeout", "SIGXCPU"}),  # whichever limit fires first
    ],
)
def test_runaway_program_is_stopped(code: str, killed_by: set[str]) -> None:
    tool = PythonTool(timeout_s=1)
    start = time.monotonic()
    result = tool.run({"code": code})
    assert time.monotonic() - start < 1 + 3  # timeout plus slack for a loaded machine
    assert result.error and result.text.startswith("Error:")
    assert result.info["killed_by"] in killed_by
    assert _sandbox_processes() == []


def test_fork_bomb_is_contained_and_next_call_works(tool: PythonTool) -> None:
    result = tool.run({"code": FORK_BOMB})
    assert result.error and result.text.startswith("Error:")
    assert "BlockingIOError" in result.text or result.info["killed_by"] == "timeout"
    assert _sandbox_processes() == []
    assert subprocess.run(["true"], check=False).returncode == 0  # the host can still fork
    assert tool.run({"code": "print('alive')"}).text.strip() == "alive"


def test_memory_hog_is_stopped(tool: PythonTool) -> None:
    result = tool.run({"code": MEMORY_HOG})
    assert result.error and "MemoryError" in result.text


def test_memory_limit_holds_for_the_whole_call_not_per_process() -> None:
    tool = PythonTool(timeout_s=15, memory_mb=256)
    start = time.monotonic()
    result = tool.run({"code": FORKED_HOGS})
    assert result.error and result.info["killed_by"] == "memory", result.text
    assert "500 MB in five children" not in result.text
    # by /proc polling "(limit 256MB)"; by a root's memory cgroup "... memory_mb 256MB + ..."
    assert "(limit 256MB)" in result.text or "= memory_mb 256MB + scratch_mb" in result.text
    assert time.monotonic() - start < 8  # stopped while the children held their memory
    assert _sandbox_processes() == []
    assert tool.run({"code": "print('alive')"}).text.strip() == "alive"


def test_one_process_makes_the_address_space_limit_the_whole_calls() -> None:
    tool = PythonTool(timeout_s=5, memory_mb=128, max_processes=1)
    assert "BlockingIOError" in tool.run({"code": "import os\nos.fork()"}).text
    thread = "import threading\nthreading.Thread(target=print).start()"
    assert "can't start new thread" in tool.run({"code": thread}).text
    assert "MemoryError" in tool.run({"code": "x = b'x' * (200 * 1024 * 1024)"}).text
    assert tool.run({"code": "print(6 * 7)"}).text.strip() == "42"


def test_file_size_and_fresh_scratch(tool: PythonTool) -> None:
    big = tool.run({"code": "open('big', 'wb').write(b'x' * (64 * 1024 * 1024))"})
    assert big.error and "File too large" in big.text
    tool.run({"code": "open('note.txt', 'w').write('hi')"})
    again = tool.run({"code": "import os\nprint(sorted(os.listdir('.')))"})
    assert again.text.strip() == "['main.py']"  # each call starts with an empty scratch dir


def test_huge_output_is_truncated(tool: PythonTool) -> None:
    result = tool.run({"code": HUGE_OUTPUT})
    assert not result.error and result.info["truncated"] is True
    assert result.info["output_bytes"] == 1_000_001
    assert "[output truncated: 1000001 bytes" in result.text
    assert len(result.text) < tool.limits.output_chars + 200


def test_environment_is_minimal(tool: PythonTool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STEPRL_TEST_SECRET", "hunter2")
    result = tool.run({"code": "import os\nprint(sorted(os.environ))"})
    assert "STEPRL_TEST_SECRET" not in result.text
    assert result.text.strip() == str(
        sorted(["HOME", "LANG", "MALLOC_ARENA_MAX", "PATH", "TMPDIR"])
    )


def test_network_is_blocked(tool: PythonTool) -> None:
    with socket.socket() as server:  # a real listener: a leaky sandbox would reach it
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.2)
        port = server.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"
        result = tool.run({"code": code})
        assert result.error and result.text.startswith("Error: exit code 1")
        assert "Error" in result.text.splitlines()[-1]  # the exception is shown to the model
        with pytest.raises(TimeoutError):
            server.accept()


def test_sockets_inside_the_call_and_asyncio_still_work(tool: PythonTool) -> None:
    """The filter refuses what reaches outside or hides memory, not a socket pair or asyncio."""
    code = (
        "import asyncio, socket\nleft, right = socket.socketpair()\nleft.send(b'hi')\n"
        "print(right.recv(2).decode(), asyncio.run(asyncio.sleep(0, 'ok')))"
    )
    result = tool.run({"code": code})
    assert result.text.split() == ["hi", "ok"], result.text
    hidden = tool.run({"code": "import os\nos.memfd_create('x')"})
    assert hidden.error and "PermissionError" in hidden.text


def test_project_and_host_files_are_invisible(tool: PythonTool) -> None:
    assert REPO_FILE.is_file()
    result = tool.run({"code": READ_PROJECT})
    assert result.error and "FileNotFoundError" in result.text
    listing = tool.run({"code": "import os\nprint(sorted(os.listdir('/')))"})
    system = {"bin", "dev", "lib", "lib32", "lib64", "libx32", "sbin", "usr", "tmp", "sandbox"}
    prefix_top = Path(os.path.realpath(sys.executable)).parts[1]  # e.g. 'root' for pyenv
    assert set(ast.literal_eval(listing.text)) <= system | {prefix_top}
    for path in ("/etc/passwd", "/proc/1/environ", "/work", os.path.expanduser("~/.bashrc")):
        probe = tool.run({"code": f"import os\nos.stat({path!r})"})
        assert probe.error and "FileNotFoundError" in probe.text, path
    uid = tool.run({"code": "import os\nprint(os.getuid())"})
    assert int(uid.text) >= UID_BASE


@pytest.mark.slow
def test_tool_env_episode_survives_every_attack() -> None:
    env = PythonEnv([PythonTool(timeout_s=1)], max_steps=20, tool_timeout_s=10)
    env.reset(PythonEnv.make_task(0))
    attacks = [
        FORK_BOMB,
        MEMORY_HOG,
        READ_PROJECT,
        "while True:\n    pass",
        "import os; os._exit(3)",
    ]
    attacks.append("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)")
    for code in attacks:
        call = json.dumps({"name": "python", "arguments": {"code": code}})
        step = env.step(Action(text=f"<tool_call>{call}</tool_call>"))
        assert isinstance(step, StepResult) and not step.done
        assert step.feedback.startswith("Error:"), code
    call = json.dumps({"name": "python", "arguments": {"code": HUGE_OUTPUT}})
    step = env.step(Action(text=f"<tool_call>{call}</tool_call>"))
    assert not step.done and "[output truncated" in step.feedback
    call = json.dumps({"name": "python", "arguments": {"code": "print(2 ** 10)"}})
    step = env.step(Action(text=f"<tool_call>{call}</tool_call>"))
    assert step.feedback == "1024\n" or step.feedback.strip() == "1024"
    final = env.step(Action(text="Answer: 1024"))
    assert final.done and final.info["tool_calls_ok"] == 2
    assert _sandbox_processes() == []
