"""`python -m tpuserve.base_check`: the serving stacks' plan-time preflight (is the base
there?) and the base's destroy guard (are serving stacks still up?), against the fake Secret
Manager, Cloud Storage, IAM and TPU APIs; in-process, and as Terraform runs them."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.iam import FakeIam
from tests.fakes.secretmanager import FakeSecretManager
from tests.fakes.storage import FakeStorage
from tests.fakes.tpu_api import FakeTpuApi, flex_body
from tpuserve.gcp import base_check
from tpuserve.gcp.tpu import listing
from tpuserve.paths import REPO_ROOT

TOKEN = "ya29.fake-base-token"
PROJECT, DEPLOYMENT, REGION = "proj-test-1", "tpuserve", "us-west4"
SECRETS = ["tpuserve-hf-token", "tpuserve-api-key"]
CACHE, WEIGHTS = f"{PROJECT}-tpuserve-xla-cache", f"{PROJECT}-tpuserve-weights"
NODE_SA = f"tpuserve-node@{PROJECT}.iam.gserviceaccount.com"
GUARD_SA = f"tpuserve-guard@{PROJECT}.iam.gserviceaccount.com"


@pytest.fixture
def cloud() -> Iterator[dict[str, Any]]:
    """The four fakes, empty, and the environment that points the edge at them."""
    sm = FakeSecretManager(project=PROJECT, access_token=TOKEN).start()
    storage = FakeStorage(bucket=CACHE, access_token=TOKEN).start()
    iam = FakeIam(project=PROJECT, access_token=TOKEN).start()
    tpu = FakeTpuApi(token=TOKEN).start()
    env = {
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER": sm.endpoint,
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": storage.endpoint,
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_IAM": iam.endpoint,
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": tpu.url,
        "CLOUDSDK_AUTH_ACCESS_TOKEN": TOKEN,
        "TPUSERVE_TIME_SCALE": "0",
    }
    yield {"sm": sm, "storage": storage, "iam": iam, "tpu": tpu, "env": env}
    for fake in (sm, storage, iam, tpu):
        fake.stop()


@pytest.fixture
def base(cloud: dict[str, Any]) -> dict[str, Any]:
    """A deployed base: both secrets (without versions), both buckets, both accounts."""
    for secret in SECRETS:
        cloud["sm"].create_secret(secret)
    cloud["storage"].add_bucket(WEIGHTS)
    cloud["iam"].create_account("tpuserve-node")
    cloud["iam"].create_account("tpuserve-guard")
    return cloud


def query(**over: str) -> dict[str, str]:
    return {"project": PROJECT, "deployment": DEPLOYMENT, "region": REGION,
            "secrets": ",".join(SECRETS), "buckets": f"{CACHE},{WEIGHTS}",
            "service_accounts": f"{NODE_SA},{GUARD_SA}", "base_command": "cdktf deploy base",
            **over}


def run(argv: list[str], env: dict[str, str], stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = base_check.main(argv, environ=env, stdin=io.StringIO(stdin), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def run_module(env: dict[str, str], *argv: str, stdin: str = "",
               ) -> subprocess.CompletedProcess[str]:
    """As Terraform runs it: a bare environment (PATH=/usr/bin:/bin), JSON on stdin."""
    return subprocess.run(
        [sys.executable, "-m", "tpuserve.base_check", *argv], input=stdin, cwd=REPO_ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", **env},
        capture_output=True, text=True, timeout=120, check=False,
    )


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("tpuserve: "), err
    assert "Traceback" not in err
    return err.rstrip("\n")


# ----------------------------------------------------------------------------- preflight


def test_preflight_ok_when_the_whole_base_is_there(base) -> None:
    code, out, err = run(["preflight"], base["env"], json.dumps(query()))
    assert (code, err) == (0, "")
    assert json.loads(out) == {"base": "ok", "checked": "6"}
    assert [c.secret for c in base["sm"].calls] == SECRETS
    assert [c.name for c in base["storage"].calls_of("bucket")] == [CACHE, WEIGHTS]
    assert [c.email for c in base["iam"].calls] == [NODE_SA, GUARD_SA]


def test_preflight_as_terraform_runs_it_with_nothing_on_path(base) -> None:
    done = run_module(base["env"], "preflight", stdin=json.dumps(query()))
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout) == {"base": "ok", "checked": "6"}


def test_preflight_names_everything_missing_in_one_line(cloud) -> None:
    code, out, err = run(["preflight"], cloud["env"], json.dumps(query()))
    assert code == 1 and out == ""
    assert one_line(err) == (
        "tpuserve: the base of deployment 'tpuserve' is not deployed in project 'proj-test-1' "
        "(region us-west4): missing secret tpuserve-hf-token, tpuserve-api-key, bucket "
        f"{WEIGHTS}, service account {NODE_SA}, {GUARD_SA}. Create it first: cdktf deploy base"
    )  # the fake storage always has CACHE: it is the one bucket not missing


@pytest.mark.parametrize(("remove", "missing"), [
    (lambda c: c["sm"].secrets.pop("tpuserve-api-key"), "missing secret tpuserve-api-key."),
    (lambda c: c["storage"].more_buckets.discard(WEIGHTS), f"missing bucket {WEIGHTS}."),
    (lambda c: c["iam"].accounts.discard(GUARD_SA), f"missing service account {GUARD_SA}."),
])
def test_preflight_names_each_kind_missing(base, remove, missing) -> None:
    remove(base)
    code, out, err = run(["preflight"], base["env"], json.dumps(query()))
    assert code == 1 and out == ""
    line = one_line(err)
    assert f"{missing} Create it first: cdktf deploy base" in line


def test_preflight_checks_only_what_the_query_lists(cloud) -> None:
    q = query(secrets="", buckets=CACHE, service_accounts="")
    code, out, err = run(["preflight"], cloud["env"], json.dumps(q))
    assert (code, err, json.loads(out)) == (0, "", {"base": "ok", "checked": "1"})
    assert not cloud["sm"].calls and not cloud["iam"].calls


def test_preflight_permission_denied_is_its_own_line(base) -> None:
    base["sm"].denied.add("secretmanager.secrets.get")
    base["storage"].denied.add("storage.buckets.get")
    base["iam"].accounts.discard(NODE_SA)
    code, out, err = run(["preflight"], base["env"], json.dumps(query()))
    assert code == 1 and out == ""
    assert one_line(err) == (
        "tpuserve: cannot check the base of deployment 'tpuserve' in project 'proj-test-1' "
        "(region us-west4): permission denied (secretmanager.secrets.get, storage.buckets.get) "
        f"on secret tpuserve-hf-token, tpuserve-api-key, bucket {CACHE}, {WEIGHTS}; missing: "
        f"service account {NODE_SA}: grant your account secretmanager.secrets.get, "
        "storage.buckets.get in project 'proj-test-1' (or check the project id), then plan "
        "again"
    )


def test_preflight_retries_transient_faults_then_says_one_line(base) -> None:
    base["sm"].fail_next_get(503, "UNAVAILABLE", "try again", times=2)
    code, out, _ = run(["preflight"], base["env"], json.dumps(query()))
    assert code == 0 and json.loads(out)["checked"] == "6"
    base["storage"].fail_next(503, kind="bucket", times=50)
    code, out, err = run(["preflight"], base["env"], json.dumps(query()))
    assert code == 1 and out == ""
    line = one_line(err)
    assert line.startswith(f"tpuserve: preflight: get bucket {CACHE}: 503 ")
    assert len(base["storage"].calls_of("bucket")) == 2 + 6  # the first run's 2, then 6 tries


def test_preflight_unauthenticated_is_one_line(base) -> None:
    code, out, err = run(["preflight"], {**base["env"], "CLOUDSDK_AUTH_ACCESS_TOKEN": "stale"},
                         json.dumps(query()))
    assert code == 1 and out == ""
    assert "401 UNAUTHENTICATED" in one_line(err)


@pytest.mark.parametrize(("stdin", "message"), [
    ("", "stdin is not JSON"),
    ("{not json", "stdin is not JSON"),
    ('["project"]', "stdin must be a JSON object of strings"),
    (json.dumps({**query(), "zone": "us-west4-a"}), "unknown query key(s) zone"),
    (json.dumps({**query(), "secrets": ["a"]}), "query value(s) of secrets must be strings"),
    (json.dumps({k: v for k, v in query().items() if k != "base_command"}),
     "the query lacks base_command"),
    (json.dumps(query(project="../etc")), "project '../etc' is not a Google Cloud project id"),
    (json.dumps(query(region="us-west4-a ")), "region 'us-west4-a' is not a region"),
    (json.dumps(query(buckets="ok-bucket,Bad/Bucket")), "'Bad/Bucket' is not a valid bucket"),
    (json.dumps(query(secrets="a b")), "'a b' is not a valid secret name"),
])
def test_preflight_malformed_stdin_is_one_line_exit_2(cloud, stdin, message) -> None:
    code, out, err = run(["preflight"], cloud["env"], stdin)
    assert code == 2 and out == ""
    assert message in one_line(err)


def test_malformed_stdin_as_terraform_runs_it(cloud) -> None:
    done = run_module(cloud["env"], "preflight", stdin="{")
    assert done.returncode == 2 and done.stdout == ""
    assert "stdin is not JSON" in one_line(done.stderr)


@pytest.mark.parametrize(("argv", "env", "message"), [
    ([], {}, "expected one command, preflight or teardown (got none)"),
    (["probe"], {}, "(got probe)"),
    (["preflight"], {"CLOUDSDK_API_ENDPOINT_OVERRIDES_IAM": "iam.local"},
     "CLOUDSDK_API_ENDPOINT_OVERRIDES_IAM = 'iam.local'"),
    (["teardown"], {"TPUSERVE_TIME_SCALE": "fast"}, "TPUSERVE_TIME_SCALE = 'fast'"),
])
def test_bad_usage_is_one_line_exit_2(cloud, argv, env, message) -> None:
    code, out, err = run(argv, {**cloud["env"], **env}, json.dumps(query()))
    assert code == 2 and out == ""
    assert message in one_line(err)


# ----------------------------------------------------------------------------- teardown

OURS = {"managed-by": "tpuserve", "deployment": DEPLOYMENT}


def teardown_env(cloud: dict[str, Any], **over: str) -> dict[str, str]:
    return {**cloud["env"], "TPUSERVE_BASE_PROJECT": PROJECT,
            "TPUSERVE_BASE_DEPLOYMENT": DEPLOYMENT, "TPUSERVE_BASE_REGION": REGION, **over}


def seed_stacks(tpu: FakeTpuApi) -> None:
    """Serving stacks of this deployment in us-west4-a and -b; others that must be ignored."""
    tpu.seed_node(PROJECT, "us-west4-a", "tpuserve-spot", labels={**OURS, "stack": "spot"})
    tpu.seed_queued_resource(PROJECT, "us-west4-b", "tpuserve-flex", state="ACCEPTED",
                             body=flex_body(PROJECT, "us-west4-b", "tpuserve-flex",
                                            labels={**OURS, "stack": "flex"}))
    # another deployment in the region; this deployment in another region; not ours at all
    tpu.seed_node(PROJECT, "us-west4-a", "other-spot",
                  labels={**OURS, "deployment": "other", "stack": "spot"})
    tpu.seed_node(PROJECT, "europe-west4-a", "tpuserve-ondemand",
                  labels={**OURS, "stack": "ondemand"})
    tpu.seed_node(PROJECT, "us-west4-b", "hand-made", labels={"deployment": DEPLOYMENT})


EXPECTED = [
    ("serving stack 'flex' is still up: queued resource "
     f"projects/{PROJECT}/locations/us-west4-b/queuedResources/tpuserve-flex (ACCEPTED); "
     "remove it with `cdktf destroy flex`"),
    ("serving stack 'spot' is still up: node "
     f"projects/{PROJECT}/locations/us-west4-a/nodes/tpuserve-spot (READY); remove it with "
     "`cdktf destroy spot`"),
]


def test_teardown_refuses_while_serving_stacks_are_up(cloud) -> None:
    seed_stacks(cloud["tpu"])
    code, out, err = run(["teardown"], teardown_env(cloud))
    assert code == 1 and out == ""
    assert err.splitlines() == [f"tpuserve: {line}" for line in EXPECTED] + [
        (f"tpuserve: the base of deployment '{DEPLOYMENT}' in project '{PROJECT}' ({REGION}) "
         "was NOT destroyed: 2 TPU resources of its serving stacks are still up; destroy them "
         "first (commands above), or set TPUSERVE_BASE_FORCE=1 to destroy the base anyway")
    ]
    listed = {r.path for r in cloud["tpu"].calls("GET")}
    assert f"/v2/projects/{PROJECT}/locations" in listed
    assert not any("europe-west4" in path or "us-central1" in path for path in listed)
    assert {f"/v2/projects/{PROJECT}/locations/{z}/nodes" for z in ("us-west4-a", "us-west4-b")
            } | {f"/v2alpha1/projects/{PROJECT}/locations/{z}/queuedResources"
                 for z in ("us-west4-a", "us-west4-b")} <= listed


def test_teardown_lists_a_flex_node_beside_its_queued_resource(cloud) -> None:
    cloud["tpu"].seed_queued_resource(PROJECT, "us-west4-a", "tpuserve-flex",
                                      body=flex_body(PROJECT, "us-west4-a", "tpuserve-flex",
                                                     labels={**OURS, "stack": "flex"}))
    code, _, err = run(["teardown"], teardown_env(cloud))
    assert code == 1
    assert [ln.split(": ", 2)[2].split(" (")[0] for ln in err.splitlines()[:-1]] == [
        f"queued resource projects/{PROJECT}/locations/us-west4-a/queuedResources/tpuserve-flex",
        f"node projects/{PROJECT}/locations/us-west4-a/nodes/tpuserve-flex",
    ]


def test_teardown_force_warns_and_lets_the_base_go(cloud) -> None:
    seed_stacks(cloud["tpu"])
    code, out, err = run(["teardown"], teardown_env(cloud, TPUSERVE_BASE_FORCE="1"))
    assert code == 0 and out == ""
    lines = err.splitlines()
    assert lines[:-1] == [f"tpuserve: warning: {line}" for line in EXPECTED]
    assert lines[-1].startswith("tpuserve: warning: TPUSERVE_BASE_FORCE=1: destroying the "
                                f"base of deployment '{DEPLOYMENT}'")
    assert "the 2 TPU resources above" in lines[-1]


def test_teardown_follows_every_page(cloud, monkeypatch) -> None:
    monkeypatch.setattr(listing, "PAGE_SIZE", 1)
    tpu = cloud["tpu"]
    for i in range(3):
        tpu.seed_node(PROJECT, "us-west4-b", f"tpuserve-spot-{i}",
                      labels={**OURS, "stack": f"spot{i}"})
    code, _, err = run(["teardown"], teardown_env(cloud))
    assert code == 1
    assert [ln.split("'")[1] for ln in err.splitlines()[:-1]] == ["spot0", "spot1", "spot2"]
    tokens = [r.query.get("pageToken") for r in tpu.calls("GET", "/us-west4-b/nodes")]
    assert tokens == [None, "1", "2"]
    pages = [r.query.get("pageToken") for r in tpu.calls("GET")
             if r.path == f"/v2/projects/{PROJECT}/locations"]  # one zone a page
    assert len(pages) > 10 and pages == [None, *map(str, range(1, len(pages)))]


def test_teardown_with_nothing_up_lets_the_base_go(cloud) -> None:
    cloud["tpu"].seed_node(PROJECT, "us-west4-a", "other-spot",
                           labels={**OURS, "deployment": "other", "stack": "spot"})
    code, out, err = run(["teardown"], teardown_env(cloud))
    assert (code, err) == (0, "")
    assert out == (f"tpuserve: no serving stack of deployment '{DEPLOYMENT}' in {REGION}: the "
                   "base may go\n")


def test_teardown_as_terraform_runs_it_with_nothing_on_path(cloud) -> None:
    seed_stacks(cloud["tpu"])
    done = run_module(teardown_env(cloud), "teardown")
    assert done.returncode == 1 and done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[0] == f"tpuserve: {EXPECTED[0]}"
    done = run_module(teardown_env(cloud, TPUSERVE_BASE_FORCE="1"), "teardown")
    assert done.returncode == 0


def test_teardown_api_errors_are_one_line(cloud) -> None:
    tpu = cloud["tpu"]
    tpu.fail_next(403, "PERMISSION_DENIED", "Permission 'tpu.nodes.list' denied on "
                  f"'projects/{PROJECT}/locations/us-west4-a'", path_contains="/nodes")
    code, out, err = run(["teardown"], teardown_env(cloud))
    assert code == 1 and out == ""
    line = one_line(err)
    assert line.startswith(f"tpuserve: teardown: list nodes in projects/{PROJECT}/locations/"
                           "us-west4-a: 403 PERMISSION_DENIED: Permission 'tpu.nodes.list'")
    # forced, a listing that fails is a warning: the base goes anyway
    tpu.fail_next(503, "UNAVAILABLE", "down", times=50)
    code, out, err = run(["teardown"], teardown_env(cloud, TPUSERVE_BASE_FORCE="1"))
    assert code == 0 and out == ""
    assert one_line(err).startswith("tpuserve: warning: could not list the serving stacks")


def test_teardown_with_the_tpu_api_disabled_lets_the_base_go(cloud) -> None:
    cloud["tpu"].fail_next(403, "PERMISSION_DENIED", "Cloud TPU API has not been used in "
                           "project 123456789012 before or it is disabled. Enable it by "
                           "visiting https://console.developers.google.com/apis/api/tpu."
                           "googleapis.com/overview?project=123456789012 then retry.")
    code, out, err = run(["teardown"], teardown_env(cloud))
    assert (code, err) == (0, "")
    assert "the TPU API is not enabled in project 'proj-test-1'" in out


@pytest.mark.parametrize(("over", "message"), [
    ({"TPUSERVE_BASE_REGION": ""}, "TPUSERVE_BASE_REGION unset"),
    ({"TPUSERVE_BASE_DEPLOYMENT": "Bad_Name"}, "deployment 'Bad_Name' is not a deployment"),
    ({"TPUSERVE_BASE_FORCE": "yes"}, "TPUSERVE_BASE_FORCE = 'yes'"),
])
def test_teardown_bad_environment_is_one_line_exit_2(cloud, over, message) -> None:
    code, out, err = run(["teardown"], teardown_env(cloud, **over))
    assert code == 2 and out == ""
    assert message in one_line(err)


def test_preflight_with_an_api_disabled_counts_its_resources_missing(base) -> None:
    base["sm"].fail_next_get(403, "PERMISSION_DENIED", "Secret Manager API has not been used "
                             "in project 123456789012 before or it is disabled.", times=2)
    code, out, err = run(["preflight"], base["env"], json.dumps(query()))
    assert code == 1 and out == ""
    assert ("missing secret tpuserve-hf-token, tpuserve-api-key (not enabled in the project: "
            "secretmanager.googleapis.com). Create it first: cdktf deploy base") in one_line(err)


def test_teardown_names_a_resource_without_a_stack_label(cloud) -> None:
    cloud["tpu"].seed_node(PROJECT, "us-west4-b", "tpuserve-lost", labels=OURS)
    code, _, err = run(["teardown"], teardown_env(cloud))
    assert code == 1
    assert err.splitlines()[0] == (
        f"tpuserve: a serving stack's node projects/{PROJECT}/locations/us-west4-b/nodes/"
        "tpuserve-lost (READY) has no stack label; remove it with `gcloud compute tpus tpu-vm "
        "delete tpuserve-lost --zone us-west4-b`")
