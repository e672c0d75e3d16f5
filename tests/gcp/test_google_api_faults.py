"""Transient faults at the Google API edge, through the public entry points.

The fake TPU API answers faults the way Google's front end and APIs do (error JSON with or
without `status`, Retry-After, HTML error pages, dropped connections, stalled bodies). The
rules: transient faults are retried by ONE policy on the REST path and the google-cloud-tpu
node path alike; a queued-resource create deletes what it made only on a definitive outcome;
errors render as one line on both paths. No credentials: tests/gcp/test_credentials.py.
"""

from __future__ import annotations

import json

import pytest

from tests.cli_support import Env, assert_one_line_error, invoke
from tests.fakes.tpu_api import FakeTpuApi, flex_body
from tests.gcp.tpu_support import PROJECT, QR_ID, REF, ZONE, Clock, Seen, one_line, run_module
from tpuserve.gcp.errors import ApiError
from tpuserve.gcp.provisioner import probe
from tpuserve.gcp.retry import DEFAULT_POLICY, RetryPolicy, retry_after_seconds
from tpuserve.gcp.tpu.client import TpuClient
from tpuserve.gcp.tpu.nodes import make_client
from tpuserve.gcp.tpu.queued_resources import MISSING, QueuedResourceError, UnknownState
from tpuserve.render.queued_resource_body import with_generation
from tpuserve.settings import from_raw, load_raw


def client_for(api: FakeTpuApi, clock: Clock, **env: str) -> TpuClient:
    return TpuClient(environ={**api.environ(), **env}, clock=clock, sleep=clock.sleep,
                     poll_interval=5.0)


# ---------------------------------------------------------------- the policy


def test_backoff_is_capped_full_jitter_and_retry_after_is_honoured_up_to_its_cap() -> None:
    p = DEFAULT_POLICY
    assert [p.backoff(n, lambda: 1.0) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert p.backoff(3, lambda: 0.25) == 1.0  # uniform in [0, step]
    assert p.pause(1, 7.0) == 7.0 and p.pause(1, 3600.0) == p.max_retry_after_s
    assert retry_after_seconds("12") == 12.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) \
        == 10.0
    assert retry_after_seconds("soon") is None
    assert [p.is_transient(c) for c in (0, 429, 500, 502, 503, 504, 400, 403, 404, 409)] == [
        True, True, True, True, True, True, False, False, False, False]
    with pytest.raises(ValueError, match="TPUSERVE_TIME_SCALE = 'fast'"):
        RetryPolicy.from_env({"TPUSERVE_TIME_SCALE": "fast"})
    print(f"\nretry policy: {p.describe()}")


@pytest.mark.parametrize(("retry_after", "pause"), [("5", 5.0), ("3600", 60.0), (None, None)])
def test_a_429_is_retried_after_its_retry_after(api, retry_after, pause) -> None:
    clock = Clock()
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=flex_body(PROJECT, ZONE, QR_ID))
    api.fail_next(429, "RESOURCE_EXHAUSTED", "Quota exceeded for quota metric 'Read requests'",
                  method="GET", retry_after=retry_after)
    assert client_for(api, clock).get_queued_resource(REF).state == "ACTIVE"
    [slept] = clock.slept
    assert slept == pause if pause is not None else 0 <= slept <= 1.0


@pytest.mark.parametrize("fault", ["drop", "html", "json-no-status", "stall"])
def test_resets_front_end_pages_and_read_timeouts_are_retried(api, fault) -> None:
    clock = Clock()
    client = client_for(api, clock)
    client.timeout = 0.3  # the stalled answer's read timeout
    {"drop": lambda: api.drop_next(times=2),
     "html": lambda: api.html_next(502, times=2),
     "json-no-status": lambda: api.fail_next(503, "", "The service is unavailable.", times=2),
     "stall": lambda: api.stall_next(5, times=2)}[fault]()
    assert client.get_queued_resource(REF) is None  # the third try's answer: 404
    assert len(clock.slept) == 2 and len(api.calls("GET")) == 3


