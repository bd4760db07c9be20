"""deploy/'s image and manifests checked without building or applying anything; checkov scans them.

- ``deploy/constraints.txt``, the lock ``deploy/Dockerfile`` installs, pins the core dependencies and
  the packages Dask compares between client, scheduler and workers at this client venv's versions.
- ``tests/oldest.txt``, what ``make test-oldest`` runs the suite on, pins each dependency at its lower bound
  in ``pyproject.toml``.
- ``deploy/Dockerfile`` has what checkov does not check: both stages on one base image, a numeric
  non-root ``USER`` last (checkov passes ``USER 0``), the same UID as the manifests' ``runAsUser``,
  only the venv taken from the builder, the Dask settings, every copied path let through by
  ``.dockerignore``.
- checkov (its own venv, made with the project's by ``make .venv/.installed``, version pinned in the
  Makefile) fails no check on the Dockerfile, the files of ``deploy/``, the output of ``kubectl
  kustomize deploy/``, and the objects the dask-kubernetes operator creates from the DaskJob: checkov
  does not look inside custom resources (to it the DaskJob alone is no resource at all), so they are
  built here by the operator's own functions. Every accepted finding is skipped in place, with its
  reason (``# checkov:skip=`` in the Dockerfile, ``checkov.io/skipN`` annotations in the manifests).
- The same scan fails a copy of the Dockerfile without its ``USER`` line, and one with ``USER root``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
CONSTRAINTS = DEPLOY / "constraints.txt"
OLDEST = ROOT / "tests" / "oldest.txt"
CHECKOV = Path(sys.prefix) / "tools" / "checkov" / "bin" / "checkov"

# daskpile's own dependencies (s3fs: the image reads and writes S3), and what distributed compares
# between client, scheduler and workers beyond them (distributed.versions: a mismatch warns, and
# pickled objects cross between them).
CORE = ["dask", "distributed", "pyarrow", "pandas", "numpy", "fsspec", "s3fs"]
COMPARED_BY_DASK = ["cloudpickle", "msgpack", "toolz", "tornado"]
# The Dockerfile copies with the USER line removed, and with the last USER made root: each must fail.
BIASED = {"no-user": "CKV_DOCKER_3", "root": "CKV_DOCKER_8"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock(path: Path = CONSTRAINTS) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version.strip(), f"{path.relative_to(ROOT)}: {line!r} is not an exact pin (name==version)"
            pins[canonical(name.strip())] = version.strip()
    return pins


def test_lock_pins_the_client_versions():
    pins = lock()
    assert "daskpile" not in pins, "deploy/constraints.txt pins daskpile itself: regenerate it (command at its top)"
    stale = {
        name: (pins.get(name, "missing"), importlib.metadata.version(name))
        for name in CORE + COMPARED_BY_DASK
        if pins.get(name) != importlib.metadata.version(name)
    }
    assert not stale, (
        f"deploy/constraints.txt disagrees with this venv, {{name: (lock, venv)}}: {stale}; the image would run "
        "other versions than the client. Regenerate the lock with the command at its top."
    )


def test_lock_holds_every_requirement_of_daskpile_with_s3():
    """The image installs the lock with --no-deps, then ``pip check``s it: a dependency added to pyproject.toml
    (or one of a dependency's) and not to the lock would fail the image's build, which no test here runs."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]  # (not the installed metadata,
    # which an editable install wrote when it was made: a dependency added since would be missed)
    pins, missing, seen = lock(), set(), set()
    wanted = [(Requirement(r), set()) for r in project["dependencies"] + project["optional-dependencies"]["s3"]]
    while wanted:
        requirement, extras = wanted.pop()
        name = canonical(requirement.name)
        if requirement.marker and not any(requirement.marker.evaluate({"extra": e}) for e in extras | {""}):
            continue
        if (name, frozenset(requirement.extras)) in seen:
            continue
        seen.add((name, frozenset(requirement.extras)))
        if name not in pins:
            missing.add(name)
            continue
        wanted += [(Requirement(r), set(requirement.extras)) for r in importlib.metadata.requires(name) or []]
    assert not missing, f"deploy/constraints.txt lacks {sorted(missing)}: regenerate it (command at its top)"


def test_the_oldest_versions_tested_are_the_lower_bounds_of_daskpile():
    """``make test-oldest`` runs the suite under tests/oldest.txt: it must pin each dependency at its lower bound
    in pyproject.toml, so that a bound moved without the suite run at it fails here."""
    from packaging.requirements import Requirement

    floors = {}
    for requirement in map(
        Requirement, tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ):
        (lowest,) = [s.version for s in requirement.specifier if s.operator == ">="]
        floors[canonical(requirement.name)] = lowest
    assert lock(OLDEST) == floors


# -- the Dockerfile, read ------------------------------------------------------------------------------


def instructions(text: str) -> list[tuple[str, str]]:
    """A Dockerfile's (INSTRUCTION, arguments): continuation lines joined, comments dropped."""
    found, current = [], ""
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        keyword, _, arguments = current.strip().partition(" ")
        found.append((keyword.upper(), " ".join(arguments.split())))
        current = ""
    return found


def stages(text: str) -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for keyword, arguments in instructions(text):
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, arguments))
    return result


