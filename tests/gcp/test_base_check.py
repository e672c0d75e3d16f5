"""`python -m tpuserve.base_check`: the serving stacks' plan-time preflight (is the base
there?) and the base's destroy guard (are serving stacks still up?), against the fake Secret
Manager, Cloud Storage, IAM, TPU, Container and Resource Manager APIs; in-process, and as
Terraform runs them."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from werkzeug import Response

from tests.fakes.container import FakeContainer, service_disabled
from tests.fakes.hostile_server import HostileServer, finishes_within
from tests.fakes.iam import FakeIam
from tests.fakes.resourcemanager import FakeResourceManager
from tests.fakes.secretmanager import FakeSecretManager
from tests.fakes.storage import FakeStorage
from tests.fakes.tpu_api import FakeTpuApi, flex_body
from tpuserve import base_check
from tpuserve.gcp.tpu import listing
from tpuserve.paths import REPO_ROOT

TOKEN = "ya29.fake-base-token"
PROJECT, DEPLOYMENT, REGION = "proj-test-1", "tpuserve", "us-west4"
NUMBER = "123456789012"  # the project's number (the fakes' PROJECT_NUMBER)
SECRETS = ["tpuserve-hf-token", "tpuserve-api-key"]
CACHE, WEIGHTS = f"{PROJECT}-tpuserve-xla-cache", f"{PROJECT}-tpuserve-weights"
NODE_SA = f"tpuserve-node@{PROJECT}.iam.gserviceaccount.com"
GUARD_SA = f"tpuserve-guard@{PROJECT}.iam.gserviceaccount.com"


@pytest.fixture
def cloud() -> Iterator[dict[str, Any]]:
    """The six fakes, empty, and the environment that points the edge at them."""
    sm = FakeSecretManager(project=PROJECT, access_token=TOKEN).start()
    storage = FakeStorage(bucket=CACHE, access_token=TOKEN).start()
    iam = FakeIam(project=PROJECT, access_token=TOKEN).start()
    tpu = FakeTpuApi(token=TOKEN).start()
    gke = FakeContainer(project=PROJECT, access_token=TOKEN, project_number=NUMBER).start()
    crm = FakeResourceManager(project=PROJECT, number=NUMBER, access_token=TOKEN).start()
    env = {
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER": sm.endpoint,
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": storage.endpoint,
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_IAM": iam.endpoint,
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": tpu.url,
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_CONTAINER": gke.endpoint,
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDRESOURCEMANAGER": crm.endpoint,
        "CLOUDSDK_AUTH_ACCESS_TOKEN": TOKEN,
        "TPUSERVE_TIME_SCALE": "0",
    }
    yield {"sm": sm, "storage": storage, "iam": iam, "tpu": tpu, "gke": gke, "crm": crm,
           "env": env}
    for fake in (sm, storage, iam, tpu, gke, crm):
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


def tpu_disabled(tpu: FakeTpuApi, consumer: str) -> None:
    """The TPU API's SERVICE_DISABLED (ErrorInfo with its consumer) on its next request."""
    tpu.answer_next(403, disabled_body(consumer, "tpu.googleapis.com", "Cloud TPU API"))


def disabled_body(consumer: str, service: str, title: str) -> bytes:
    return service_disabled(consumer, service=service, title=title).get_data()


@pytest.mark.parametrize("consumer", [NUMBER, PROJECT])
def test_teardown_with_the_tpu_api_disabled_lets_the_base_go(cloud, consumer) -> None:
    tpu_disabled(cloud["tpu"], consumer)  # by number (read from Resource Manager), or by id
    code, out, err = run(["teardown"], teardown_env(cloud))
    assert (code, err) == (0, "")
    assert out == ("tpuserve: no serving stack of deployment 'tpuserve' in us-west4 (the TPU "
                   "API is not enabled in project 'proj-test-1'): the base may go\n")
    assert cloud["crm"].calls == ([f"/v1/projects/{PROJECT}"] if consumer == NUMBER else [])


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
    body = disabled_body(NUMBER, "secretmanager.googleapis.com", "Secret Manager API")
    base["sm"].faults.add(lambda r: True, lambda: Response(body, 403,
                                                           mimetype="application/json"), 2)
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


