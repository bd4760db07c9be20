"""daskpile._cores: the cores a process may use, under a real CPU affinity and a real cgroup CPU quota."""

import os
import subprocess
import sys
import uuid

import pytest

from daskpile._cores import available_cores

ASK = "from daskpile._cores import available_cores, pinned; print(available_cores(), pinned())"


def test_a_process_pinned_to_one_core_has_one():
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    pin = f"import os; os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}}); {ASK}"
    said = subprocess.run([sys.executable, "-c", pin], capture_output=True, text=True, check=True).stdout
    assert said == f"1 {(os.cpu_count() or 1) > 1}\n"
    assert 1 <= available_cores() <= len(os.sched_getaffinity(0))  # (a quota may allow fewer)


def _cpu_cgroup(quota_cores: float | None, parent: str | None = None) -> str:
    """A new cgroup (under ``parent``) limited to ``quota_cores`` of CPU time (None: no limit of its own), with
    the v1 cpu controller or v2; skips where cgroups cannot be made (not root, read-only)."""
    name = f"daskpile-test-{uuid.uuid4().hex[:8]}"
    v1, v2 = "/sys/fs/cgroup/cpu", "/sys/fs/cgroup"
    if os.path.exists(f"{v1}/cpu.cfs_quota_us"):
        group = f"{parent or v1}/{name}"
        limit = ("cpu.cfs_quota_us", None if quota_cores is None else str(int(quota_cores * 100_000)))
        setup = [("cpu.cfs_period_us", "100000"), limit]
    elif os.path.exists(f"{v2}/cgroup.controllers"):
        group = f"{parent or v2}/{name}"
        setup = [("cpu.max", None if quota_cores is None else f"{int(quota_cores * 100_000)} 100000")]
    else:
        pytest.skip("no cgroup CPU controller mounted")
    try:
        os.mkdir(group)
    except OSError as error:
        pytest.skip(f"cannot make a cgroup here: {error}")
    try:
        for file, value in setup:
            if value is not None:
                with open(f"{group}/{file}", "w") as f:
                    f.write(value)
    except OSError as error:
        os.rmdir(group)
        pytest.skip(f"cannot limit a cgroup's CPU here: {error}")
    return group


def _cores_in(group: str) -> str:
    enter = f"open({group + '/cgroup.procs'!r}, 'w').write(str(__import__('os').getpid())); {ASK}"
    result = subprocess.run([sys.executable, "-c", enter], capture_output=True, text=True)
    if result.returncode and "Permission" in result.stderr:
        pytest.skip("cannot move a process into a cgroup here")
    assert not result.returncode, result.stderr
    return result.stdout.split()[0]


def test_a_process_in_a_cgroup_with_a_cpu_quota_has_the_quota_s_cores_rounded_up():
    """As a Kubernetes CPU limit sets it: the pod sees every core of the node, and may use half of one; so does
    a process in a group below one with that quota (a systemd slice's, a batch job's)."""
    if available_cores() < 2:
        pytest.skip("one core: a quota of half a core would change nothing")
    group = _cpu_cgroup(0.5)
    try:
        assert _cores_in(group) == "1"
        child = _cpu_cgroup(None, parent=group)
        try:
            assert _cores_in(child) == "1"
        finally:
            os.rmdir(child)
    finally:
        os.rmdir(group)
