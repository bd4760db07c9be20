"""daskpile on Kubernetes, with the dask-kubernetes operator: one spec for every way in.

:func:`cluster_spec` is the ``DaskCluster`` of daskpile's workers: requests equal to
limits, the Dask worker's memory limit equal to the container's, an ``emptyDir`` with
a size limit for spilling, credentials from a ``Secret``, non-root, read-only root
filesystem, no privilege escalation. :func:`job_spec` wraps it in the ``DaskJob``
whose runner pod runs ``daskpile shuffle`` against the scheduler address the
operator injects (``DASK_SCHEDULER_ADDRESS``). ``deploy/base/daskjob.yaml`` is
:func:`job_spec`'s output (a test keeps them equal), and :func:`kubernetes_cluster`
(``daskpile shuffle --kubernetes NAME``) starts the same cluster from Python.

Only :func:`kubernetes_cluster` needs ``dask_kubernetes`` (``pip install
'daskpile[kubernetes]'``); building the specs needs nothing.
"""

from __future__ import annotations

import copy
from importlib import metadata

from dask.utils import parse_bytes

# The client's version (its distribution's, which is daskpile.__version__: a leaf imports no daskpile module):
# the workers must run the same
IMAGE = f"ghcr.io/daskpile/daskpile:{metadata.version('daskpile')}"
SECRET = "daskpile-storage"  # AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (or the store's own variables)
UID = 10001  # the image's user; numeric, so that runAsNonRoot can check it
SCRATCH_MOUNT = "/scratch"  # the workers' local directory: Dask's spill, never daskpile's scratch

# The settings of daskpile's own LocalCluster that matter on any cluster (docs/faq.md): the statistical
# profiler costs these tasks a quarter of their time; event-loop checks every 20 ms cost CPU for nothing;
# tasks waiting while every worker is paused for memory would wait forever (daskpile._compute).
DASK_ENV = {
    "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
    "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "200ms",
    "DASK_DISTRIBUTED__SCHEDULER__NO_WORKERS_TIMEOUT": "600s",
}


def _quantity(n_bytes: int) -> str:
    """Bytes as a Kubernetes quantity: ``8Gi``, ``512Mi``.

    >>> _quantity(8 * 2**30), _quantity(3 * 2**29)
    ('8Gi', '1536Mi')
    """
    for unit, size in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n_bytes % size == 0:
            return f"{n_bytes // size}{unit}"
    return str(n_bytes)


def _security_context() -> dict:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": UID,
        "runAsGroup": UID,
        "capabilities": {"drop": ["ALL"]},
    }