# ----------------------------------------------------------------------------- what proves
# Teardown lets the base go only on positive proof that nothing of the deployment is in the
# region; preflight lets a stack deploy only on proof that each base item is there. Every
# answer below proves nothing: one line naming it, exit 1 (TPUSERVE_BASE_FORCE=1: a warning).

NOT_DESTROYED = (f"the base of deployment '{DEPLOYMENT}' in project '{PROJECT}' ({REGION}) was "
                 "NOT destroyed: nothing proves that no serving stack is up (set "
                 "TPUSERVE_BASE_FORCE=1 to destroy it anyway)")
NODES_A = f"list nodes in projects/{PROJECT}/locations/us-west4-a"
LOCATIONS = f"list TPU locations of project {PROJECT}"
CLUSTERS = f"list GKE clusters of project {PROJECT}"


def refused(cloud: dict[str, Any]) -> str:
    """The one line of a refused teardown (the base stays), without NOT_DESTROYED."""
    code, out, err = run(["teardown"], teardown_env(cloud))
    assert code == 1 and out == ""
    line = one_line(err)
    assert line.startswith("tpuserve: teardown: ") and line.endswith(f"; {NOT_DESTROYED}")
    return line[len("tpuserve: teardown: "):-len(f"; {NOT_DESTROYED}")]


def test_teardown_refuses_service_disabled_for_another_consumer(cloud) -> None:
    """The caller's quota project has the API off: that says nothing about the base's."""
    tpu_disabled(cloud["tpu"], "987654321098")
    assert refused(cloud) == (
        f"{LOCATIONS}: 403 PERMISSION_DENIED: tpu.googleapis.com says it is not enabled "
        "(SERVICE_DISABLED) for consumer projects/987654321098, which is not provably project "
        f"'{PROJECT}' (project '{PROJECT}' is number {NUMBER}); that consumer may be the "
        "caller's quota project (gcloud config get billing/quota_project, or the "
        "application-default credentials' quota project), so it proves nothing about project "
        f"'{PROJECT}'")


@pytest.mark.parametrize(("steer", "why"), [
    (lambda c: c["crm"].denied.add("resourcemanager.projects.get"),
     (f"project '{PROJECT}''s number could not be read (403 PERMISSION_DENIED from Cloud "
     "Resource Manager)")),
    (lambda c: c["crm"].answer_next(200, "{}"),
     f"project '{PROJECT}''s number could not be read (200 OK from Cloud Resource Manager)"),
])
def test_teardown_refuses_a_consumer_number_it_cannot_check(cloud, steer, why) -> None:
    steer(cloud)
    tpu_disabled(cloud["tpu"], NUMBER)
    line = refused(cloud)
    assert f"consumer projects/{NUMBER}, which is not provably project '{PROJECT}' ({why})" in line


def test_teardown_refuses_a_disabled_api_said_in_words_only(cloud) -> None:
    """"has not been used in project N" without an ErrorInfo names no consumer."""
    cloud["tpu"].fail_next(403, "PERMISSION_DENIED", f"Cloud TPU API has not been used in "
                           f"project {NUMBER} before or it is disabled.")
    assert ("consumer none named, which is not provably project 'proj-test-1' (the answer "
            "carries no ErrorInfo SERVICE_DISABLED naming its consumer)") in refused(cloud)


def test_teardown_refuses_a_list_with_unreachable_locations(cloud) -> None:
    cloud["tpu"].unreachable.add("us-west4-a")
    assert refused(cloud) == (f"{NODES_A}: 200 OK: the answer names unreachable location(s) "
                              "us-west4-a: the list may be incomplete")


# A redirect to an empty zone's list: followed, it would answer `{}` (nothing there).
EMPTY_ZONE = f"/v2/projects/{PROJECT}/locations/us-east1-c/nodes"


