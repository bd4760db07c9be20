"""The cores this process may use: its CPU affinity, within its cgroup's CPU quota.

``os.cpu_count()`` counts the machine's cores. A Kubernetes pod limited to 8
CPUs on a node of 64 would run 64 threads, each given an eighth of a core's
time. Dask's ``dask.system.cpu_count`` is much the same, but reads only the
v1 groups mounted as ``cpu,cpuacct`` and the process's own group, not its
ancestors' (a systemd slice's or a batch job's quota); and importing it
imports Dask, which a training process reading piles does not need.
"""

from __future__ import annotations

import math
import os


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity, within its cgroup's CPU quota (rounded up).

    >>> 1 <= available_cores() <= (os.cpu_count() or 1)
    True
    """
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_quota()
    return max(1, min(count, math.ceil(quota))) if quota else count


def pinned() -> bool:
    """Whether this process may run on fewer than all the machine's cores (``taskset``, a launcher's binding).

    >>> isinstance(pinned(), bool)
    True
    """
    return hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) < (os.cpu_count() or 1)


def _cgroup_quota() -> float | None:
    """The cores' worth of CPU time the process's cgroup and its ancestors may use, the least of their quotas
    (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``); None without a limit, or off Linux.  Each group is looked for
    where it is mounted, and its path also from the mount's root (inside a container, the group is the root)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    quotas = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:  # not a cgroup line as the kernel writes them
            continue
        _, controllers, group = parts
        if not controllers:  # v2: "0::/group"
            quotas += [_v2_quota(f"/sys/fs/cgroup{g}") for g in _and_ancestors(group)]
        elif "cpu" in controllers.split(","):  # v1: "4:cpu,cpuacct:/group", mounted under either name
            for mount in dict.fromkeys((controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu")):
                quotas += [_v1_quota(f"/sys/fs/cgroup/{mount}{g}") for g in _and_ancestors(group)]
    quotas = [quota for quota in quotas if quota is not None]
    return min(quotas) if quotas else None


def _and_ancestors(group: str) -> list[str]:
    """A group and the groups above it, to the root.

    >>> _and_ancestors("/a/b"), _and_ancestors("/")
    (['/a/b', '/a', ''], [''])
    """
    parts = [part for part in group.split("/") if part]
    return ["/" + "/".join(parts[:i]) if i else "" for i in range(len(parts), -1, -1)]


def _v2_quota(directory: str) -> float | None:
    """Cores of CPU time a v2 group's ``cpu.max`` ("quota period", or "max ...") allows."""
    try:
        with open(f"{directory}/cpu.max") as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _v1_quota(directory: str) -> float | None:
    """Cores of CPU time a v1 group's ``cpu.cfs_quota_us`` (-1: none) over its period allows."""
    try:
        with open(f"{directory}/cpu.cfs_quota_us") as f:
            quota = int(f.read())
        with open(f"{directory}/cpu.cfs_period_us") as f:
            period = int(f.read())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 else None
