"""`settle_heap` sets glibc's mmap and trim thresholds and oneDNN's kernel-cache capacities at
process start, leaving each alone where the user's environment sets it; `training_heap` maps
smaller blocks while a trainer trains and puts the thresholds back after."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agent_core.core import heap

GLIBC = os.uname().sysname == "Linux"
SETTLE = (
    "import json; from agent_core.core.heap import settle_heap; print(json.dumps(settle_heap()))"
)


def _clean_env() -> dict[str, str]:
    """This process's environment without the variables settle_heap would leave alone."""
    names = {name for name, *_ in heap.SETTINGS} | {name for name, _ in heap.KERNEL_CACHES}
    return {k: v for k, v in os.environ.items() if k not in names}


def _settled(env: dict[str, str]) -> dict[str, int]:
    """What `settle_heap` sets in a fresh process with `env` (mallopt is process-wide)."""
    out = subprocess.run(
        [sys.executable, "-c", SETTLE], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")
def test_every_setting_is_set_at_start() -> None:
    assert _settled(_clean_env()) == {
        "MALLOC_MMAP_THRESHOLD_": heap.MMAP_THRESHOLD,
        "MALLOC_TRIM_THRESHOLD_": heap.TRIM_THRESHOLD,
        **dict(heap.KERNEL_CACHES),
    }


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")
def test_a_users_environment_variable_wins() -> None:
    env = {**_clean_env(), "MALLOC_MMAP_THRESHOLD_": "65536", "LRU_CACHE_CAPACITY": "1024"}
    assert _settled(env) == {
        "MALLOC_TRIM_THRESHOLD_": heap.TRIM_THRESHOLD,
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": 32,
    }


# a 3 MiB block, between a 1 MiB training threshold and the process's: mapped on its own while
# training, from the arena otherwise (a fresh process's arena top is smaller than the block, so
# it comes from the heap's growth, where the threshold decides)
MAPPED = """
import ctypes, json
from agent_core.core.heap import settle_heap, training_heap

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype, libc.malloc.restype = Info, ctypes.c_void_p
settle_heap() if SETTLE else None

def mapped():
    before = libc.mallinfo2().hblks
    block = libc.malloc(3 * 2**20)
    now = libc.mallinfo2().hblks
    libc.free(ctypes.c_void_p(block))
    return now > before

with training_heap(2**20):
    training = mapped()
with training_heap(None):
    unset = mapped()
print(json.dumps([training, unset, mapped()]))
"""


def _mapped(settle: bool, env: dict[str, str]) -> list[bool]:
    """Whether a 3 MiB block is mapped while training at 1 MiB, while training without a
    threshold of its own, and after, in a fresh process."""
    code = MAPPED.replace("SETTLE", str(settle))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt and mallinfo2")
def test_training_maps_smaller_blocks_and_puts_the_threshold_back() -> None:
    assert _mapped(True, _clean_env()) == [True, False, False]


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt and mallinfo2")
def test_training_leaves_a_threshold_it_did_not_set() -> None:
    # the user's threshold (8 MiB), with settle_heap (the steprl command) or without (a
    # library user's process): the block stays in the arena while training too
    env = {**_clean_env(), "MALLOC_MMAP_THRESHOLD_": str(8 * 2**20)}
    assert _mapped(True, env) == [False, False, False]
    assert _mapped(False, env) == [False, False, False]
