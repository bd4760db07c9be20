"""The cores this process may use: its CPU affinity, within its cgroup's CPU quota.

``os.cpu_count()`` counts the machine's cores. A Kubernetes pod limited to 8
CPUs on a node of 64 would run 64 threads, each given an eighth of a core's
time. Dask's ``dask.system.cpu_count`` does the same as this module, but
importing it imports Dask, which a training process reading piles does not
need.
"""

from __future__ import annotations

import math
import os


def available_cores() -> int:
    """The cores this process may run on: ``os.cpu_count()``, less what its affinity or cgroup quota allows.

    >>> 1 <= available_cores() <= (os.cpu_count() or 1)
    True
    """
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_quota()
    return max(1, min(count, math.ceil(quota))) if quota else max(1, count)


def _cgroup_quota() -> float | None:
    """The cores' worth of CPU time the process's cgroup may use (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``); None
    without a limit, or off Linux.  The group is the process's own (``/proc/self/cgroup``), as mounted: inside a
    container, its root."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, controllers, group = line.split(":", 2)
        group = group.rstrip("/")
        if not controllers:  # v2: "0::/group"
            limits += [_read_quota(f"/sys/fs/cgroup{g}/cpu.max") for g in (group, "")]
        elif "cpu" in controllers.split(","):  # v1: "4:cpu,cpuacct:/group", mounted under either name
            for mount in (controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"):
                limits += [_read_quota(f"/sys/fs/cgroup/{mount}{g}/cpu.cfs_quota_us") for g in (group, "")]
    limits = [limit for limit in limits if limit is not None]
    return min(limits) if limits else None


def _read_quota(path: str) -> float | None:
    """Cores of CPU time a ``cpu.max`` ("quota period", or "max") or a ``cpu.cfs_quota_us`` (-1: none) allows."""
    try:
        with open(path) as f:
            words = f.read().split()
        if path.endswith("cpu.max"):
            return None if words[0] == "max" else int(words[0]) / int(words[1])
        quota = int(words[0])
        with open(path.replace("cfs_quota_us", "cfs_period_us")) as f:
            period = int(f.read())
    except (OSError, ValueError, IndexError):
        return None
    return quota / period if quota > 0 else None
