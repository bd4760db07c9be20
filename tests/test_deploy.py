"""deploy/ checked without a Kubernetes cluster: strict schemas, and the runner's command run for real.

- ``deploy/base/daskjob.yaml`` is what ``daskpile.kubernetes.job_spec`` generates, so the DaskJob of
  ``kubectl apply -k deploy/`` and the cluster of ``kubernetes_cluster()`` are one spec.
- Every object ``kubectl kustomize deploy/`` renders (or its Python equivalent where kubectl is
  absent) validates strictly: the DaskJob and DaskCluster against the CRD schemas the
  dask-kubernetes package ships (a field the schema does not know is an error, as with
  ``kubectl apply --validate=strict``), and the core objects, the pods inside the custom
  resources included, against Kubernetes' own OpenAPI schemas (``kubernetes-validate``).
- The runner's exact command, from the rendered DaskJob, runs against a local scheduler found
  through ``DASK_SCHEDULER_ADDRESS``, on an S3-compatible server, and verifies.
"""

import copy
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from _cluster import moto_s3
from _util import DASKPILE
from distributed import LocalCluster

import daskpile
from daskpile import kubernetes
from daskpile.datasets import write_reference_dataset

jsonschema = pytest.importorskip("jsonschema")
kubernetes_validate = pytest.importorskip("kubernetes_validate")
dask_kubernetes = pytest.importorskip("dask_kubernetes")

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
CRDS = Path(dask_kubernetes.__file__).parent / "operator" / "deployment" / "helm" / "dask-kubernetes-operator" / "crds"
KUBERNETES_VERSION = "1.32"  # the version deploy/README.md says the manifests are validated against


# -- rendering ----------------------------------------------------------------------------------------


def render_in_python() -> list[dict]:
    """What ``kubectl kustomize deploy/`` gives, for the features deploy/kustomization.yaml uses."""
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert set(kustomization) <= {
        "apiVersion", "kind", "namespace", "resources", "images", "configMapGenerator", "generatorOptions", "patches",
    }, "deploy/kustomization.yaml uses a feature this emulation does not know"  # fmt: skip
    objects = [yaml.safe_load((DEPLOY / r).read_text()) for r in kustomization["resources"]]
    for generator in kustomization.get("configMapGenerator", []):
        data = dict(literal.split("=", 1) for literal in generator["literals"])
        config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}, "data": data}
        objects.insert(1, config_map)
    for obj in objects:
        if obj["kind"] != "Namespace":
            obj["metadata"]["namespace"] = kustomization["namespace"]
        for image in kustomization.get("images", []):
            _retag(obj, image["name"], f"{image['newName']}:{image['newTag']}")
    for patch in kustomization.get("patches", []):
        for obj in objects:
            if obj["kind"] == patch["target"]["kind"] and obj["metadata"]["name"] == patch["target"]["name"]:
                for op in yaml.safe_load(patch["patch"]):
                    assert op["op"] == "replace"
                    *parents, leaf = op["path"].strip("/").split("/")
                    node = obj
                    for key in parents:
                        node = node[key]
                    node[leaf] = op["value"]
    return objects


def _retag(node, name: str, new: str) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "image" and isinstance(value, str) and value.rsplit(":", 1)[0] == name:
                node[key] = new
            else:
                _retag(value, name, new)
    elif isinstance(node, list):
        for item in node:
            _retag(item, name, new)


def render() -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return render_in_python()
    out = subprocess.run([kubectl, "kustomize", str(DEPLOY)], capture_output=True, text=True, check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _comparable(objects: list[dict]) -> list[dict]:
    return sorted(objects, key=lambda o: (o["kind"], o["metadata"]["name"]))


# -- strict validation ----------------------------------------------------------------------------------


def crd_validator(kind: str):
    """A validator of ``kind`` from its CRD's openAPIV3Schema, with unknown fields rejected."""
    crd = yaml.safe_load((CRDS / f"{kind.lower()}.yaml").read_text())
    schema = copy.deepcopy(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])

    def strict(node):
        if isinstance(node, dict):
            open_ended = "additionalProperties" in node or node.get("x-kubernetes-preserve-unknown-fields")
            if "properties" in node and not open_ended:
                node["additionalProperties"] = False
            for value in node.values():
                strict(value)
        elif isinstance(node, list):
            for value in node:
                strict(value)

    strict(schema)
    # What every object has besides its spec (the API server checks these itself).
    schema["properties"].update(
        {"apiVersion": {"const": crd["spec"]["group"] + "/v1"}, "kind": {"const": kind}, "metadata": {"type": "object"}}
    )
    return jsonschema.Draft7Validator(schema)


