"""Session fixtures: the default config and ONE synthesis of every stack per test session."""

from __future__ import annotations

import ast
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The CLI tests' fixtures (fake TPU API, fake OpenAI server, a config pointing at them).
from tests.cli_support import cli_env, fake_oai, fake_tpu  # noqa: F401
from tpuserve.settings import Deployment, load

# The refreshed Catalog file synth reads by default ($XDG_CACHE_HOME/tpuserve/prices.json,
# else ~/.cache/...): an empty cache of the session's own, so no developer's file moves a price
# (set before any test runs, so every subprocess inherits it).
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="tpuserve-test-cache-")


@pytest.fixture(scope="session")
def deployments() -> dict[str, Deployment]:
    return load(environ={}).deployments


# Secret-looking values placed in the environment during synth: none may reach the output.
CANARIES = {"HF_TOKEN": "hf_canaryTOKENvalue0123456789", "OPENAI_API_KEY": "sk-canary-apikey-42",
            # The caller's shell: none may reach the node's metadata, the flex
            # body, the fleet's Kubernetes bundle or the billing guard's inputs.
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": "https://canary-tpu-override.invalid/",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER": "https://canary-sm.invalid/",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": "https://canary-gcs.invalid/storage/v1/",
            "GOOGLE_CLOUD_QUOTA_PROJECT": "canary-quota-project",
            "CLOUDSDK_BILLING_QUOTA_PROJECT": "canary-billing-quota",
            "HTTPS_PROXY": "http://canary-proxy.invalid:3128",
            "NO_PROXY": "canary-no-proxy.invalid",
            "GOOGLE_APPLICATION_CREDENTIALS": "/canary/adc-credentials.json",
            "CLOUDSDK_AUTH_ACCESS_TOKEN": "ya29.canary-access-token",
            "TPUSERVE_TIME_SCALE": "0.000317531",
            "TPUSERVE_ROOT": "/canary/tpuserve-root",
            "GCE_METADATA_HOST": "canary-metadata.invalid:8080",
            "TPUSERVE_GUARD_TPU_ENDPOINT": "https://canary-guard.p.googleapis.com/",
            # gcloud's and google-auth's project, location, endpoint, proxy and credential
            # settings, and the project's own provisioner inputs: the caller's, not the cloud's.
            "CLOUDSDK_CORE_PROJECT": "canary-core-project",
            "GOOGLE_CLOUD_PROJECT": "canary-gcp-project",
            "CLOUDSDK_COMPUTE_ZONE": "canary-zone-z",
            "CLOUDSDK_COMPUTE_REGION": "canary-region",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDTASKS": "https://canary-tasks.invalid/",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_CONTAINER": "https://canary-gke.invalid/",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": "https://canary-gce.invalid/compute/v1/",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_IAM": "https://canary-iam.invalid/",
            "CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT": "canary-impersonate@x.invalid",
            "CLOUDSDK_AUTH_CREDENTIAL_FILE_OVERRIDE": "/canary/credential-file.json",
            "CLOUDSDK_CONFIG": "/canary/gcloud-config",
            "HTTP_PROXY": "http://canary-http-proxy.invalid:3128",
            "https_proxy": "http://canary-lower-proxy.invalid:3128",
            "REQUESTS_CA_BUNDLE": "/canary/ca-bundle.pem",
            "KUBECONFIG": "/canary/kubeconfig",
            "TPUSERVE_QR_BODY": '{"canary": "qr-body"}',
            "TPUSERVE_QR_GENERATION": "canary-generation",
            "TPUSERVE_GUARD_QUEUE": "projects/canary/locations/x/queues/canary-queue",
            "TPUSERVE_DEPLOY_COMMAND": "canary-deploy-command {stack}"}


def synth(deployments: dict[str, Deployment], outdir: Path) -> dict[str, dict[str, Any]]:
    """Synthesize the given stacks into outdir; return {stack: cdk.tf.json as a dict}."""
    import main

    with pytest.MonkeyPatch.context() as mp:
        for name, value in CANARIES.items():
            mp.setenv(name, value)
        main.build_app(deployments, outdir=str(outdir)).synth()
    return {
        p.name: json.loads((p / "cdk.tf.json").read_text())
        for p in sorted((outdir / "stacks").iterdir())
    }


