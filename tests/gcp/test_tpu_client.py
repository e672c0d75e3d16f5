"""The TPU client's queued-resource calls (create, get, wait, delete) against the fake TPU API.

Time is injected: the client's sleep advances a fake clock and (where a test says so) the
fake's state machine, so no test sleeps.
"""

from __future__ import annotations

import io
import time

import pytest

from tests.fakes.hostile_server import HostileServer, finishes_within
from tests.fakes.tpu_api import ZERO_DURATIONS, FakeTpuApi
from tests.gcp.tpu_support import PROJECT, QR_ID, REF, ZONE, Seen, body, flex_here
from tpuserve.gcp.api import GoogleApi
from tpuserve.gcp.endpoints import TPU_API
from tpuserve.gcp.errors import ApiError
from tpuserve.gcp.retry import RetryPolicy
from tpuserve.gcp.tpu.client import TpuClient
from tpuserve.gcp.tpu.queued_resources import (
    MISSING,
    QueuedResourceError,
    SpecMismatch,
    WaitTimeout,
)
from tpuserve.progress_lines import StatePrinter
from tpuserve.render.queued_resource_body import with_generation

# ---------------------------------------------------------------- create


def test_create_posts_the_body_and_returns_once_accepted(api, client, clock) -> None:
    clock.hooks.append(api.advance)
    wanted = with_generation(body(), "gen-1")
    seen = Seen()
    result = client.create_queued_resource(REF, wanted, on_progress=seen)
    assert (result.adopted, result.queued_resource.state) == (False, "ACCEPTED")
    assert result.queued_resource.generation == "gen-1"
    [post] = api.calls("POST")
    assert post.path == f"/v2alpha1/projects/{PROJECT}/locations/{ZONE}/queuedResources"
    assert post.query == {"queuedResourceId": QR_ID}
    assert post.body == wanted and post.authorized
    assert seen.states == ["CREATING", "ACCEPTED"]
    assert clock.slept == [5.0]  # one poll interval: no busy loop, no real sleep

def test_create_adopts_a_live_qr_with_the_same_spec(api, client) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="WAITING_FOR_RESOURCES",
                             body=body(), generation="gen-1")
    result = client.create_queued_resource(REF, with_generation(body(), "gen-1"))
    assert result.adopted and result.queued_resource.state == "WAITING_FOR_RESOURCES"
    assert not api.calls("POST")

def test_create_refuses_a_live_qr_with_another_spec(api, client) -> None:
    other = body(max_run_duration="7200s")
    other["tpu"]["nodeSpec"][0]["node"]["acceleratorType"] = "v5litepod-4"
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=other)
    with pytest.raises(SpecMismatch) as err:
        client.create_queued_resource(REF, body())
    assert err.value.differences == [
        "runDuration.maxRunDuration: '7200s', want '14400s'",
        "tpu.nodeSpec[0].node.acceleratorType: 'v5litepod-4', want 'v5litepod-1'",
    ]
    assert "\n" not in str(err.value) and "delete it" in str(err.value)
    assert not api.calls("POST") and not api.calls("DELETE")

@pytest.mark.parametrize("dead", ["SUSPENDED", "FAILED"])
def test_create_replaces_a_dead_qr(api, client, clock, dead: str) -> None:
    clock.hooks.append(api.advance)
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state=dead, body=body(), generation="old")
    result = client.create_queued_resource(REF, with_generation(body(), "new"))
    assert result.queued_resource.generation == "new" and not result.adopted
    methods = [r.method for r in api.requests if r.method != "GET"]
    assert methods == ["DELETE", "POST"]  # the dead one holds the name: delete first

def test_create_that_loses_a_race_judges_what_exists(api, client) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(), generation="g")
    # The first look says "missing" (another deploy is creating it right now): the POST gets a
    # real 409 from the fake, and the client compares the QR that won.
    api.fail_next(404, "NOT_FOUND", "not yet", method="GET")
    result = client.create_queued_resource(REF, with_generation(body(), "g"))
    assert result.adopted
    assert len(api.calls("POST")) == 1

def test_duplicate_create_is_409_already_exists(api, client) -> None:
    api.fail_next(404, "NOT_FOUND", "not yet", method="GET", times=2)
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body())
    with pytest.raises(ApiError) as err:
        client.create_queued_resource(REF, body())
    # the re-read after the 409 was also 404 (fault injected): the 409 itself surfaces
    assert (err.value.code, err.value.status) == (409, "ALREADY_EXISTS")
    assert "already exists" in str(err.value) and "\n" not in str(err.value)