def image_uid() -> int:
    user = [arguments for keyword, arguments in stages(DOCKERFILE.read_text())[-1] if keyword == "USER"][-1]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) > 0, f"the image's last USER is {user!r}: it must be a numeric UID, not 0"
    return int(uid)


def test_dockerfile_what_checkov_does_not_check():
    builder, *_, runtime = stages(DOCKERFILE.read_text())
    bases = {stage[0][1].split()[0] for stage in (builder, runtime)}
    assert len(bases) == 1, f"the stages have different base images {bases}: the venv needs the builder's Python"
    (base,) = bases
    assert base.startswith("python:3.11-slim") and not base.endswith(":latest"), base

    assert image_uid() == 10001, "the UID the manifests and docs name"

    taken = [arguments for keyword, arguments in runtime if keyword == "COPY" and "--from=" in arguments]
    assert taken == ["--from=builder /opt/venv /opt/venv"], f"the runtime stage must take only the venv: {taken}"

    env = dict(token.split("=", 1) for keyword, arguments in runtime if keyword == "ENV" for token in arguments.split())
    assert env["DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"] == "False"
    assert env["DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL"] == "200ms"
    assert env["DASK_DISTRIBUTED__SCHEDULER__NO_WORKERS_TIMEOUT"] == "600s"
    assert env["PYTHONUNBUFFERED"] == "1" and env["HOME"] == "/tmp"

    sources = [
        path
        for stage in (builder, runtime)
        for keyword, arguments in stage
        if keyword == "COPY" and "--from=" not in arguments
        for path in arguments.split()[:-1]
    ]
    assert "deploy/constraints.txt" in sources, "the builder must install the lock"
    let_through = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert "*" in let_through, ".dockerignore must exclude everything but what the Dockerfile copies"
    assert all(f"!{path.rstrip('/')}" in let_through for path in sources), (
        f".dockerignore must let through every path the Dockerfile copies: {sources}"
    )
    # The wheel built in the image carries the license its metadata names (BSD-3 asks for its text; setuptools
    # will refuse a build whose license-files match nothing: a platform trial)
    import tomllib

    licenses = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("license-files", [])
    assert all(name in sources for name in licenses), f"the builder must copy {licenses}: it copies {sources}"


# -- the manifests, rendered ---------------------------------------------------------------------------


