"""The process's C heap (glibc malloc) and oneDNN's kernel caches, set once at process start:
every block of 4 MiB or more (logits, activations, KV caches) mapped on its own, so that
freeing it returns it to the OS at once instead of leaving it in an arena until `malloc_trim`;
smaller blocks are reused from the arenas (mapping those too cost a full fine-tune step twice
its time in page faults); a trainer may map smaller ones while it trains (`training_heap`,
trainer.mmap_threshold_mib). oneDNN's primitive caches (the bf16 matmuls' kernels, one per
shape) keep a few dozen shapes instead of a thousand."""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc's default starts at 128 KiB and rises to the largest block freed so far (up to 32 MiB),
# after which freed activations and logits stay in the arenas; a fixed threshold stops the rise.
# A lower one maps every tensor and pays a page fault per page of each; the arena count is left
# at glibc's (a cap slowed steps and lowered no peak): the measured trade in docs/scaling.md
MMAP_THRESHOLD = 4 * 1024 * 1024
# a free arena top above this goes back to the OS (glibc's dynamic rule: twice the threshold)
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD
# (environment variable that sets the same, and wins; mallopt parameter; value; while a trainer
# trains with trainer.mmap_threshold_mib set: that many times it)
SETTINGS = (
    ("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, MMAP_THRESHOLD, 1),
    ("MALLOC_TRIM_THRESHOLD_", M_TRIM_THRESHOLD, TRIM_THRESHOLD, 2),
)
# oneDNN's primitive cache and ideep's (PyTorch's oneDNN layer) hold a compiled kernel and its
# buffers per matmul shape, 1024 shapes each by default: a run's micro-batches and prompts are
# of ever new lengths, so they fill with kernels never used again. A shape's forward and
# backward reuse theirs within these capacities. Each library reads its variable at its first
# kernel, so they are set before any (the environment wins). Measured: the 135M model's update
# peaked about 2 bytes per parameter lower (docs/scaling.md)
KERNEL_CACHES = (("ONEDNN_PRIMITIVE_CACHE_CAPACITY", 32), ("LRU_CACHE_CAPACITY", 16))

# (mallopt parameter, value, multiple) of each threshold settle_heap fixed in this process:
# training_heap moves only those
_SETTLED: list[tuple[int, int, int]] = []


def settle_heap() -> dict[str, int]:
    """Fix the mmap and trim thresholds and the kernel caches' capacities, each unless its
    environment variable is set; returns what was set (by variable name); no threshold where
    malloc is not glibc's."""
    done: dict[str, int] = {}
    for name, capacity in KERNEL_CACHES:
        if name not in os.environ:
            os.environ[name] = str(capacity)  # a local Ray's workers and ranks inherit it
            done[name] = capacity
    with contextlib.suppress(OSError, AttributeError):  # AttributeError: not glibc
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: no library lookup
        for name, param, value, multiple in SETTINGS:
            if name not in os.environ and mallopt(param, value) == 1:
                done[name] = value
                _SETTLED.append((param, value, multiple))
    return done


@contextlib.contextmanager
def training_heap(mmap_threshold: int | None) -> Iterator[None]:
    """While a trainer trains: blocks of `mmap_threshold` bytes or more mapped on their own and
    a trim threshold of twice that (None: nothing changes), each threshold only where
    `settle_heap` fixed it (glibc's or the user's stay as they are), back to the process's
    after. Process-wide: a collection sampling meanwhile in another thread maps them too."""
    if mmap_threshold is None or not _SETTLED:
        yield
        return
    mallopt = ctypes.CDLL(None).mallopt
    for param, _, multiple in _SETTLED:
        mallopt(param, multiple * mmap_threshold)
    try:
        yield
    finally:
        for param, value, _ in _SETTLED:
            mallopt(param, value)