@pytest.mark.parametrize(("status", "body", "headers", "said"), [
    (200, "", {}, "200 OK: the answer is empty: it proves nothing"),
    (200, "null", {}, "200 OK: the answer is null, not a JSON object: it proves nothing"),
    (200, "[]", {}, "200 OK: the answer is a list, not a JSON object: it proves nothing"),
    (200, '"ok"', {}, "200 OK: the answer is a string, not a JSON object: it proves nothing"),
    (200, '{"nodes": [null]}', {}, "200 OK: the answer's 'nodes' holds null, not an object"),
    (200, '{"nodes": {}}', {}, "200 OK: the answer's 'nodes' is an object, not a list"),
    (200, '{"unreachable": ""}', {}, ("200 OK: the answer names unreachable location(s) a "
     "string: the list may be incomplete")),
    (200, '{"nextPageToken": 7}', {}, ("200 OK: the answer's nextPageToken is a number, not "
     "a string")),
    (302, "", {"Location": "LOOPBACK" + EMPTY_ZONE},
     ("302 FOUND: the answer is a redirect (to 127.0.0.1:PORT), not an API answer; redirects are "
     "not followed -> check the endpoint override and any proxy in between")),
])
def test_teardown_refuses_tpu_answers_that_prove_nothing(cloud, status, body, headers,
                                                         said) -> None:
    tpu = cloud["tpu"]
    port = tpu.url.split(":")[2].rstrip("/")
    headers = {k: v.replace("LOOPBACK", f"http://127.0.0.1:{port}") for k, v in headers.items()}
    tpu.answer_next(status, body, headers=headers, path_contains="/us-west4-a/nodes")
    assert refused(cloud) == f"{NODES_A}: {said.replace('PORT', port)}"
    assert not tpu.calls("GET", EMPTY_ZONE)  # the redirect was not followed


def test_teardown_refuses_a_region_without_zones(cloud) -> None:
    cloud["tpu"].locations = ("europe-west4-a", "us-central1-a")
    assert refused(cloud) == (f"{LOCATIONS}: 200 OK: the TPU API's locations of project "
                              f"{PROJECT} name no zone of region {REGION}: nothing proves what "
                              "runs there")
    cloud["tpu"].answer_next(200, "{}", path_contains="/locations")  # no locations at all
    assert "name no zone of region us-west4" in refused(cloud)


def test_teardown_refuses_while_the_fleet_cluster_is_up(cloud) -> None:
    gke = cloud["gke"]
    gke.add_cluster("us-west4-a", "tpuserve-fleet", labels={**OURS, "stack": "fleet"})
    gke.add_cluster("us-west4", "tpuserve-lost", labels=OURS, status="PROVISIONING")
    # another deployment's, another region's, not ours: ignored
    gke.add_cluster("us-west4-b", "other-fleet", labels={**OURS, "deployment": "other"})
    gke.add_cluster("europe-west4-a", "tpuserve-fleet", labels={**OURS, "stack": "fleet"})
    gke.add_cluster("us-west4-a", "hand-made", labels={"deployment": DEPLOYMENT})
    code, out, err = run(["teardown"], teardown_env(cloud))
    assert code == 1 and out == ""
    assert err.splitlines() == [
        (f"tpuserve: a serving stack's GKE cluster projects/{PROJECT}/locations/us-west4/"
         "clusters/tpuserve-lost (PROVISIONING) has no stack label; remove it with `gcloud "
         "container clusters delete tpuserve-lost --location us-west4`"),
        (f"tpuserve: serving stack 'fleet' is still up: GKE cluster projects/{PROJECT}/"
         "locations/us-west4-a/clusters/tpuserve-fleet (RUNNING); remove it with `cdktf "
         "destroy fleet`"),
        (f"tpuserve: the base of deployment '{DEPLOYMENT}' in project '{PROJECT}' ({REGION}) "
         "was NOT destroyed: 2 resources of its serving stacks are still up; destroy them "
         "first (commands above), or set TPUSERVE_BASE_FORCE=1 to destroy the base anyway"),
    ]
    assert [c.path for c in gke.calls_of("clusters")] == [
        f"/v1/projects/{PROJECT}/locations/-/clusters"]


def test_teardown_refuses_while_a_zone_of_the_region_is_missing(cloud) -> None:
    gke = cloud["gke"]
    gke.missing_zones.add("europe-west4-a")  # another region's: no cluster of ours is there
    code, _, err = run(["teardown"], teardown_env(cloud))
    assert (code, err) == (0, "")
    gke.missing_zones.add("us-west4-b")
    assert refused(cloud) == (f"{CLUSTERS}: 200 OK: the answer says zone(s) us-west4-b of "
                              f"{REGION} did not answer (missingZones): the list may be "
                              "missing their clusters")