def test_retries_stop_at_the_tries_and_at_the_commands_deadline(api) -> None:
    clock = Clock()
    client = client_for(api, clock)
    api.fail_next(503, "UNAVAILABLE", "down", times=1000)
    with pytest.raises(ApiError, match="503 UNAVAILABLE: down"):
        client.get_queued_resource(REF)
    assert len(api.calls("GET")) == DEFAULT_POLICY.tries
    calls = len(api.calls("GET"))
    steady = TpuClient(environ=api.environ(), clock=clock, sleep=clock.sleep,
                       rand=lambda: 1.0)  # no jitter: pauses of 1, 2, 4 ... s
    # A command with 2.5 s left: the 1 s pause and a try of min_try_s (1 s) fit; the 2 s
    # pause does not.
    steady.deadline = clock.now + 2.5
    with pytest.raises(ApiError):
        steady.get_queued_resource(REF)
    assert len(api.calls("GET")) - calls == 2


def test_errors_that_are_not_transient_are_not_retried(api) -> None:
    clock = Clock()
    api.fail_next(403, "PERMISSION_DENIED", "Permission 'tpu.queuedResources.get' denied")
    with pytest.raises(ApiError, match="403 PERMISSION_DENIED"):
        client_for(api, clock).get_queued_resource(REF)
    assert clock.slept == [] and len(api.calls("GET")) == 1


# ---------------------------------------------------------------- create keeps its place


def test_a_429_burst_while_create_waits_does_not_cost_the_queue_position(fast_api) -> None:
    env = {**fast_api.environ(), "TPUSERVE_QR_NAME": REF.name,
           "TPUSERVE_QR_BODY": json.dumps(flex_body(PROJECT, ZONE, QR_ID))}
    path = f"/queuedResources/{QR_ID}"
    # After the create's first look (nothing there), more faults than one read's tries:
    # the wait polls again instead of giving up.
    fast_api.fail_next(429, "RESOURCE_EXHAUSTED", "Rate limited", method="GET",
                       path_contains=path, times=3, retry_after="1", skip=1)
    fast_api.fail_next(429, "RESOURCE_EXHAUSTED", "Rate limited", method="GET",
                       path_contains=path, times=3)
    fast_api.html_next(502, method="GET", path_contains=path)
    fast_api.drop_next(method="GET", path_contains=path)
    done = run_module(env, "create")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"tpuserve: created {REF.name}: ")
    assert len(fast_api.calls("POST")) == 1 and not fast_api.calls("DELETE")
    assert fast_api.state_of(QR_ID) == "ACTIVE"


def test_a_create_whose_reads_keep_failing_leaves_the_qr_and_says_how_to_resume(api) -> None:
    env = {**api.environ(), "TPUSERVE_QR_NAME": REF.name,
           "TPUSERVE_QR_BODY": json.dumps(flex_body(PROJECT, ZONE, QR_ID))}
    api.fail_next(503, "UNAVAILABLE", "The service is currently unavailable.", method="GET",
                  path_contains=f"/queuedResources/{QR_ID}", times=100_000, skip=1)
    done = run_module(env, "create", "--timeout", "1")
    assert done.returncode == 1
    line = one_line(done.stderr)
    assert "UNREADABLE (503 UNAVAILABLE)" in line and "not ACCEPTED yet" in line
    assert "was left in place" in line and "cdktf deploy flex" in line
    assert not api.calls("DELETE") and api.state_of(QR_ID) == "CREATING"


def test_a_create_reset_after_the_server_acted_knows_the_qr_is_its_own(api) -> None:
    clock = Clock()
    clock.hooks.append(api.advance)
    api.drop_next(method="POST")  # the create happened; its answer was lost
    body = with_generation(flex_body(PROJECT, ZONE, QR_ID), "gen-7")
    result = client_for(api, clock).create_queued_resource(REF, body)
    assert result.queued_resource.state == "ACCEPTED" and result.adopted is False
    assert len(api.calls("POST")) == 2 and len(api.queued_resources) == 1