def xdist_worker() -> str | None:
    """This process's pytest-xdist worker id (gw0, gw1, ...), None when not under xdist."""
    return os.environ.get("PYTEST_XDIST_WORKER")


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory: pytest.TempPathFactory, deployments: dict[str, Deployment]) -> Path:
    """The synthesized default stacks: once per run, shared by the xdist workers (the first
    to take the lock synthesizes into the run's shared temp root, the others read it; the
    directory is keyed by a hash of the deployments it was synthesized from). Read-only."""
    if xdist_worker() is None:
        outdir = tmp_path_factory.mktemp("cdktf.out")
        synth(deployments, outdir)
        return outdir
    root = tmp_path_factory.getbasetemp().parent  # one per run, shared by its workers
    key = hashlib.sha256(repr(sorted(deployments.items())).encode()).hexdigest()[:16]
    outdir = root / f"cdktf.out-{key}"
    with (root / f"cdktf.out-{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not outdir.is_dir():
            partial = root / f"cdktf.out-{key}.partial-{xdist_worker()}"
            shutil.rmtree(partial, ignore_errors=True)
            synth(deployments, partial)
            partial.rename(outdir)
    return outdir


@pytest.fixture(scope="session")
def synthesized(synth_dir: Path) -> dict[str, dict[str, Any]]:
    """{stack name: the synthesized cdk.tf.json as a dict}."""
    return {
        p.name: json.loads((p / "cdk.tf.json").read_text())
        for p in sorted((synth_dir / "stacks").iterdir())
    }


# ------------------------------------------------------------------ pytest-xdist scheduling
# `--dist loadscope` (pyproject.toml) with one refinement: a module's tests that use one of
# its module-scoped fixtures (a booted node, a synthesized variant, a review's worktrees:
# 10-20 s each) form one unit, so no worker builds such a fixture twice, and every other test
# is its own unit, so the slow boot and Terraform modules spread over both workers. (xdist's
# own `loadgroup` marks do not take effect under pytest 9: xdist 3.8 renames `item._nodeid`,
# which pytest 9 no longer reads.) The controller does not collect, so it reads each test
# file's fixtures from its source.


def _module_fixture_users(path: str) -> dict[str, str]:
    """{test function name: its unit} for the tests of `path` that need a module-scoped
    fixture of that file, directly or through another fixture of the file."""
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError):
        return {}
    params: dict[str, set[str]] = {}
    shared: set[str] = set()
    tests: list[str] = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        params[node.name] = {a.arg for a in node.args.args}
        for deco in node.decorator_list:
            if isinstance(deco, ast.Call) and any(
                k.arg == "scope" and isinstance(k.value, ast.Constant)
                and k.value.value in ("module", "package") for k in deco.keywords
            ):
                shared.add(node.name)
        if node.name.startswith("test"):
            tests.append(node.name)

    def needs(name: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(p in shared or (p in params and p not in seen
                                   and not p.startswith("test") and needs(p, seen | {name}))
                   for p in params.get(name, ()))

    return {t: f"{path}::module-fixtures" for t in tests if needs(t)}


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    users: dict[str, dict[str, str]] = {}

    class SharedFixtureScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path, _, name = nodeid.partition("::")
            if path not in users:
                users[path] = _module_fixture_users(str(Path(config.rootpath) / path))
            return users[path].get(name.split("[", 1)[0], nodeid)

    return SharedFixtureScheduling(config, log)


# Modules whose units take seconds each (real Terraform, real bash boots against the fakes, a
# review's sandboxed syntheses) are sent first: the scheduler hands out units in collection
# order, and a 13 s unit handed out last leaves the other worker idle at the end.
SLOW_FIRST = ("tests/stacks/test_base_lifecycle.py", "tests/stacks/test_flex_terraform.py",
              "tests/render/boot/", "tests/review/", "tests/stacks/test_guard_terraform.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return next((i for i, p in enumerate(SLOW_FIRST) if path.startswith(p)), len(SLOW_FIRST))

    items.sort(key=rank)  # stable: each module keeps its own order


# The ordinary provider import costs ~10 s of one core: the synthesis through that path starts
# in a child process as soon as collection ends, and runs on the other core while the suite
# goes on; test_cdk_import waits for it. Under xdist the first worker starts it into a
# directory named for the run, and whichever worker runs the test waits for its files.
FULL_IMPORT_TEST = "test_full_import_synthesizes_identical_json"
_full_synth: dict[str, object] = {}
# The child's stdout, stderr, then its exit code (written last, by rename: "done").
_CHILD = 'd=$1; shift; "$@" >"$d/out" 2>"$d/err"; echo $? >"$d/rc.part"; mv "$d/rc.part" "$d/rc"'


def _full_import_dir() -> Path:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        return Path(tempfile.mkdtemp(prefix="tpuserve-full-import-"))
    return Path(tempfile.gettempdir()) / f"tpuserve-full-import-{run}"


def pytest_collection_finish(session: pytest.Session) -> None:
    if xdist_worker() in (None, "gw0") and any(FULL_IMPORT_TEST in item.nodeid
                                               for item in session.items):
        outdir = _full_import_dir()
        outdir.mkdir(exist_ok=True)
        root = Path(__file__).resolve().parent.parent
        _full_synth["proc"] = subprocess.Popen(
            ["bash", "-c", _CHILD, "bash", str(outdir), sys.executable,
             str(root / "bench" / "synth"), "--once", "full", str(outdir / "cdktf.out")],
            env={**os.environ, "TPUSERVE_CDK_IMPORT": "full"}, cwd=root,
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    proc = _full_synth.get("proc")
    if isinstance(proc, subprocess.Popen) and proc.poll() is None:
        # Another worker may still need it, unless the run was interrupted.
        if xdist_worker() is None or exitstatus == pytest.ExitCode.INTERRUPTED:
            proc.kill()
        proc.wait()


@pytest.fixture
def full_import_synth() -> Iterator[tuple[dict[str, object], Path]]:
    """(the figures the child printed, its output directory), once the child is done."""
    outdir = _full_import_dir() if xdist_worker() is not None else None
    if outdir is None:
        proc = _full_synth["proc"]
        assert isinstance(proc, subprocess.Popen)
        proc.wait(timeout=300)
        outdir = Path(proc.args[4])  # type: ignore[index]
    deadline = time.monotonic() + 300
    while not (outdir / "rc").exists():
        assert time.monotonic() < deadline, "the full-import synthesis did not finish"
        time.sleep(0.2)
    try:
        rc = int((outdir / "rc").read_text())
        assert rc == 0, (outdir / "err").read_text()
        out = (outdir / "out").read_text()
        yield json.loads(out.strip().splitlines()[-1]), outdir / "cdktf.out"
    finally:
        shutil.rmtree(outdir, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fake_answers_match_their_documents() -> Iterator[None]:
    """A fake's answer its discovery document refuses fails the test it ran in, even where the
    code under test survived the fake's 500 (tests/fakes/discovery.py)."""
    from tests.fakes.discovery import violation_mark, violations_since

    mark = violation_mark()
    yield
    found = violations_since(mark)
    if found:
        pytest.fail("a fake answered what its discovery document refuses:\n  "
                    + "\n  ".join(found[:5]), pytrace=False)
