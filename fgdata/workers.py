"""How many worker processes a job uses when the user does not say: one per CPU this process may run on.

Kept at the top, apart from every command, so that each job (prepare, fid-refs, ...) takes the same default
without importing another command's code.
"""

from __future__ import annotations

import os


def default_workers() -> int:
    """The CPUs this process may run on (its affinity where the OS has one, else all), at least 1."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