def test_a_create_reset_that_then_fails_removes_its_own_qr(api) -> None:
    clock = Clock()
    def fail_then_advance() -> None:
        if api.state_of(QR_ID) == "CREATING":
            api.set_state(QR_ID, "FAILED", failure="no capacity")
        else:
            api.advance()

    clock.hooks.append(fail_then_advance)
    api.drop_next(method="POST")
    body = with_generation(flex_body(PROJECT, ZONE, QR_ID), "gen-7")
    with pytest.raises(QueuedResourceError, match="is FAILED: no capacity") as err:
        client_for(api, clock).create_queued_resource(REF, body)
    assert err.value.__notes__ == ["the queued resource this create made was deleted again"]
    assert api.state_of(QR_ID) is None


def test_a_create_refused_for_quota_is_not_retried(api) -> None:
    clock = Clock()
    api.fail_next(429, "RESOURCE_EXHAUSTED", "Quota 'TPUV5sPreemptibleLitepodPerProjectPerZone"
                  "ForTPUAPI' exceeded", method="POST")
    with pytest.raises(ApiError, match="429 RESOURCE_EXHAUSTED: Quota"):
        client_for(api, clock).create_queued_resource(REF, flex_body(PROJECT, ZONE, QR_ID))
    assert len(api.calls("POST")) == 1 and clock.slept == []


# ---------------------------------------------------------------- delete refusals


@pytest.mark.parametrize("refusal", [(400, "FAILED_PRECONDITION"), (409, "ABORTED"),
                                     (412, ""), (400, "")])
def test_a_refused_delete_of_a_provisioning_qr_waits_whatever_the_refusal_says(
    api, refusal: tuple[int, str],
) -> None:
    clock = Clock()
    clock.hooks.append(lambda: api.advance(QR_ID))
    api.provisioning_delete_refusal = refusal
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="PROVISIONING",
                             body=flex_body(PROJECT, ZONE, QR_ID))
    seen = Seen()
    assert client_for(api, clock).delete_queued_resource(REF, on_progress=seen) is True
    assert len(api.calls("DELETE")) == 2
    assert seen.states[1].startswith("PROVISIONING (cannot be deleted")
    assert seen.states[-1] == MISSING


def test_a_refused_delete_of_a_qr_that_is_not_provisioning_is_reported_at_once(api) -> None:
    clock = Clock()
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=flex_body(PROJECT, ZONE, QR_ID))
    api.fail_next(400, "", "Request contains an invalid argument.", method="DELETE")
    with pytest.raises(ApiError, match="400 INVALID_ARGUMENT: Request contains"):
        client_for(api, clock).delete_queued_resource(REF)
    assert len(api.calls("DELETE")) == 1 and clock.slept == []


def test_a_delete_whose_reads_fail_longer_than_their_retries_polls_on(api) -> None:
    """More failures than one read's tries: the delete's wait polls again, as create's does."""
    clock = Clock()
    clock.hooks.append(lambda: api.advance(QR_ID))
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=flex_body(PROJECT, ZONE, QR_ID))
    api.fail_next(503, "UNAVAILABLE", "The service is currently unavailable.", method="GET",
                  path_contains=f"/queuedResources/{QR_ID}", times=8)
    seen = Seen()
    assert client_for(api, clock).delete_queued_resource(REF, on_progress=seen) is True
    assert any(s.startswith("UNREADABLE (503") for s in seen.states), seen.states
    assert seen.states[-1] == MISSING and api.state_of(QR_ID) is None


# ---------------------------------------------------------------- unknown states


