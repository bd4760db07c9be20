"""daskpile._cores: the cores a process may use, under a real CPU affinity and a real cgroup CPU quota."""

import os
import subprocess
import sys
import uuid

import pytest

from daskpile._cores import available_cores

ASK = "from daskpile._cores import available_cores; print(available_cores())"


def test_a_process_pinned_to_one_core_has_one():
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    pin = f"import os; os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}}); {ASK}"
    assert subprocess.run([sys.executable, "-c", pin], capture_output=True, text=True, check=True).stdout == "1\n"
    assert available_cores() == len(os.sched_getaffinity(0))


def _cpu_cgroup(quota_cores: float) -> tuple[str, str]:
    """A new cgroup limited to ``quota_cores`` of CPU time (v1 cpu controller or v2), and the file its processes
    are added to; skips where cgroups cannot be made (not root, read-only)."""
    name = f"daskpile-test-{uuid.uuid4().hex[:8]}"
    v1, v2 = "/sys/fs/cgroup/cpu", "/sys/fs/cgroup"
    try:
        if os.path.exists(f"{v1}/cpu.cfs_quota_us"):
            group = f"{v1}/{name}"
            os.mkdir(group)
            with open(f"{group}/cpu.cfs_period_us") as f:
                period = int(f.read())
            with open(f"{group}/cpu.cfs_quota_us", "w") as f:
                f.write(str(int(quota_cores * period)))
        elif os.path.exists(f"{v2}/cgroup.controllers"):
            group = f"{v2}/{name}"
            os.mkdir(group)
            with open(f"{group}/cpu.max", "w") as f:
                f.write(f"{int(quota_cores * 100000)} 100000")
        else:
            pytest.skip("no cgroup CPU controller mounted")
    except OSError as error:
        pytest.skip(f"cannot make a cgroup here: {error}")
    return group, f"{group}/cgroup.procs"


def test_a_process_in_a_cgroup_with_a_cpu_quota_has_the_quota_s_cores_rounded_up():
    """As a Kubernetes CPU limit sets it: the pod sees every core of the node, and may use half of one."""
    if available_cores() < 2:
        pytest.skip("one core: a quota of half a core would change nothing")
    group, procs = _cpu_cgroup(0.5)
    try:
        enter = f"open({procs!r}, 'w').write(str(__import__('os').getpid())); {ASK}"
        result = subprocess.run([sys.executable, "-c", enter], capture_output=True, text=True)
        if result.returncode and "Permission" in result.stderr:
            pytest.skip("cannot move a process into a cgroup here")
        assert result.stdout == "1\n", result.stderr
    finally:
        os.rmdir(group)