@pytest.mark.parametrize(("status", "body", "said"), [
    (200, "", "200 OK: the answer is empty: it proves nothing"),
    (200, "null", "200 OK: the answer is null, not a JSON object: it proves nothing"),
    (200, '{"clusters": [[]]}', "200 OK: the answer's 'clusters' holds a list, not an object"),
    (200, '{"missingZones": "us-west4-a"}', ("200 OK: the answer's missingZones is a string "
     "of something else than zone names")),
    (200, '{"nextPageToken": "2"}', ("200 OK: the answer is paged (nextPageToken), which "
     "clusters.list does not document: the other pages are unknown")),
])
def test_teardown_refuses_cluster_answers_that_prove_nothing(cloud, status, body,
                                                             said) -> None:
    cloud["gke"].answer_next(status, body)
    assert refused(cloud) == f"{CLUSTERS}: {said}"


def test_teardown_refuses_a_disabled_container_api_of_another_consumer(cloud) -> None:
    cloud["gke"].disabled, cloud["gke"].consumer_number = True, "987654321098"
    line = refused(cloud)
    assert line.startswith(f"{CLUSTERS}: 403 PERMISSION_DENIED: container.googleapis.com says "
                           "it is not enabled (SERVICE_DISABLED) for consumer "
                           "projects/987654321098, which is not provably project")
    cloud["gke"].consumer_number = NUMBER  # the base's own project: no cluster can exist
    code, out, err = run(["teardown"], teardown_env(cloud))
    assert (code, err) == (0, "")
    assert "(the Kubernetes Engine API is not enabled in project 'proj-test-1')" in out


def test_teardown_names_both_apis_when_neither_proves_anything(cloud) -> None:
    cloud["tpu"].unreachable.add("us-west4-b")
    cloud["gke"].answer_next(200, "[]")
    assert refused(cloud) == (
        f"list nodes in projects/{PROJECT}/locations/us-west4-b: 200 OK: the answer names "
        f"unreachable location(s) us-west4-b: the list may be incomplete; {CLUSTERS}: 200 OK: "
        "the answer is a list, not a JSON object: it proves nothing")


@pytest.mark.parametrize("steer", [
    lambda c: c["tpu"].unreachable.add("us-west4-a"),
    lambda c: c["gke"].missing_zones.add("us-west4-a"),
    lambda c: tpu_disabled(c["tpu"], "987654321098"),
    lambda c: c["gke"].answer_next(200, ""),
])
def test_teardown_force_still_overrides_what_proves_nothing(cloud, steer) -> None:
    steer(cloud)
    code, out, err = run(["teardown"], teardown_env(cloud, TPUSERVE_BASE_FORCE="1"))
    assert code == 0 and out == ""
    line = one_line(err)
    assert line.startswith(f"tpuserve: warning: could not list the serving stacks of "
                           f"deployment '{DEPLOYMENT}' in project '{PROJECT}' ({REGION}) to "
                           "the end (")
    assert line.endswith("); TPUSERVE_BASE_FORCE=1: destroying the base anyway")


def test_teardown_as_terraform_runs_it_refuses_what_proves_nothing(cloud) -> None:
    cloud["gke"].missing_zones.add("us-west4-a")
    done = run_module(teardown_env(cloud), "teardown")
    assert done.returncode == 1 and done.stdout == ""
    assert one_line(done.stderr).endswith(NOT_DESTROYED)


def test_preflight_with_nothing_to_check_fails(cloud) -> None:
    code, out, err = run(["preflight"], cloud["env"],
                         json.dumps(query(secrets="", buckets=" ,", service_accounts="")))
    assert code == 2 and out == ""
    assert one_line(err) == ("tpuserve: preflight: the query names no secrets, buckets, "
                             "service_accounts: with nothing checked, nothing proves the base is "
                             "there")


def _answer(status: int, body: str, headers: dict[str, str] | None = None) -> Response:
    return Response(body, status, headers=headers or {}, mimetype="application/json")


@pytest.mark.parametrize(("body", "said"), [
    ("{}", ("200 OK: the answer is not service account NODE (its email is missing): it proves "
     "nothing")),
    (json.dumps({"email": GUARD_SA}), (f"200 OK: the answer is not service account NODE (its "
     f"email is '{GUARD_SA}'): it proves nothing")),
    ('{"email": 7}', ("200 OK: the answer is not service account NODE (its email is 7): it "
     "proves nothing")),
    ("", "200 OK: the answer is empty: it proves nothing"),
    ("null", "200 OK: the answer is null, not a JSON object: it proves nothing"),
    ("[]", "200 OK: the answer is a list, not a JSON object: it proves nothing"),
])
def test_preflight_refuses_a_get_that_is_not_the_resource(base, body, said) -> None:
    base["iam"].faults.add(lambda r: True, lambda: _answer(200, body))
    code, out, err = run(["preflight"], base["env"], json.dumps(query()))
    assert code == 1 and out == ""
    assert one_line(err) == (f"tpuserve: preflight: get service account {NODE_SA}: "
                             + said.replace("NODE", NODE_SA))