def pods_in(obj: dict) -> list[tuple[str, dict]]:
    """The pod specs inside a DaskJob or DaskCluster, named by where they are."""
    cluster = obj["spec"]["cluster"]["spec"] if obj["kind"] == "DaskJob" else obj["spec"]
    pods = [("worker", cluster["worker"]["spec"]), ("scheduler", cluster["scheduler"]["spec"])]
    if obj["kind"] == "DaskJob":
        pods.append(("job", obj["spec"]["job"]["spec"]))
    return pods


def validate(obj: dict) -> None:
    """Raise on anything the API server (with strict field validation) would refuse."""
    if obj["apiVersion"].startswith("kubernetes.dask.org/"):
        errors = sorted(crd_validator(obj["kind"]).iter_errors(obj), key=str)
        assert not errors, f"{obj['kind']} {obj['metadata']['name']}: " + "; ".join(e.message for e in errors[:5])
        for where, pod in pods_in(obj):
            kubernetes_validate.validate(
                {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": where}, "spec": pod},
                KUBERNETES_VERSION,
                strict=True,
            )
        if "scheduler" in (obj["spec"].get("cluster", obj)["spec"]):
            service = (obj["spec"].get("cluster", obj))["spec"]["scheduler"]["service"]
            kubernetes_validate.validate(
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "scheduler"}, "spec": service},
                KUBERNETES_VERSION,
                strict=True,
            )
    else:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


# -- the tests ------------------------------------------------------------------------------------------


def test_the_daskjob_of_deploy_is_the_generated_spec():
    """Regenerate with: python -m daskpile.kubernetes > deploy/base/daskjob.yaml"""
    assert (DEPLOY / "base" / "daskjob.yaml").read_text() == kubernetes.job_yaml()


def test_the_python_rendering_is_kustomizes():
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: the Python rendering is what the other tests use")
    assert _comparable(render_in_python()) == _comparable(render())


@pytest.mark.slow
def test_every_rendered_object_validates_strictly():
    objects = render()
    assert [o["kind"] for o in _comparable(objects)] == ["ConfigMap", "DaskJob", "Namespace", "NetworkPolicy"]
    for obj in objects:
        validate(obj)
    job = next(o for o in objects if o["kind"] == "DaskJob")
    assert job["spec"]["cluster"]["spec"]["worker"]["replicas"] == 4
    images = {c["image"] for _, pod in pods_in(job) for c in pod["containers"]}
    # one image, set in one place, of the client's version (as the command's default, kubernetes.IMAGE)
    assert images == {f"registry.example.com/daskpile:{daskpile.__version__}"}
    assert kubernetes.IMAGE.endswith(f":{daskpile.__version__}")


def test_the_kubecluster_spec_validates_strictly():
    spec = kubernetes.cluster_spec("shuffle", image="registry/daskpile:1", workers=16, memory_per_worker="30 GiB")
    validate(spec)
    worker = spec["spec"]["worker"]["spec"]["containers"][0]
    limit = worker["args"][worker["args"].index("--memory-limit") + 1]
    assert int(limit) == 30 * 2**30 and worker["resources"]["limits"]["memory"] == "30Gi"  # Dask's limit is the pod's
    assert worker["resources"]["requests"] == worker["resources"]["limits"]
    assert worker["securityContext"]["runAsNonRoot"] and not worker["securityContext"]["allowPrivilegeEscalation"]
    assert worker["securityContext"]["readOnlyRootFilesystem"]
    assert {"secretRef": {"name": kubernetes.SECRET}} in worker["envFrom"]
    scheduler = spec["spec"]["scheduler"]["spec"]["containers"][0]
    assert "envFrom" not in scheduler  # it reads and writes no data: no credentials
    spill = next(v for v in spec["spec"]["worker"]["spec"]["volumes"] if v["name"] == "spill")
    assert spill["emptyDir"]["sizeLimit"] == "50Gi"