def test_a_state_unspecified_qr_is_unknown_not_replaced(fast_api) -> None:
    labelled = fast_api.seed_queued_resource(PROJECT, ZONE, QR_ID, generation="gen-1")
    fast_api.set_state(labelled, "STATE_UNSPECIFIED")
    done = run_module(fast_api.environ(), "probe", stdin=json.dumps({"name": REF.name}))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"generation": "gen-1",
                                       "state": "UNKNOWN (STATE_UNSPECIFIED)"}
    env = {**fast_api.environ(), "TPUSERVE_QR_NAME": REF.name,
           "TPUSERVE_QR_BODY": json.dumps(flex_body(PROJECT, ZONE, QR_ID))}
    done = run_module(env, "create")
    assert done.returncode == 1 and "reports state STATE_UNSPECIFIED (unknown)" in one_line(
        done.stderr)
    assert not fast_api.calls("DELETE") and not fast_api.calls("POST")


def test_an_unlabelled_unknown_qr_fails_the_probe_rather_than_guess(api) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID)
    api.set_state(QR_ID, "STATE_UNSPECIFIED")
    with pytest.raises(UnknownState, match="left alone"):
        probe(client_for(api, Clock()), REF)


def test_status_reports_an_unknown_qr_without_offering_recovery(cli_env: Env) -> None:
    d = cli_env.seed_ready("flex")
    cli_env.tpu.set_state(d.node_name, "STATE_UNSPECIFIED")
    (s,) = json.loads(invoke("status", "flex", "--json").stdout)["stacks"]
    assert s["queued_resource_state"] == "STATE_UNSPECIFIED" and s["recoverable"] is False
    assert any("state unknown (STATE_UNSPECIFIED)" in p for p in s["problems"])


def test_wait_treats_an_unknown_qr_as_not_ready_yet_not_as_dead(cli_env: Env) -> None:
    d = cli_env.d("flex")
    cli_env.tpu.seed_queued_resource(d.gcp.project, d.gcp.zone, d.node_name, state="ACCEPTED")
    cli_env.tpu.set_state(d.node_name, "STATE_UNSPECIFIED")
    result = invoke("wait", "flex", "--timeout", "2", "--poll-interval", "0.5")
    assert result.exit_code == 3  # timed out waiting, not failed as dead
    assert "UNKNOWN (STATE_UNSPECIFIED)" in result.stderr
    assert "recover" not in result.stderr


# ---------------------------------------------------------------- the node path


def spot():
    return from_raw(load_raw(environ={})).deployments["spot"]


def node_api(api: FakeTpuApi, clock: Clock, **env: str) -> TpuClient:
    environ = {**api.environ(), **env}
    return TpuClient(node_client=lambda: make_client(environ), environ=environ, clock=clock,
                     sleep=clock.sleep, policy=RetryPolicy.from_env(environ))


def test_the_node_path_retries_like_the_rest_path(api) -> None:
    d = spot()
    api.seed_node(d.gcp.project, d.gcp.zone, d.node_name)
    clock = Clock()
    nodes = node_api(api, clock)
    api.fail_next(503, "UNAVAILABLE", "try again", method="GET", path_contains="/nodes/")
    api.html_next(502, method="GET", path_contains="/nodes/")
    api.drop_next(method="GET", path_contains="/nodes/")
    api.fail_next(429, "RESOURCE_EXHAUSTED", "slow down", method="GET", path_contains="/nodes/",
                  retry_after="4")
    assert nodes.get_node(d).state == "READY"
    assert len(clock.slept) == 4 and clock.slept[-1] == 4.0


def test_both_paths_render_an_html_502_as_one_line_without_markup_or_url(api) -> None:
    d = spot()
    api.seed_node(d.gcp.project, d.gcp.zone, d.node_name)
    clock = Clock()
    api.html_next(502, times=1000)
    with pytest.raises(ApiError) as rest:
        client_for(api, clock).get_queued_resource(REF)
    with pytest.raises(ApiError) as node:
        node_api(api, clock).get_node(d)
    for err in (rest.value, node.value):
        text = str(err)
        assert "502 BAD_GATEWAY: Bad Gateway (an error page from Google's front end" in text
        assert "<" not in text and "http" not in text and "\n" not in text
    assert str(rest.value).split(": ", 1)[1] == str(node.value).split(": ", 1)[1]