@pytest.mark.parametrize(("kind", "body"), [
    ("sm", json.dumps({"name": f"projects/{NUMBER}/secrets/tpuserve-api-key"})),
    ("storage", json.dumps({"kind": "storage#bucket", "name": WEIGHTS, "id": WEIGHTS})),
])
def test_preflight_refuses_another_secret_or_bucket(base, kind, body) -> None:
    if kind == "sm":
        base[kind].faults.add(lambda r: True, lambda: _answer(200, body))
    else:  # the first buckets.get answers another bucket
        base[kind]._get_bucket = lambda bucket: _answer(200, body)
    code, out, err = run(["preflight"], base["env"], json.dumps(query()))
    assert code == 1 and out == ""
    noun, name = (("secret", SECRETS[0]) if kind == "sm" else ("bucket", CACHE))
    assert one_line(err).startswith(f"tpuserve: preflight: get {noun} {name}: 200 OK: the "
                                    f"answer is not {noun} {name} (its name is ")


def test_preflight_refuses_a_redirect_to_an_empty_object(base) -> None:
    iam = base["iam"]
    port = iam.endpoint.split(":")[2].rstrip("/")
    iam.faults.add(lambda r: True,
                   lambda: _answer(302, "", {"Location": f"http://127.0.0.1:{port}/elsewhere"}))
    iam.faults.add(lambda r: True, lambda: _answer(200, "{}"))  # if it were followed
    code, out, err = run(["preflight"], base["env"], json.dumps(query()))
    assert code == 1 and out == ""
    assert len(iam.calls) == 1
    assert one_line(err) == (
        f"tpuserve: preflight: get service account {NODE_SA}: 302 FOUND: the answer is a "
        "redirect (to "
        f"127.0.0.1:{port}), not an API answer; redirects are not followed -> check the "
        "endpoint override and any proxy in between")


def test_preflight_names_the_consumer_of_a_disabled_api_it_cannot_prove(base) -> None:
    body = disabled_body("987654321098", "secretmanager.googleapis.com", "Secret Manager API")
    base["sm"].faults.add(lambda r: True, lambda: _answer(403, body.decode()))
    code, out, err = run(["preflight"], base["env"], json.dumps(query()))
    assert code == 1 and out == ""
    assert one_line(err).startswith(
        f"tpuserve: preflight: get secret {SECRETS[0]}: 403 PERMISSION_DENIED: "
        "secretmanager.googleapis.com says it is not enabled (SERVICE_DISABLED) for consumer "
        f"projects/987654321098, which is not provably project '{PROJECT}'")


def test_teardown_names_what_it_found_and_what_it_could_not_prove(cloud) -> None:
    cloud["tpu"].seed_node(PROJECT, "us-west4-a", "tpuserve-spot",
                           labels={**OURS, "stack": "spot"})
    cloud["gke"].missing_zones.add("us-west4-a")
    code, out, err = run(["teardown"], teardown_env(cloud))
    assert code == 1 and out == ""
    assert err.splitlines() == [
        f"tpuserve: {EXPECTED[1]}",
        (f"tpuserve: teardown: {CLUSTERS}: 200 OK: the answer says zone(s) us-west4-a of "
         f"{REGION} did not answer (missingZones): the list may be missing their clusters; "
         f"the base of deployment '{DEPLOYMENT}' in project '{PROJECT}' ({REGION}) was NOT "
         "destroyed: 1 resource(s) of its serving stacks are up, and nothing proves that no "
         "other serving stack is up (set TPUSERVE_BASE_FORCE=1 to destroy it anyway)")]


# ----------------------------------------------------------------------------- deadline