@pytest.mark.slow
@pytest.mark.parametrize(
    "break_it",
    [
        lambda job: job["spec"]["cluster"]["spec"]["worker"].update(replica=3),  # a typo in the CRD's own fields
        lambda job: job["spec"]["job"]["spec"]["containers"][0].update(volumeMount=[]),  # a typo inside a pod
        lambda job: job["spec"]["job"]["spec"]["containers"][0]["resources"].update(limit={}),
        lambda job: job["spec"].update(jobs={}),
    ],
    ids=["crd-field", "container-field", "resources-field", "spec-field"],
)
def test_a_field_the_schemas_do_not_know_is_refused(break_it):
    """The variants that must fail: strict validation is not a description that accepts anything."""
    job = kubernetes.job_spec()
    break_it(job)
    with pytest.raises((AssertionError, kubernetes_validate.ValidationError)):
        validate(job)


@pytest.mark.slow
def test_the_runners_exact_command_runs_against_a_local_scheduler(tmp_path, monkeypatch):
    job = next(o for o in render() if o["kind"] == "DaskJob")
    container = job["spec"]["job"]["spec"]["containers"][0]
    settings = next(o for o in render() if o["kind"] == "ConfigMap")["data"]
    with moto_s3(buckets=("lake", "scratch")) as (fs, options):
        endpoint = options["client_kwargs"]["endpoint_url"]
        write_reference_dataset("s3://lake/events", rows=20_000, files=4, storage_options=options)
        # What the pods get from the Secret: credentials and, for this server, its endpoint.
        secret = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_ENDPOINT_URL": endpoint,
                  "AWS_DEFAULT_REGION": "eu-west-1"}  # fmt: skip
        for key, value in secret.items():
            monkeypatch.setenv(key, value)  # the workers the LocalCluster starts inherit them, as pods get the Secret
        values = {**settings, "SOURCE": "s3://lake/events/", "DEST": "s3://lake/events-shuffled/",
                  "SCRATCH": "s3://scratch/daskpile/"}  # fmt: skip
        env = {e["name"]: e.get("value", values.get(e["name"])) for e in container["env"]}
        args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]
        assert args[:2] == ["daskpile", "shuffle"]
        with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster:
            done = subprocess.run(
                [DASKPILE, *args[1:]],
                capture_output=True,
                text=True,
                timeout=300,
                env={**os.environ, **env, "DASK_SCHEDULER_ADDRESS": cluster.scheduler_address},
            )
        assert done.returncode == 0, done.stderr
        assert f"cluster {cluster.scheduler_address}" in done.stdout and "verified" in done.stdout
        manifest = json.loads(fs.cat_file("lake/events-shuffled/_daskpile.json"))
        assert manifest["rows"] == 20_000 and manifest["pile_plan"] is not None  # PILES=auto
        fs.invalidate_cache()
        assert fs.find("scratch/daskpile") == []


@pytest.mark.slow
def test_the_kubernetes_option_starts_the_validated_spec(tmp_path):
    from daskpile.cli import kubernetes_shape

    spec = kubernetes.cluster_spec("nightly", image="registry/daskpile:1", **kubernetes_shape(8, None, "16GiB"))
    validate(spec)
    worker = spec["spec"]["worker"]
    assert worker["replicas"] == 8 and worker["spec"]["containers"][0]["resources"]["limits"]["memory"] == "16Gi"
    # No API server here: one line, exit 2, nothing written, and no traceback from dask-kubernetes at exit.
    done = _shuffle_on_kubernetes(tmp_path, tmp_path / "no-kubeconfig")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("daskpile: error: cannot start the Kubernetes cluster 'nightly': ")
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert not (tmp_path / "out").exists()