def test_create_operation_error_is_one_line_with_advice(api, client) -> None:
    api.fail_next_create_operation(
        9, 'FLEX_START provisioning model is not supported for accelerator type "v5litepod-1"')
    with pytest.raises(ApiError) as err:
        client.create_queued_resource(REF, body())
    text = str(err.value)
    assert text.startswith(f"create queued resource {REF.name}: 400 FAILED_PRECONDITION: FLEX")
    assert "us-west4-a accepted v5litepod-1" in text and "\n" not in text

def test_create_times_out_while_creating_and_leaves_the_qr_to_adopt(api, client, clock) -> None:
    with pytest.raises(WaitTimeout, match="is CREATING after 30 s, not ACCEPTED") as err:
        client.create_queued_resource(REF, body(), timeout=30)
    # Not a definitive outcome: the QR keeps its place in the queue, and the error says how
    # to resume.
    [note] = err.value.__notes__
    assert "was left in place" in note and "cdktf deploy flex" in note and "adopt" in note
    assert not api.calls("DELETE") and api.state_of(QR_ID) == "CREATING"
    api.advance()
    assert client.create_queued_resource(REF, body()).adopted is True
    assert len(api.calls("POST")) == 1

def test_a_failed_create_removes_what_it_made(api, client, clock) -> None:
    def fail_then_advance() -> None:
        if api.state_of(QR_ID) == "CREATING":
            api.set_state(QR_ID, "FAILED", failure="no capacity in zone")
        else:
            api.advance()

    clock.hooks.append(fail_then_advance)
    with pytest.raises(QueuedResourceError, match="is FAILED: no capacity in zone") as err:
        client.create_queued_resource(REF, body())
    assert err.value.__notes__ == ["the queued resource this create made was deleted again"]
    assert api.state_of(QR_ID) is None  # nothing left that could provision and bill later

def test_a_failed_adopted_create_leaves_the_qr_alone(api, client) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="CREATING", body=body())
    with pytest.raises(WaitTimeout):
        client.create_queued_resource(REF, body(), timeout=10)
    assert not api.calls("DELETE") and api.state_of(QR_ID) == "CREATING"

def test_client_reports_a_rejected_body_on_one_line(api, client) -> None:
    b = body()
    b["tpu"]["nodeSpec"][0]["node"]["networkConfig"]["enable_external_ips"] = True
    with pytest.raises(ApiError) as err:
        client.create_queued_resource(REF, b)
    assert err.value.code == 400 and "Unknown name" in str(err.value)
    assert "fix the setting the message names" in str(err.value)


# ---------------------------------------------------------------- get / wait


def test_get_missing_and_live(api, client) -> None:
    assert client.get_queued_resource(REF) is None
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(), generation="g7")
    qr = client.get_queued_resource(REF)
    assert (qr.name, qr.state, qr.generation, qr.node_ids) == (REF.name, "ACTIVE", "g7",
                                                               [QR_ID])


def test_wait_for_active_shows_progress(api, client, clock) -> None:
    clock.hooks.append(api.advance)
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="ACCEPTED", body=body())
    out = io.StringIO()
    qr = client.wait_for_state(REF, {"ACTIVE"}, timeout=600,
                               on_progress=StatePrinter("qr tpuserve-flex", out))
    assert qr is not None and qr.state == "ACTIVE"
    assert out.getvalue().splitlines() == [
        "tpuserve: qr tpuserve-flex: ACCEPTED (0 s)",
        "tpuserve: qr tpuserve-flex: WAITING_FOR_RESOURCES (5 s)",
        "tpuserve: qr tpuserve-flex: PROVISIONING (10 s)",
        "tpuserve: qr tpuserve-flex: ACTIVE (15 s)",
    ]

def test_wait_for_state_timeout_and_dead_states(api, client, clock) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="WAITING_FOR_RESOURCES", body=body())
    with pytest.raises(WaitTimeout, match="is WAITING_FOR_RESOURCES after 60 s, not ACTIVE"):
        client.wait_for_state(REF, {"ACTIVE"}, timeout=60)
    api.set_state(QR_ID, "SUSPENDED")
    with pytest.raises(QueuedResourceError, match="is SUSPENDED -> deploy again"):
        client.wait_for_state(REF, {"ACTIVE"}, timeout=60)
    api.remove_queued_resource(QR_ID)
    with pytest.raises(QueuedResourceError, match="disappeared while waiting for ACTIVE"):
        client.wait_for_state(REF, {"ACTIVE"}, timeout=60)
    assert client.wait_for_state(REF, {MISSING}, timeout=0) is None


# ---------------------------------------------------------------- delete


def test_delete_forces_and_waits_until_gone(api, client, clock) -> None:
    clock.hooks.append(api.advance)
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body())
    assert client.get_node(flex_here()) is not None
    seen = Seen()
    assert client.delete_queued_resource(REF, on_progress=seen) is True
    [delete] = api.calls("DELETE")
    assert delete.query == {"force": "true"}
    assert seen.states == ["ACTIVE", "DELETING", MISSING]
    assert client.get_queued_resource(REF) is None
    assert client.get_node(flex_here()) is None  # force: the node went first