def _pod(container: dict, volumes: list[dict], **pod_fields) -> dict:
    return {
        "automountServiceAccountToken": False,  # daskpile talks to Dask and the object store, never to the API
        "securityContext": {"runAsNonRoot": True, "fsGroup": UID, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": volumes,
        **pod_fields,
    }


def _container(
    name: str, image: str, args: list[str], cpu: str, memory: int, mounts: list[dict], storage: bool = True, **extra
) -> dict:
    """A pod's container; ``storage``: it gets the store's credentials (the scheduler, which reads and writes
    no data, does not)."""
    env = [{"name": k, "value": v} for k, v in DASK_ENV.items()]
    return {
        "name": name,
        "image": image,
        # A tag pushed again must not leave pods on the old image, whose versions the client no longer matches.
        "imagePullPolicy": "Always",
        "args": args,
        "env": env + extra.pop("env", []),
        **({"envFrom": [{"secretRef": {"name": SECRET}}]} if storage else {}),
        "resources": {
            "requests": {"cpu": cpu, "memory": _quantity(memory)},
            "limits": {"cpu": cpu, "memory": _quantity(memory)},
        },
        "securityContext": _security_context(),
        "volumeMounts": mounts,
        **extra,
    }


def _health(port: str) -> dict:
    # Liveness is generous: a scheduler taking in hundreds of thousands of tasks, or a worker whose event loop
    # waits on a long task, answers late without being dead; a restart would cost the run far more.
    return {
        "readinessProbe": {"httpGet": {"port": port, "path": "/health"}, "periodSeconds": 5, "timeoutSeconds": 5},
        "livenessProbe": {
            "httpGet": {"port": port, "path": "/health"},
            "initialDelaySeconds": 30,
            "periodSeconds": 30,
            "timeoutSeconds": 30,
            "failureThreshold": 6,
        },
    }


def cluster_spec(
    name: str = "daskpile",
    *,
    image: str = IMAGE,
    workers: int = 4,
    threads_per_worker: int = 2,
    memory_per_worker: int | str = "8 GiB",
    spill: int | str = "50 GiB",
) -> dict:
    """The ``DaskCluster`` resource of a daskpile cluster (what ``KubeCluster(custom_cluster_spec=...)`` takes).

    Each worker has ``threads_per_worker`` CPUs and ``memory_per_worker`` of memory,
    requested and limited alike, so that the Dask worker's own memory limit (which
    makes it spill, pause and restart before the kernel kills it) is the
    container's; ``spill`` bounds the ``emptyDir`` it spills to. With
    ``piles="auto"``, daskpile sizes piles to a quarter of that memory per thread.

    >>> spec = cluster_spec("shuffle", workers=8, memory_per_worker="16 GiB")
    >>> spec["spec"]["worker"]["replicas"]
    8
    >>> worker = spec["spec"]["worker"]["spec"]["containers"][0]
    >>> worker["resources"]["limits"]["memory"], worker["args"][worker["args"].index("--memory-limit") + 1]
    ('16Gi', '17179869184')
    """
    memory = parse_bytes(memory_per_worker) if isinstance(memory_per_worker, str) else int(memory_per_worker)
    spill_bytes = parse_bytes(spill) if isinstance(spill, str) else int(spill)
    volumes = [
        {"name": "spill", "emptyDir": {"sizeLimit": _quantity(spill_bytes)}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
    ]
    worker_mounts = [{"name": "spill", "mountPath": SCRATCH_MOUNT}, {"name": "tmp", "mountPath": "/tmp"}]
    worker_args = [
        "dask", "worker",
        "--name", "$(DASK_WORKER_NAME)",
        "--nthreads", str(threads_per_worker),
        "--memory-limit", str(memory),
        "--local-directory", SCRATCH_MOUNT,
        "--dashboard-address", ":8788",
    ]  # fmt: skip
    worker = _container(
        "worker", image, worker_args, str(threads_per_worker), memory, worker_mounts,
        ports=[{"name": "http-dashboard", "containerPort": 8788, "protocol": "TCP"}], **_health("http-dashboard"),
    )  # fmt: skip
    scheduler = _container(
        "scheduler", image, ["dask", "scheduler", "--host", "0.0.0.0", "--dashboard-address", ":8787"], "1",
        2 * 2**30, [{"name": "tmp", "mountPath": "/tmp"}], storage=False,
        ports=[
            {"name": "tcp-comm", "containerPort": 8786, "protocol": "TCP"},
            {"name": "http-dashboard", "containerPort": 8787, "protocol": "TCP"},
        ],
        **_health("http-dashboard"),
    )  # fmt: skip
    return {
        "apiVersion": "kubernetes.dask.org/v1",
        "kind": "DaskCluster",
        "metadata": {"name": name},
        "spec": {
            "idleTimeout": 0,
            "worker": {"replicas": workers, "spec": _pod(worker, volumes)},
            "scheduler": {
                "spec": _pod(scheduler, copy.deepcopy(volumes[1:])),
                "service": {
                    "type": "ClusterIP",
                    "selector": {"dask.org/cluster-name": name, "dask.org/component": "scheduler"},
                    "ports": [
                        {"name": "tcp-comm", "protocol": "TCP", "port": 8786, "targetPort": "tcp-comm"},
                        {"name": "http-dashboard", "protocol": "TCP", "port": 8787, "targetPort": "http-dashboard"},
                    ],
                },
            },
        },
    }


# What the security scan (checkov, tests/test_deploy_scan.py) reports and is accepted, with why. The operator
# passes a DaskJob's annotations to every pod, and the job's own to the runner's.
ACCEPTED_FINDINGS = {
    "checkov.io/skip1": "CKV_K8S_43=the image is your build of deploy/Dockerfile: pin its digest with the "
    "kustomization's images: digest field once pushed",
    "checkov.io/skip2": "CKV_K8S_35=s3fs (botocore) reads static keys from the environment; with IRSA or "
    "Workload Identity, leave the Secret empty instead",
}
ACCEPTED_RUNNER_FINDINGS = {
    "checkov.io/skip4": "CKV_K8S_8=the runner is a batch client with no server to probe: its exit status is its "
    "health (restartPolicy Never)",
    "checkov.io/skip5": "CKV_K8S_9=the runner is a batch client with no server to probe and no Service to be ready for",
}

# The runner's command in deploy/: $(VAR) is expanded by Kubernetes from the container's env, which
# the kustomization fills from one ConfigMap, so that the bucket is set in one place.
# It tries again for an hour after an error a later try may not meet (a scheduler restarted, the store out of
# reach); on any other failure the runner pod fails, and the operator removes the cluster at once.
JOB_COMMAND = [
    "daskpile", "shuffle", "$(SOURCE)", "$(DEST)", "--scratch", "$(SCRATCH)", "--piles", "$(PILES)",
    "--retry-for", "1h",
]  # fmt: skip
JOB_SETTINGS = "daskpile-job"  # the ConfigMap holding SOURCE, DEST, SCRATCH, PILES


def job_spec(
    name: str = "daskpile", *, command: list[str] = JOB_COMMAND, deadline_hours: float = 48, **cluster
) -> dict:
    """The ``DaskJob`` of a daskpile run: a runner pod running ``command`` on :func:`cluster_spec`'s cluster.

    The operator starts the cluster, then the runner with ``DASK_SCHEDULER_ADDRESS``
    set, which ``daskpile shuffle`` uses. The runner is not restarted: the command
    itself tries again (``--retry-for``) after an error a later try may not meet (exit
    status 75), and resumes its run; on any other error the runner pod fails, and the
    operator removes the cluster at once, where a restarted runner would hold the
    workers until ``deadline_hours`` over an error no retry mends (a missing bucket,
    refused credentials). Applied again, the job resumes the run.

    >>> job = job_spec("events", workers=16)
    >>> job["kind"], job["spec"]["job"]["spec"]["containers"][0]["args"][:2]
    ('DaskJob', ['daskpile', 'shuffle'])
    """
    cluster_resource = cluster_spec(name, **cluster)
    image = cluster_resource["spec"]["worker"]["spec"]["containers"][0]["image"]
    settings = [
        {"name": key, "valueFrom": {"configMapKeyRef": {"name": JOB_SETTINGS, "key": key}}}
        for key in ("SOURCE", "DEST", "SCRATCH", "PILES")
    ]
    runner = _container(
        "job", image, list(command), "1", 2 * 2**30, [{"name": "tmp", "mountPath": "/tmp"}], env=settings
    )
    return {
        "apiVersion": "kubernetes.dask.org/v1",
        "kind": "DaskJob",
        "metadata": {"name": name, "annotations": ACCEPTED_FINDINGS},
        "spec": {
            "job": {
                "metadata": {"annotations": ACCEPTED_RUNNER_FINDINGS},
                "spec": _pod(
                    runner,
                    [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}],
                    restartPolicy="Never",
                    activeDeadlineSeconds=int(deadline_hours * 3600),
                ),
            },
            "cluster": {"spec": cluster_resource["spec"]},
        },
    }


def kubernetes_cluster(name: str = "daskpile", *, namespace: str | None = None, **cluster):
    """Start a ``dask_kubernetes.operator.KubeCluster`` of :func:`cluster_spec`'s workers.

    Needs ``pip install 'daskpile[kubernetes]'`` and a cluster running the
    dask-kubernetes operator (see ``deploy/README.md``).

    Its scheduler fails tasks that wait 10 minutes with no worker running
    (``NoWorkerRunning``): wait for the workers (pods may take that long to be
    scheduled) before the run.

    >>> with kubernetes_cluster("shuffle", image="registry/daskpile:0.1.0", workers=8) as cluster:  # doctest: +SKIP
    ...     with distributed.Client(cluster) as client:
    ...         client.wait_for_workers(8)
    ...         daskpile.shuffle_parquet("s3://lake/events/", "s3://lake/shuffled/", scratch="s3://lake/tmp/")
    """
    try:
        from dask_kubernetes.operator import KubeCluster
    except ImportError as e:
        raise ImportError("a Kubernetes cluster needs dask-kubernetes: pip install 'daskpile[kubernetes]'") from e
    options = {} if namespace is None else {"namespace": namespace}
    try:
        return KubeCluster(custom_cluster_spec=cluster_spec(name, **cluster), **options)
    except Exception:
        # A cluster that never started stays registered for dask-kubernetes' exit-time reaper, which
        # would print a second traceback trying to reach the same unreachable API server.
        for instance in list(KubeCluster._instances):
            if instance.name == name:
                KubeCluster._instances.discard(instance)
        raise


def job_yaml(**job) -> str:
    """:func:`job_spec` as the YAML of ``deploy/base/daskjob.yaml``."""
    import yaml

    header = "# Generated by `python -m daskpile.kubernetes > deploy/base/daskjob.yaml`: edit daskpile/kubernetes.py.\n"
    return header + yaml.safe_dump(job_spec(**job), sort_keys=False, width=120)


if __name__ == "__main__":
    print(job_yaml(), end="")