def test_a_kubernetes_api_server_out_of_reach_is_named_and_worth_a_retry(tmp_path):
    """A kubeconfig whose server does not answer: exit 2, "All connection attempts failed", naming no server
    (a platform trial); it is named, with the exit status of a scheduler out of reach (75)."""
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        server = f"https://127.0.0.1:{free.getsockname()[1]}"  # (closed again: nothing listens there)
    (tmp_path / "kubeconfig").write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: here\n"
        f"clusters:\n- name: here\n  cluster:\n    server: {server}\n    insecure-skip-tls-verify: true\n"
        "contexts:\n- name: here\n  context:\n    cluster: here\n    user: me\n"
        "users:\n- name: me\n  user:\n    token: not-a-secret\n"
    )
    done = _shuffle_on_kubernetes(tmp_path, tmp_path / "kubeconfig")
    assert done.returncode == 75, done.stderr
    assert f"its API server {server} is out of reach" in done.stderr and len(done.stderr.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def _shuffle_on_kubernetes(tmp_path, kubeconfig) -> subprocess.CompletedProcess:
    """``daskpile shuffle --kubernetes nightly`` of a small source, with ``kubeconfig`` and outside any pod."""
    write_reference_dataset(str(tmp_path / "src"), rows=1_000, files=1)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return subprocess.run(
        [DASKPILE, "shuffle", str(tmp_path / "src"), str(tmp_path / "out"), "--kubernetes", "nightly"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


def test_the_kubernetes_option_runs_on_the_cluster_it_starts(tmp_path, monkeypatch):
    """kubernetes_cluster stood in for by a LocalCluster: the command waits for a worker, counts them, runs."""
    from click.testing import CliRunner

    from daskpile.cli import cli

    started = {}

    def stand_in(name, **options):
        started.update(options, name=name)
        return LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0")

    monkeypatch.setattr(kubernetes, "kubernetes_cluster", stand_in)
    write_reference_dataset(str(tmp_path / "src"), rows=2_000, files=2)
    args = ["shuffle", str(tmp_path / "src"), str(tmp_path / "out"), "--piles", "2", "--kubernetes", "nightly",
            "--namespace", "daskpile", "--image", "registry/daskpile:1", "--workers", "3"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "Kubernetes cluster nightly: 1 worker, dashboard " in result.output and "verified" in result.output
    assert started == {"name": "nightly", "namespace": "daskpile", "image": "registry/daskpile:1", "workers": 3}


def test_a_kubernetes_cluster_whose_pods_never_start_says_where_to_look(tmp_path, monkeypatch):
    """Pods without the daskpile-storage Secret never start (CreateContainerConfigError): the command said only
    "has no worker after 600 s"."""
    from click.testing import CliRunner

    from daskpile import cli as command_line

    monkeypatch.setattr(command_line, "FIRST_WORKER_TIMEOUT", 1)
    monkeypatch.setattr(
        kubernetes, "kubernetes_cluster",
        lambda name, **options: LocalCluster(n_workers=0, processes=False, dashboard_address=":0"),
    )  # fmt: skip
    write_reference_dataset(str(tmp_path / "src"), rows=1_000, files=1)
    args = ["shuffle", str(tmp_path / "src"), str(tmp_path / "out"), "--kubernetes", "nightly", "--namespace", "jobs"]
    result = CliRunner().invoke(command_line.cli, args)
    assert result.exit_code == 75 and "Kubernetes cluster nightly has no worker after 1 s: are its pods pending " in (
        result.output
    )
    assert "kubectl -n jobs get pods" in result.output and "the Secret daskpile-storage" in result.output


@pytest.mark.slow
def test_a_cluster_without_workers_is_refused_after_a_wait(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from daskpile import cli as command_line

    monkeypatch.setattr(command_line, "FIRST_WORKER_TIMEOUT", 3)
    write_reference_dataset(str(tmp_path / "src"), rows=1_000, files=1)
    with LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as empty:
        args = ["shuffle", str(tmp_path / "src"), str(tmp_path / "out"), "--scheduler", empty.scheduler_address]
        result = CliRunner().invoke(command_line.cli, args)
    assert result.exit_code == 75 and f"cluster {empty.scheduler_address} has no worker after 3 s" in result.output
    # said while it waits, after 2 s: a job's log said nothing while its worker pods pulled their image
    assert f"cluster {empty.scheduler_address}: waiting for a worker to join, up to 3 s" in result.output
    assert not (tmp_path / "out").exists()