def test_delete_of_a_missing_qr_is_success(api, client) -> None:
    assert client.delete_queued_resource(REF) is False
    assert not api.calls("DELETE")
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body())
    api.fail_next(404, "NOT_FOUND", "gone meanwhile", method="DELETE")
    assert client.delete_queued_resource(REF) is False

def test_delete_waits_out_provisioning_and_retries(api, client, clock) -> None:
    clock.hooks.append(lambda: api.advance(QR_ID))
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="PROVISIONING", body=body())
    seen = Seen()
    assert client.delete_queued_resource(REF, on_progress=seen) is True
    refused, accepted = api.calls("DELETE")
    assert (refused.method, accepted.method) == ("DELETE", "DELETE")
    assert seen.states[0] == "PROVISIONING"
    assert seen.states[1].startswith("PROVISIONING (cannot be deleted until provisioning ends")
    assert seen.states[2:] == ["ACTIVE", "DELETING", MISSING]

def test_delete_gives_up_on_provisioning_after_its_timeout(api, client) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="PROVISIONING", body=body())
    with pytest.raises(WaitTimeout) as err:
        client.delete_queued_resource(REF, timeout=20)
    assert "still PROVISIONING after 20 s" in str(err.value) and "\n" not in str(err.value)
    assert len(api.calls("DELETE")) >= 2

def test_delete_of_a_deleting_qr_only_waits(api, client, clock) -> None:
    clock.hooks.append(api.advance)
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="DELETING", body=body())
    assert client.delete_queued_resource(REF) is True
    assert not api.calls("DELETE")

def test_delete_without_force_is_refused_while_the_node_exists(api, client) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body())
    with pytest.raises(ApiError, match=r"FAILED_PRECONDITION: .* still has nodes"):
        client.delete_queued_resource(REF, force=False)


def test_run_duration_ends_in_suspended_with_the_node_deleted(clock) -> None:
    with FakeTpuApi(durations=ZERO_DURATIONS, clock=clock) as api:
        c = TpuClient(environ=api.environ(), clock=clock, sleep=clock.sleep)
        c.create_queued_resource(REF, body(max_run_duration="3600s"))
        assert c.get_queued_resource(REF).state == "ACTIVE"  # zero durations: at once
        clock.now += 3599
        assert c.get_node(flex_here()).state == "READY"
        clock.now += 1
        assert c.get_queued_resource(REF).state == "SUSPENDED"
        assert c.get_node(flex_here()) is None


# -------------------------------------------------------------------------- deadlines


@pytest.mark.parametrize("mode", ["trickle", "headers", "hang"])
def test_one_rest_try_ends_at_its_cap_whatever_the_server_sends(mode: str) -> None:
    """requests' `timeout` bounds each socket read: a body or headers trickled one byte at a
    time held a try for ever. The cap bounds the whole try, connect to last byte."""
    with HostileServer(mode, interval_s=0.2) as root:
        api = GoogleApi("tpu", TPU_API, root=root + "/", timeout=2.0,
                        environ={"CLOUDSDK_AUTH_ACCESS_TOKEN": "tok"},
                        policy=RetryPolicy(tries=1))
        with pytest.raises(ApiError) as err:
            finishes_within(30, lambda: api.request("GET", f"v2alpha1/{REF.name}"))
    assert (err.value.code, err.value.status) == (0, "DEADLINE_EXCEEDED")
    assert "no complete answer from 127.0.0.1" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("mode", ["trickle", "hang"])
def test_the_commands_deadline_cuts_rest_and_node_calls_in_flight(mode: str) -> None:
    """Both halves of the TPU client (REST v2alpha1 and google-cloud-tpu's nodes) end with the
    command's deadline, retries included, not 30 s per try and 120 s per call."""
    with HostileServer(mode, interval_s=0.2) as root:
        client = TpuClient(environ={"CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": root + "/",
                                    "CLOUDSDK_AUTH_ACCESS_TOKEN": "tok"})
        for call in (lambda: client.get_queued_resource(REF),
                     lambda: client.get_node(flex_here())):
            client.deadline = time.monotonic() + 2.0  # what deadline_within(2) sets
            with pytest.raises(ApiError) as err:
                finishes_within(30, call)
            assert (err.value.code, err.value.status) == (0, "DEADLINE_EXCEEDED")
            assert "give the command more time" in str(err.value)
        client.deadline = None
        with client.deadline_within(2.0) as start:
            assert client.deadline == pytest.approx(start + 2.0)
        assert client.deadline is None  # the block's deadline ends with it
