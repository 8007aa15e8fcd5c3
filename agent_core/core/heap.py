"""The process's C heap (glibc malloc), set once at process start: few arenas, and every block
of 256 KiB or more (a tensor's data) mapped on its own, so that freeing it returns it to the OS
at once instead of leaving it in an arena until `malloc_trim`."""

from __future__ import annotations

import contextlib
import ctypes
import os

# mallopt parameters (glibc's malloc.h)
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
# glibc's default is 8 arenas per core, one taken by each thread that allocates; their free
# space is not shared, so a phase's peak stacks the threads' leftovers
ARENAS = 2
# glibc's default starts at 128 KiB and rises to the largest block freed so far (up to 32 MiB),
# after which freed activations and logits stay in the arenas; a fixed threshold stops the rise
MMAP_THRESHOLD = 256 * 1024
# the environment variables that set the same (a user's own value wins)
ENV_OF = {M_ARENA_MAX: "MALLOC_ARENA_MAX", M_MMAP_THRESHOLD: "MALLOC_MMAP_THRESHOLD_"}


def settle_heap() -> dict[str, int]:
    """Cap the arenas and fix the mmap threshold, each unless its environment variable is set;
    returns what was set (by variable name), nothing where malloc is not glibc's."""
    done: dict[str, int] = {}
    with contextlib.suppress(OSError, AttributeError):  # AttributeError: not glibc
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: no library lookup
        for param, value in ((M_ARENA_MAX, ARENAS), (M_MMAP_THRESHOLD, MMAP_THRESHOLD)):
            name = ENV_OF[param]
            if name not in os.environ and mallopt(param, value) == 1:
                done[name] = value
    return done