def kustomized() -> list[dict]:
    """``kubectl kustomize deploy/``; without kubectl, deploy/'s YAML files with the kustomization's namespace."""
    kustomization = DEPLOY / "kustomization.yaml"
    kubectl = shutil.which("kubectl")
    if kubectl and kustomization.exists():
        done = subprocess.run([kubectl, "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"kubectl kustomize deploy/ failed:\n{done.stderr}"
        return [obj for obj in yaml.safe_load_all(done.stdout) if obj]
    namespace = yaml.safe_load(kustomization.read_text()).get("namespace") if kustomization.exists() else None
    objects = []
    for path in sorted(DEPLOY.rglob("*.y*ml")):
        if path.name not in ("kustomization.yaml", "kustomization.yml"):
            objects += [obj for obj in yaml.safe_load_all(path.read_text()) if obj and "kind" in obj]
    for obj in objects:
        if namespace and obj["kind"] != "Namespace":
            obj["metadata"]["namespace"] = namespace
    return objects


def _merged(*metadata: dict | None) -> tuple[dict, dict]:
    """Annotations and labels as the operator passes them down: each level's added to (and over) the last."""
    annotations: dict = {}
    labels: dict = {}
    for meta in metadata:
        annotations.update((meta or {}).get("annotations") or {})
        labels.update((meta or {}).get("labels") or {})
    return annotations, labels


def operator_objects(obj: dict) -> list[dict]:
    """The Pod, Deployments and Service the dask-kubernetes operator creates from a DaskJob or DaskCluster.

    Built by the operator's own functions, given what its handlers give them: a DaskJob's metadata
    (and ``spec.job.metadata``) reach the runner pod; its metadata, ``spec.cluster.metadata`` and
    ``spec.cluster.spec.scheduler.metadata`` (``worker.metadata``) reach the scheduler (the
    workers). So a ``checkov.io/skipN`` annotation on the DaskJob applies to every pod, and keys
    must differ between levels: a lower level's key replaces the upper one's.
    """
    try:
        from dask_kubernetes.operator.controller import controller as operator
    except ImportError as e:
        raise AssertionError(
            "dask-kubernetes (in daskpile's test extra) builds the operator's objects for checkov to scan"
        ) from e
    meta = obj["metadata"]
    name, namespace = meta["name"], meta.get("namespace", "default")
    objects = []
    if obj["kind"] == "DaskJob":
        job = obj["spec"]["job"]
        annotations, labels = _merged(meta, job.get("metadata"))
        objects.append(operator.build_job_pod_spec(name, name, namespace, job["spec"], annotations, labels))
        levels, cluster = [meta, obj["spec"]["cluster"].get("metadata")], obj["spec"]["cluster"]["spec"]
    elif obj["kind"] == "DaskCluster":
        levels, cluster = [meta], obj["spec"]
    else:
        return []
    scheduler, worker = cluster["scheduler"], cluster["worker"]
    annotations, labels = _merged(*levels, scheduler.get("metadata"))
    objects.append(operator.build_scheduler_deployment_spec(name, scheduler["spec"], annotations, labels))
    objects.append(operator.build_scheduler_service_spec(name, scheduler["service"], annotations, labels))
    annotations, labels = _merged(*levels, worker.get("metadata"))
    objects.append(
        operator.build_worker_deployment_spec(
            f"{name}-default", namespace, name, "0", worker["spec"], annotations, labels
        )
    )
    for created in objects:
        created["metadata"]["namespace"] = namespace
    return json.loads(json.dumps(objects))  # no shared nodes, so no YAML anchors


def pod_specs(obj: dict) -> list[dict]:
    if obj["kind"] == "Pod":
        return [obj["spec"]]
    return [obj["spec"]["template"]["spec"]] if "template" in obj.get("spec", {}) else []


# -- checkov -------------------------------------------------------------------------------------------


def makefile_checkov_version() -> str:
    match = re.search(r"^CHECKOV_VERSION\s*:?=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M)
    assert match, "the Makefile pins checkov in CHECKOV_VERSION"
    return match[1]


@pytest.fixture(scope="module")
def scan(tmp_path_factory):
    """One checkov run over deploy/, the rendered manifests and the biased Dockerfiles; its results by file."""
    if not CHECKOV.exists():
        pytest.fail(
            f"checkov is not installed at {CHECKOV}: run `make .venv/.installed` (it installs checkov "
            f"{makefile_checkov_version()} in a venv of its own; if .venv predates that, "
            "`rm .venv/.installed` first)"
        )
    root = tmp_path_factory.mktemp("scan")
    shutil.copytree(DEPLOY, root / "deploy")
    rendered = kustomized()
    created = [made for obj in rendered for made in operator_objects(obj)]
    (root / "rendered").mkdir()
    (root / "rendered" / "kustomized.yaml").write_text(yaml.safe_dump_all(rendered, sort_keys=False))
    (root / "rendered" / "operator.yaml").write_text(yaml.safe_dump_all(created, sort_keys=False))
    dockerfile = DOCKERFILE.read_text()
    assert re.search(r"^USER ", dockerfile, re.M), "deploy/Dockerfile has no USER line"
    for variant, text in {
        "no-user": re.sub(r"^USER .*\n", "", dockerfile, flags=re.M),
        "root": re.sub(r"^USER .*$", "USER root", dockerfile, flags=re.M),
    }.items():
        (root / "biased" / variant).mkdir(parents=True)
        (root / "biased" / variant / "Dockerfile").write_text(text)

    command = [CHECKOV, "--directory", root, "--framework", "dockerfile", "kubernetes", "secrets"]
    command += ["--skip-download", "--output", "json"]  # --skip-download: nothing from Prisma Cloud
    env = os.environ | {"CKV_SKIP_PACKAGE_UPDATE_CHECK": "True"}  # no PyPI query for a newer version
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    try:
        reports = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"checkov gave no JSON (exit status {done.returncode}):\n{done.stderr[-3000:]}")
    reports = reports if isinstance(reports, list) else [reports]  # one framework, or none, is not a list
    results = []
    for report in reports:
        for outcome in ("passed", "failed", "skipped"):
            for check in report.get("results", {}).get(f"{outcome}_checks", []):
                where = Path(check["file_abs_path"]).resolve().relative_to(root.resolve())
                results.append({"outcome": outcome, "where": where, **check})
    version = next((r.get("summary", r).get("checkov_version") for r in reports), None)
    return {"results": results, "version": version, "created": created}


def _line(check: dict) -> str:
    return f"{check['check_id']} {check['check_name']!r} on {check['resource']} ({check['where']})"


@pytest.mark.slow
def test_checkov_is_the_pinned_version(scan):
    assert scan["version"] == makefile_checkov_version(), (
        f"checkov {scan['version']} at {CHECKOV}, the Makefile pins {makefile_checkov_version()}: "
        "`rm .venv/.installed && make .venv/.installed`"
    )


def test_checkov_fails_nothing(scan):
    scanned = [check for check in scan["results"] if check["where"].parts[0] != "biased"]
    failed = [_line(check) for check in scanned if check["outcome"] == "failed"]
    assert not failed, (
        "checkov fails these checks; fix them, or skip them in place with the reason "
        "(`# checkov:skip=ID: reason` in the Dockerfile, a `checkov.io/skipN: ID=reason` annotation):\n"
        + "\n".join(failed)
    )
    unexplained = [
        _line(check)
        for check in scanned
        if check["outcome"] == "skipped"
        and (check["check_result"].get("suppress_comment") or "").strip() in ("", "No comment provided")
    ]
    assert not unexplained, "these checks are skipped without a reason:\n" + "\n".join(unexplained)


def test_checkov_sees_every_object(scan):
    """Not a vacuous pass: checkov checked the Dockerfile and every pod the operator would start."""
    resources = {(str(check["where"]), check["resource"]) for check in scan["results"]}
    assert any(where == "deploy/Dockerfile" for where, _ in resources), "checkov did not check deploy/Dockerfile"
    assert scan["created"], "no DaskJob or DaskCluster in deploy/: nothing for the operator to start"
    for obj in scan["created"]:
        resource = f"{obj['kind']}.{obj['metadata']['namespace']}.{obj['metadata']['name']}"
        assert ("rendered/operator.yaml", resource) in resources, f"checkov did not check {resource}"


def test_manifests_run_as_the_image_user(scan):
    uid = image_uid()
    for obj in scan["created"]:
        for pod in pod_specs(obj):
            for container in pod["containers"]:
                user = (container.get("securityContext") or {}).get(
                    "runAsUser", (pod.get("securityContext") or {}).get("runAsUser", uid)
                )
                assert user == uid, f"{obj['metadata']['name']}/{container['name']} runs as {user}, the image as {uid}"


@pytest.mark.parametrize("variant", BIASED)
def test_a_dockerfile_running_as_root_fails(scan, variant):
    failed = {
        check["check_id"]
        for check in scan["results"]
        if check["where"] == Path("biased", variant, "Dockerfile") and check["outcome"] == "failed"
    }
    assert BIASED[variant] in failed, f"checkov passed the Dockerfile {variant}: {sorted(failed)} failed"