def test_a_refused_token_says_how_to_get_a_new_one_on_both_paths(api) -> None:
    d = spot()
    clock = Clock()
    stale = {"CLOUDSDK_AUTH_ACCESS_TOKEN": "ya29.expired"}
    with pytest.raises(ApiError) as rest:
        client_for(api, clock, **stale).get_queued_resource(REF)
    with pytest.raises(ApiError) as node:
        node_api(api, clock, **stale).get_node(d)
    for err in (rest.value, node.value):
        assert err.code == 401 and "CLOUDSDK_AUTH_ACCESS_TOKEN was refused or has expired" in \
            str(err) and "gcloud auth print-access-token" in str(err)


def test_status_survives_a_burst_of_gateway_errors(cli_env: Env) -> None:
    d = cli_env.seed_ready("spot")
    cli_env.tpu.fail_next(503, "UNAVAILABLE", "try again", method="GET",
                          path_contains=f"/nodes/{d.node_name}", times=3)
    result = invoke("status", "spot", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["stacks"][0]["node_state"] == "READY"


def test_status_renders_a_persistent_html_502_as_one_line(cli_env: Env) -> None:
    cli_env.seed_ready("spot")
    cli_env.tpu.html_next(502, times=1000)
    result = invoke("status", "spot")
    assert_one_line_error(result, "502 BAD_GATEWAY: Bad Gateway")
    assert "<" not in result.stderr and "http" not in result.stderr


# ---------------------------------------------------------------- answers that prove nothing


@pytest.mark.parametrize(("status", "body", "said"), [
    (302, "", "302 FOUND: the answer is a redirect (to 127.0.0.1:"),
    (200, "", "200 OK: the answer is empty: it proves nothing"),
    (200, "null", "200 OK: the answer is null, not a JSON object: it proves nothing"),
])
def test_a_create_that_cannot_read_what_is_there_creates_nothing(api, status, body,
                                                                 said) -> None:
    """Followed, the redirect reaches a QR that does not exist (a 404: "nothing there": the
    create went ahead on no proof); an empty answer or `null` was read as a QR in no state."""
    env = {**api.environ(), "TPUSERVE_QR_NAME": REF.name,
           "TPUSERVE_QR_BODY": json.dumps(flex_body(PROJECT, ZONE, QR_ID))}
    elsewhere = f"{api.url}v2alpha1/projects/{PROJECT}/locations/{ZONE}/queuedResources/gone"
    api.answer_next(status, body, headers={"Location": elsewhere}, method="GET",
                    path_contains=f"/queuedResources/{QR_ID}")
    done = run_module(env, "create", "--timeout", "5")
    assert done.returncode == 1
    assert said in one_line(done.stderr)
    assert not api.calls("POST") and not api.calls("GET", "/queuedResources/gone")


def test_only_the_apis_own_not_found_reads_as_gone_on_both_paths(api) -> None:
    # A front end's HTML 404 (a misrouted request, a proxy) says nothing about the node or
    # the queued resource: read as "gone" it would let tune, recover and status treat a live,
    # billing node as absent. Only the API's google.rpc.Status NOT_FOUND proves absence.
    d = spot()
    clock = Clock()
    api.html_next(404, times=1000)
    with pytest.raises(ApiError) as rest:
        client_for(api, clock).get_queued_resource(REF)
    with pytest.raises(ApiError) as node:
        node_api(api, clock).get_node(d)
    with pytest.raises(ApiError):
        node_api(api, clock).node_metadata(f"projects/{d.gcp.project}/locations/"
                                           f"{d.gcp.zone}/nodes/{d.node_name}")
    for err in (rest.value, node.value):
        assert err.code == 404 and not err.proves_not_found


def test_the_apis_not_found_reads_as_gone_on_both_paths(api) -> None:
    d = spot()
    clock = Clock()
    assert client_for(api, clock).get_queued_resource(REF) is None
    assert node_api(api, clock).get_node(d) is None