@pytest.mark.parametrize("mode", ["hang", "trickle"])
def test_preflight_ends_at_its_overall_deadline(base, monkeypatch, mode: str) -> None:
    """A Secret Manager that never finishes an answer: the run's one deadline cuts it (on the
    old code each of the two secrets had 30 s a try and 120 s of retries)."""
    monkeypatch.setattr(base_check, "DEADLINE_S", {"preflight": 2.0, "teardown": 2.0},
                        raising=False)
    with HostileServer(mode, interval_s=0.2) as root:
        env = {**base["env"], "CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER": f"{root}/"}
        code, out, err = finishes_within(25, lambda: run(["preflight"], env, json.dumps(query())))
    assert (code, out) == (1, "")
    line = one_line(err)
    assert "DEADLINE_EXCEEDED" in line and "within 2 s in all (its overall deadline)" in line


def test_teardown_ends_at_its_overall_deadline_and_keeps_the_base(cloud, monkeypatch) -> None:
    monkeypatch.setattr(base_check, "DEADLINE_S", {"preflight": 2.0, "teardown": 2.0},
                        raising=False)
    cloud["tpu"].stall_next(600, method="GET", times=1000)
    code, out, err = finishes_within(25, lambda: run(["teardown"], teardown_env(cloud)))
    assert (code, out) == (1, "")
    line = one_line(err)
    assert "DEADLINE_EXCEEDED" in line and "within 2 s in all" in line
    assert "was NOT destroyed" in line


# ----------------------------------------------------------------------------- outside probes


def test_teardown_refuses_a_location_without_its_id(cloud) -> None:
    """A location of the region named without locationId: its zone (and its nodes) would
    never be listed (on the old code it was dropped, and the base went)."""
    cloud["tpu"].seed_node(PROJECT, "us-west4-b", "tpuserve-spot", labels=OURS)
    locations = {"locations": [{"name": f"projects/{PROJECT}/locations/us-west4-a",
                                "locationId": "us-west4-a"},
                               {"name": f"projects/{PROJECT}/locations/us-west4-b"}]}
    cloud["tpu"].answer_next(200, json.dumps(locations), path_contains="/locations")
    assert refused(cloud) == (
        f"{LOCATIONS}: 200 OK: the answer lists a location without a locationId "
        f"('projects/{PROJECT}/locations/us-west4-b'): its zone is unknown")


@pytest.mark.parametrize("domain", ["example.com", ""])
def test_teardown_refuses_service_disabled_of_another_domain(cloud, domain: str) -> None:
    """ErrorInfo's reason is unique only within its domain: SERVICE_DISABLED is
    googleapis.com's (on the old code any domain, or none, was taken as Google's)."""
    answer = json.loads(disabled_body(PROJECT, "tpu.googleapis.com", "Cloud TPU API"))
    answer["error"]["details"][0]["domain"] = domain
    cloud["tpu"].answer_next(403, json.dumps(answer))
    assert (f"(its ErrorInfo's domain is '{domain}', not googleapis.com)"
            in refused(cloud))


ERROR_200 = json.dumps({"error": {"code": 403, "message": "denied", "status": "PERMISSION_DENIED"}})


@pytest.mark.parametrize(("fake", "path", "action", "fields"), [
    ("tpu", "/nodes", NODES_A, "nodes, nextPageToken, unreachable"),
    ("tpu", "/queuedResources",
     f"list queued resources in projects/{PROJECT}/locations/us-west4-a",
     "queuedResources, nextPageToken, unreachable"),
    ("gke", "", CLUSTERS, "clusters, missingZones"),
])
def test_teardown_refuses_a_200_that_is_not_a_list_answer(cloud, fake, path, action,
                                                          fields) -> None:
    """proto3 JSON omits an empty list, so `{}` is an empty list; an object with none of the
    list's fields (a 200 carrying an error, a proxy's own JSON) is not a list answer (on the
    old code its missing list was taken as empty, and the base went)."""
    cloud[fake].answer_next(200, ERROR_200, path_contains=path, times=100)
    assert refused(cloud) == (f"{action}: 200 OK: the answer has none of the list's fields "
                              f"({fields}) but error: it is not a list answer, and proves "
                              "nothing")


def test_teardown_takes_an_empty_object_as_an_empty_list(cloud) -> None:
    """What Google sends for a zone without nodes (proto3 JSON omits the empty list)."""
    cloud["tpu"].answer_next(200, "{}", path_contains="/nodes", times=100)
    cloud["gke"].answer_next(200, "{}")
    code, out, err = run(["teardown"], teardown_env(cloud))
    assert (code, err) == (0, "") and out.endswith(": the base may go\n")
