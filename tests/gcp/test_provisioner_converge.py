"""`python -m tpuserve.queued_resource converge`: a new boot script reaches the flex node
without giving up capacity. ACTIVE: the node's metadata is patched in place; still queued: the
QR is made again (only its place in the queue is lost); PROVISIONING: waited out, then
patched; dead or missing: nothing to patch. Run against the fake TPU API, asserting on what
it received."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.hostile_server import finishes_within
from tests.fakes.tpu_api import FakeTpuApi
from tests.gcp.tpu_support import PROJECT, QR_ID, REF, ZONE, Clock, body, one_line, run_module
from tpuserve.gcp.qr_converge import converge, merged_metadata
from tpuserve.gcp.tpu.client import TpuClient
from tpuserve.gcp.tpu.queued_resources import QueuedResourceError, WaitTimeout
from tpuserve.queued_resource import main
from tpuserve.render.queued_resource_body import GENERATION_LABEL, with_generation

NODE = f"{REF.parent}/nodes/{QR_ID}"
OLD, NEW = "#!/bin/bash\necho old\n", "#!/bin/bash\necho new\n"


def run_cli(env: dict[str, str], *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["converge", *argv], environ=env, stdin=io.StringIO(), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def converge_env(api: FakeTpuApi, script: str = NEW, **extra: str) -> dict[str, str]:
    """What the flex stack's node_metadata resource passes: name, whole body, generation."""
    return {**api.environ(), "TPUSERVE_QR_NAME": REF.name, "TPUSERVE_QR_POLL_SECONDS": "0",
            "TPUSERVE_QR_BODY": json.dumps(body(startup_script=script)), **extra}


def qr_calls(api: FakeTpuApi) -> list[tuple[str, str]]:
    return [(r.method, r.path.rsplit("/", 2)[-2]) for r in api.requests]


@pytest.fixture
def queued_api() -> Iterator[FakeTpuApi]:
    """Time-based: creates and deletes finish at once; a QR waits for resources for ever."""
    with FakeTpuApi(durations={"CREATING": 0, "ACCEPTED": 0, "DELETING": 0}) as server:
        yield server


# ----------------------------------------------------------------------------- ACTIVE


def test_active_node_gets_the_new_metadata_in_place(api) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script=OLD),
                             generation="gen-1")
    before = api.queued_resource(QR_ID)
    code, out, err = run_cli(converge_env(api, generation="gen-1"))
    assert code == 0, err
    assert out == (f"tpuserve: node {NODE}: metadata updated in place (startup-script), "
                   "capacity kept; the node re-runs its boot script and re-converges\n")
    [patch] = api.calls("PATCH")
    assert patch.path == f"/v2/{NODE}" and patch.query["updateMask"] == "metadata"
    assert patch.body == {"metadata": {"startup-script": NEW}}
    assert api.node_json(QR_ID)["metadata"] == {"startup-script": NEW}
    # The operation was waited on; the QR itself was only read, and is as it was.
    assert any(r.method == "GET" and "/operations/" in r.path for r in api.requests)
    assert {m for m, _ in qr_calls(api)} == {"GET", "PATCH"}
    assert api.queued_resource(QR_ID) == before


def test_active_node_with_the_same_metadata_is_left_alone(api) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script=NEW))
    code, out, err = run_cli(converge_env(api))
    assert (code, out) == (0, f"tpuserve: node {NODE}: metadata unchanged\n"), err
    assert not api.calls("PATCH") and not api.calls("DELETE") and not api.calls("POST")


def test_keys_that_are_not_ours_are_kept_and_ours_follow_the_body(api) -> None:
    seeded = body(startup_script=OLD)
    seeded["tpu"]["nodeSpec"][0]["node"]["metadata"]["retired-key"] = "x"
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=seeded)
    with api._lock:  # as if gcloud had added a key to the running node
        node = api.nodes[NODE]
        node.spec = {**node.spec, "metadata": {**node.spec["metadata"], "ssh-keys": "u:k"}}
    assert run_cli(converge_env(api))[0] == 0
    assert api.node_json(QR_ID)["metadata"] == {"startup-script": NEW, "ssh-keys": "u:k"}
    api.requests.clear()
    assert run_cli(converge_env(api))[1] == f"tpuserve: node {NODE}: metadata unchanged\n"
    assert not api.calls("PATCH")


def test_merged_metadata() -> None:
    current = {"startup-script": "a", "old": "1", "ssh-keys": "k"}
    assert merged_metadata(current, {"startup-script": "b"}, {"startup-script", "old"}) == {
        "startup-script": "b", "ssh-keys": "k"}
    assert merged_metadata(current, {}, set()) == current


def test_an_active_qr_whose_node_is_gone_is_an_error(api) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script=OLD))
    with api._lock:
        del api.nodes[NODE]
    code, out, err = run_cli(converge_env(api))
    assert code == 1 and out == ""
    assert one_line(err).startswith(f"tpuserve: node {NODE} does not exist although")


# ----------------------------------------------------------------------------- still queued


def test_a_queued_qr_is_made_again_with_the_new_body_and_its_generation(queued_api) -> None:
    api = queued_api
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="WAITING_FOR_RESOURCES",
                             body=body(startup_script=OLD), generation="gen-1")
    code, out, err = run_cli(converge_env(api, generation="gen-1"))
    assert code == 0, err
    assert out == (f"tpuserve: recreated {REF.name} with the new metadata: it was "
                   "WAITING_FOR_RESOURCES (no capacity yet), so it lost only its place in the "
                   "queue; now WAITING_FOR_RESOURCES\n")
    [delete] = api.calls("DELETE")
    assert delete.path == f"/v2alpha1/{REF.name}" and delete.query == {"force": "true"}
    [post] = api.calls("POST")
    assert post.query == {"queuedResourceId": QR_ID}
    assert post.body == with_generation(body(startup_script=NEW), "gen-1")
    assert not api.calls("PATCH")
    qr = api.queued_resource(QR_ID)
    assert qr is not None and qr["tpu"]["nodeSpec"][0]["node"]["metadata"] == {
        "startup-script": NEW}


def test_without_a_generation_the_new_qr_keeps_the_old_ones_label(queued_api) -> None:
    queued_api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="ACCEPTED",
                                    body=body(startup_script=OLD), generation="gen-7")
    assert run_cli(converge_env(queued_api))[0] == 0
    [post] = queued_api.calls("POST")
    assert post.body["tpu"]["nodeSpec"][0]["node"]["labels"][GENERATION_LABEL] == "gen-7"


def test_a_queued_qr_with_the_same_metadata_is_only_read(api) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="WAITING_FOR_RESOURCES",
                             body=body(startup_script=NEW), generation="gen-1")
    code, out, err = run_cli(converge_env(api, generation="gen-1"))
    assert code == 0, err
    assert out == (f"tpuserve: queued resource {REF.name} is WAITING_FOR_RESOURCES: metadata "
                   "unchanged (its node will boot with it)\n")
    assert qr_calls(api) == [("GET", "queuedResources")]


def test_a_qr_that_got_capacity_meanwhile_is_patched_not_deleted(api, clock) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="WAITING_FOR_RESOURCES",
                             body=body(startup_script=OLD))

    class Racing(TpuClient):
        reads = 0

        def get_queued_resource(self, ref: Any) -> Any:
            qr = super().get_queued_resource(ref)
            self.reads += 1
            if self.reads == 1:  # capacity arrives right after converge's first look
                api.set_state(QR_ID, "ACTIVE")
            return qr

    client = Racing(environ=api.environ(), clock=clock, sleep=clock.sleep, poll_interval=5.0)
    line = converge(client, REF, body(startup_script=NEW), "", timeout=600,
                    progress=lambda s, e: None, create=_no_create)
    assert "metadata updated in place" in line
    assert not api.calls("DELETE") and not api.calls("POST")
    assert api.node_json(QR_ID)["metadata"] == {"startup-script": NEW}


def _no_create(b: dict[str, Any], g: str) -> Any:
    raise AssertionError("a QR with capacity must not be made again")


def test_a_provisioning_qr_is_waited_out_then_patched(api, clock: Clock) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="PROVISIONING",
                             body=body(startup_script=OLD))
    def provisioned() -> None:  # PROVISIONING -> ACTIVE on the first pause, then it stays
        if api.state_of(QR_ID) == "PROVISIONING":
            api.advance(QR_ID)

    clock.hooks.append(provisioned)
    client = TpuClient(environ=api.environ(), clock=clock, sleep=clock.sleep, poll_interval=5.0)
    states: list[str] = []
    line = converge(client, REF, body(startup_script=NEW), "", timeout=600,
                    progress=lambda s, e: states.append(s), create=_no_create)
    assert "metadata updated in place" in line and states[-1] == "ACTIVE"
    assert not api.calls("DELETE") and api.node_json(QR_ID)["metadata"] == {
        "startup-script": NEW}


# ----------------------------------------------------------------------------- nothing to do


@pytest.mark.parametrize("state", ["SUSPENDED", "SUSPENDING", "FAILED", "DELETING"])
def test_a_dead_qr_is_left_to_the_plan_time_probe(api, state) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script=OLD))
    api.set_state(QR_ID, state)
    api.requests.clear()
    code, out, err = run_cli(converge_env(api))
    assert code == 0, err
    assert out == (f"tpuserve: queued resource {REF.name} is {state}: no node to update; the "
                   "next deploy replaces it, with this metadata (cdktf deploy flex)\n")
    assert qr_calls(api) == [("GET", "queuedResources")]


# ----------------------------------------------------------------------------- errors


def test_a_missing_qr_is_one_line_exit_1(api) -> None:
    code, out, err = run_cli(converge_env(api))
    assert code == 1 and out == ""
    assert one_line(err) == (f"tpuserve: queued resource {REF.name} does not exist, so its "
                             "node's metadata cannot be updated -> deploy again (cdktf deploy "
                             "flex): the plan creates it anew")


def test_an_unknown_state_is_left_alone(api) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script=OLD))
    api.set_state(QR_ID, "STATE_UNSPECIFIED")
    code, _, err = run_cli(converge_env(api))
    assert code == 1 and "(unknown): it is left alone" in one_line(err)
    assert not api.calls("PATCH") and not api.calls("DELETE")


def test_a_refused_patch_is_one_line_exit_1(api) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script=OLD))
    api.fail_next(403, "PERMISSION_DENIED", f"Permission 'tpu.nodes.update' denied on '{NODE}'",
                  method="PATCH")
    code, out, err = run_cli(converge_env(api))
    assert code == 1 and out == ""
    line = one_line(err)
    assert line.startswith(f"tpuserve: update the metadata of node {NODE}: 403 PERMISSION_DENIED")
    assert api.node_json(QR_ID)["metadata"] == {"startup-script": OLD}


def test_a_failed_patch_operation_is_one_line_exit_1(api) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script=OLD))
    api.fail_next_patch_operation(13, "fake: the node could not be updated")
    code, _, err = run_cli(converge_env(api))
    assert code == 1
    assert one_line(err).startswith(f"tpuserve: update the metadata of node {NODE}: 500 INTERNAL")
    assert "fake: the node could not be updated" in err


def test_transient_faults_are_retried(api) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script=OLD))
    api.fail_next(503, "UNAVAILABLE", "try again", method="PATCH")
    api.fail_next(503, "UNAVAILABLE", "try again", path_contains="/operations/")
    code, _, err = run_cli(converge_env(api, TPUSERVE_TIME_SCALE="0"))
    assert code == 0, err
    assert api.node_json(QR_ID)["metadata"] == {"startup-script": NEW}


def test_an_operation_that_never_ends_times_out(api, clock: Clock) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script=OLD))
    api.patch_reads_until_done = 10**6
    client = TpuClient(environ=api.environ(), clock=clock, sleep=clock.sleep, poll_interval=5.0)
    with pytest.raises(WaitTimeout, match="is still running after 60 s"):
        converge(client, REF, body(startup_script=NEW), "", timeout=60,
                 progress=lambda s, e: None, create=_no_create)
    assert sum(clock.slept) == 60


def test_a_qr_that_keeps_changing_state_ends_the_converge(api, clock: Clock) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="WAITING_FOR_RESOURCES",
                             body=body(startup_script=OLD))

    class Flipping(TpuClient):
        def get_queued_resource(self, ref: Any) -> Any:
            qr = super().get_queued_resource(ref)  # queued, then provisioning, then queued...
            api.set_state(QR_ID, "PROVISIONING" if qr.state != "PROVISIONING"
                          else "WAITING_FOR_RESOURCES")
            return qr

    client = Flipping(environ=api.environ(), clock=clock, sleep=clock.sleep, poll_interval=5.0)
    with pytest.raises(QueuedResourceError, match="kept changing state"):
        converge(client, REF, body(startup_script=NEW), "", timeout=600,
                 progress=lambda s, e: None, create=_no_create)
    assert not api.calls("DELETE") and not api.calls("PATCH")


@pytest.mark.parametrize(("extra", "message"), [
    ({"TPUSERVE_QR_BODY": ""}, "body is missing: set TPUSERVE_QR_BODY_GZ, TPUSERVE_QR_BODY"),
    ({"TPUSERVE_QR_BODY": '{"tpu": {}}'}, "nodeSpec must be a non-empty list"),
    ({"TPUSERVE_QR_GENERATION": "Not A Label"}, "label value"),
    ({"TPUSERVE_QR_NAME": "tpuserve-flex"}, "must look like projects/"),
])
def test_bad_input_is_one_line_exit_2_before_any_call(api, extra, message) -> None:
    code, out, err = run_cli({**converge_env(api), **extra})
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err
    assert not api.requests


def test_as_terraform_runs_it(api) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script=OLD))
    done = run_module(converge_env(api), "converge")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"tpuserve: node {NODE}: metadata updated in place")
    assert api.node_json(QR_ID)["metadata"] == {"startup-script": NEW}


# ----------------------------------------------------------- give up nothing, and say so
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"
RATE_LIMITED = [{"@type": ERROR_INFO, "reason": "RATE_LIMIT_EXCEEDED",
                 "domain": "googleapis.com",
                 "metadata": {"service": "tpu.googleapis.com", "consumer": f"projects/{PROJECT}"}}]
OVER_QUOTA = [
    {"@type": ERROR_INFO, "reason": "RATE_LIMIT_EXCEEDED", "domain": "googleapis.com",
     "metadata": {"service": "tpu.googleapis.com", "consumer": f"projects/{PROJECT}"}},
    {"@type": QUOTA_FAILURE, "violations": [{
        "subject": f"project:{PROJECT}",
        "description": "Quota 'TPUV5sLitepodServingPerProjectPerZoneForTPUAPI' exhausted"}]},
]


def _queued(api: FakeTpuApi) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, state="WAITING_FOR_RESOURCES",
                             body=body(startup_script=OLD), generation="gen-1")


def test_a_recreate_refused_for_quota_is_not_retried_and_says_the_qr_is_gone(
    queued_api: FakeTpuApi,
) -> None:
    api = queued_api
    _queued(api)
    api.fail_next(429, "RESOURCE_EXHAUSTED", "Quota exceeded for TPU v5 lite chips",
                  method="POST", details=OVER_QUOTA)
    code, out, err = run_cli(converge_env(api, generation="gen-1", TPUSERVE_TIME_SCALE="0"))
    assert code == 1 and out == ""
    line = one_line(err)
    assert f"create queued resource {REF.name}: 429 RESOURCE_EXHAUSTED" in line
    assert (f"the queued resource {REF.name} (it was WAITING_FOR_RESOURCES, no capacity yet) "
            "was DELETED to change its metadata and is NOT re-created: run `cdktf deploy "
            "flex` to create it anew") in line
    assert len(api.calls("POST")) == 1  # a quota refusal is not retried
    assert api.queued_resource(QR_ID) is None


def test_a_recreate_refused_as_a_rate_limit_is_retried(queued_api: FakeTpuApi) -> None:
    api = queued_api
    _queued(api)
    api.fail_next(429, "RESOURCE_EXHAUSTED", "Too many requests", method="POST",
                  details=RATE_LIMITED, times=2)
    code, out, err = run_cli(converge_env(api, generation="gen-1", TPUSERVE_TIME_SCALE="0"))
    assert code == 0, err
    assert out.startswith(f"tpuserve: recreated {REF.name} with the new metadata")
    assert len(api.calls("POST")) == 3
    qr = api.queued_resource(QR_ID)
    assert qr is not None and qr["tpu"]["nodeSpec"][0]["node"]["metadata"] == {
        "startup-script": NEW}


@pytest.mark.parametrize(("fault", "times", "what"), [
    ((403, "PERMISSION_DENIED", "Permission 'tpu.queuedResources.create' denied"), 1, "403"),
    ((400, "INVALID_ARGUMENT", "Invalid value at 'queued_resource'"), 1, "400"),
    ((429, "RESOURCE_EXHAUSTED", "Too many requests"), 99, "429"),  # the rate limit outlasts
])
def test_every_failure_after_the_delete_names_what_was_deleted_and_the_restore(
    queued_api: FakeTpuApi, fault: tuple[int, str, str], times: int, what: str,
) -> None:
    api = queued_api
    _queued(api)
    api.fail_next(*fault, method="POST", times=times,
                  details=RATE_LIMITED if fault[0] == 429 else None)
    code, _, err = run_cli(converge_env(api, generation="gen-1", TPUSERVE_TIME_SCALE="0"))
    line = one_line(err)
    assert code == 1 and f": {what} " in line
    assert f"{REF.name} (it was WAITING_FOR_RESOURCES, no capacity yet) was DELETED" in line
    assert "is NOT re-created: run `cdktf deploy flex`" in line
    assert len(api.calls("POST")) == (5 if fault[0] == 429 else 1)  # RECREATE_TRIES


@pytest.mark.parametrize("readable", [True, False])
def test_a_recreate_that_was_made_but_failed_later_says_what_exists(
    queued_api: FakeTpuApi, readable: bool,
) -> None:
    api = queued_api
    _queued(api)
    client = TpuClient(environ={**api.environ(), "TPUSERVE_TIME_SCALE": "0"}, poll_interval=0)

    def create(b: dict[str, Any], g: str) -> Any:
        client.create_queued_resource(REF, b)  # made, then the step fails (a lost answer)
        if not readable:
            api.fail_next(503, "UNAVAILABLE", "backend", method="GET", times=10**6)
        raise QueuedResourceError("fake: the create step failed after its POST")

    with pytest.raises(QueuedResourceError) as caught:
        converge(client, REF, body(startup_script=NEW), "gen-1", timeout=600,
                 progress=lambda s, e: None, create=create)
    notes = " ".join(caught.value.__notes__)
    assert f"{REF.name} (it was WAITING_FOR_RESOURCES, no capacity yet) was DELETED" in notes
    if readable:
        assert ("a new one was created and is WAITING_FOR_RESOURCES: run `cdktf deploy flex`, "
                "which keeps it if it is alive") in notes
    else:
        assert "could not be read: run `cdktf deploy flex`, which adopts the new one" in notes


def test_one_409_on_the_metadata_patch_is_retried(api) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script=OLD))
    api.fail_next(409, "ABORTED", "The node is being updated by another operation.",
                  method="PATCH")
    code, out, err = run_cli(converge_env(api, TPUSERVE_TIME_SCALE="0"))
    assert code == 0, err
    assert "metadata updated in place" in out and len(api.calls("PATCH")) == 2
    assert api.node_json(QR_ID)["metadata"] == {"startup-script": NEW}


def test_a_409_that_persists_is_bounded_and_never_says_delete(api) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script=OLD))
    api.fail_next(409, "ABORTED", "The node is being updated by another operation.",
                  method="PATCH", times=10**6)
    code, _, err = run_cli(converge_env(api, TPUSERVE_TIME_SCALE="0"))
    line = one_line(err)
    assert code == 1 and f"update the metadata of node {NODE}: 409 ABORTED" in line
    assert "tried 5 times" in line and "do not delete it: it holds the flex-start capacity" in line
    assert "delete it first" not in line
    assert len(api.calls("PATCH")) == 5 and not api.calls("DELETE")
    assert api.node_json(QR_ID)["metadata"] == {"startup-script": OLD}


def test_the_generic_409_hints_never_say_delete() -> None:
    from tpuserve.gcp.errors import hint_for

    for status in ("ALREADY_EXISTS", "ABORTED", ""):
        assert "delete it" not in hint_for(409, status, "conflict", "tpu")


def test_a_key_written_between_converges_read_and_its_patch_is_kept(api) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script=OLD))
    # Another client (gcloud adding an SSH key) writes right after converge's first read.
    api.after_next(lambda: api.set_node_metadata(NODE, {"startup-script": OLD, "ssh-keys": "u:k"}),
                   method="GET", path_contains=f"/nodes/{QR_ID}")
    code, _, err = run_cli(converge_env(api))
    assert code == 0, err
    assert api.node_json(QR_ID)["metadata"] == {"startup-script": NEW, "ssh-keys": "u:k"}


def test_a_stale_write_landing_after_the_patch_is_merged_and_patched_again(api) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script=OLD))
    # Another client's read-modify-write from before our PATCH lands just after it: our key
    # reverted, theirs added.
    api.on_next_patch_applied(
        lambda: api.set_node_metadata(NODE, {"startup-script": OLD, "ssh-keys": "u:k"}))
    code, out, err = run_cli(converge_env(api))
    assert code == 0, err
    assert api.node_json(QR_ID)["metadata"] == {"startup-script": NEW, "ssh-keys": "u:k"}
    assert len(api.calls("PATCH")) == 2 and "metadata updated in place" in out


def test_a_key_dropped_by_a_concurrent_write_is_merged_back(api) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script=OLD))
    api.set_node_metadata(NODE, {"startup-script": OLD, "ssh-keys": "u:k"})
    api.on_next_patch_applied(lambda: api.set_node_metadata(NODE, {"startup-script": NEW}))
    assert run_cli(converge_env(api))[0] == 0
    assert api.node_json(QR_ID)["metadata"] == {"startup-script": NEW, "ssh-keys": "u:k"}


def test_metadata_that_keeps_changing_is_bounded_and_one_line(api) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script=OLD))

    def revert() -> None:  # after every PATCH, another writer puts the old script back
        api.set_node_metadata(NODE, {"startup-script": OLD})
        api.on_next_patch_applied(revert)

    api.on_next_patch_applied(revert)
    code, out, err = run_cli(converge_env(api))
    line = one_line(err)
    assert code == 1 and out == ""
    assert f"node {NODE}: its metadata kept changing while converge patched it (3 rounds" in line
    assert "startup-script" in line and "capacity are kept" in line
    assert len(api.calls("PATCH")) == 3 and not api.calls("DELETE")


def test_an_interrupted_recreate_says_the_qr_was_deleted(queued_api: FakeTpuApi,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    api = queued_api
    _queued(api)

    def interrupted(*_a: Any, **_k: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(TpuClient, "create_queued_resource", interrupted)
    code, _, err = run_cli(converge_env(api, generation="gen-1"))
    assert code == 130
    assert err.strip().splitlines()[-1] == (
        f"tpuserve: interrupted; the queued resource {REF.name} (it was WAITING_FOR_RESOURCES, "
        "no capacity yet) was DELETED to change its metadata, and whether its re-create took "
        "could not be read: run `cdktf deploy flex`, which adopts the new one or creates it anew")


# ----------------------------------------------------------------------------- --timeout


@pytest.mark.parametrize("stalled", ["queuedResources", "nodes"])
def test_the_timeout_bounds_every_read_beneath_it(api, stalled: str) -> None:
    """A QR read (or the node's) that answers its headers, then nothing, is cut by converge's
    --timeout: one line naming it, exit 1, the node untouched (on the old code the QR's reads
    had only the edge's 30 s per try and 120 s per call, retries included)."""
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script=OLD))
    api.stall_next(600, method="GET", path_contains=f"/{stalled}/", times=100)
    code, out, err = finishes_within(25, lambda: run_cli(converge_env(api), "--timeout", "2"))
    assert (code, out) == (1, "")
    line = one_line(err)
    assert "DEADLINE_EXCEEDED" in line and "--timeout" in line
    assert not api.calls("PATCH") and not api.calls("DELETE")
    assert api.node_json(QR_ID)["metadata"] == {"startup-script": OLD}


# ------------------------------------------- outside probes: what happened to the capacity
def test_a_delete_refused_as_a_rate_limit_says_the_qr_is_kept(queued_api: FakeTpuApi) -> None:
    """A 429 RATE_LIMIT_EXCEEDED that outlasts the edge's retries on converge's delete: the QR
    is still queued, with its place and its old metadata; the line says so and how to
    converge again (on the old code it said only the 429 and a quota hint)."""
    api = queued_api
    _queued(api)
    api.fail_next(429, "RESOURCE_EXHAUSTED", "Too many requests", method="DELETE",
                  details=RATE_LIMITED, times=99)
    code, out, err = run_cli(converge_env(api, generation="gen-1", TPUSERVE_TIME_SCALE="0"))
    assert (code, out) == (1, "")
    line = one_line(err)
    assert f"delete queued resource {REF.name}: 429 RESOURCE_EXHAUSTED" in line
    assert line.endswith(f"; the queued resource {REF.name} was NOT deleted: it is "
                         "WAITING_FOR_RESOURCES and keeps its place in the queue, with the old "
                         "metadata its node would boot with: run `cdktf deploy flex` to "
                         "converge it again")
    assert api.state_of(QR_ID) == "WAITING_FOR_RESOURCES" and not api.calls("POST")


def test_a_qr_gone_between_the_read_and_the_delete_is_created_anew_and_said(
        queued_api: FakeTpuApi) -> None:
    """Someone else's delete lands between converge's read and its own: nothing of converge's
    was deleted, so the line does not claim it gave up the queue place (the old one did)."""
    api = queued_api
    _queued(api)
    api.after_next(lambda: api.remove_queued_resource(QR_ID), method="GET")
    code, out, err = run_cli(converge_env(api, generation="gen-1", TPUSERVE_TIME_SCALE="0"))
    assert code == 0, err
    assert out == (f"tpuserve: created {REF.name} anew with the new metadata: it was "
                   "WAITING_FOR_RESOURCES (no capacity yet) and was gone before converge's "
                   "delete; now WAITING_FOR_RESOURCES\n")
    assert not api.calls("DELETE")
    qr = api.queued_resource(QR_ID)
    assert qr is not None and qr["tpu"]["nodeSpec"][0]["node"]["metadata"] == {
        "startup-script": NEW}


@pytest.mark.parametrize(("grpc", "status"), [(13, "500 INTERNAL"),
                                              (9, "400 FAILED_PRECONDITION")])
def test_a_patch_whose_operation_fails_says_the_capacity_is_kept(api, grpc: int,
                                                                 status: str) -> None:
    api.seed_queued_resource(PROJECT, ZONE, QR_ID, body=body(startup_script=OLD))
    api.fail_next_patch_operation(grpc, "fake: the node could not be updated")
    code, _, err = run_cli(converge_env(api))
    line = one_line(err)
    assert code == 1 and f"update the metadata of node {NODE}: {status}" in line
    assert line.endswith(f"; nothing was deleted: the node {NODE} and its flex-start capacity "
                         "are kept, and its metadata may still be the old one: run `cdktf "
                         "deploy flex` to converge it again")
    assert api.state_of(QR_ID) == "ACTIVE" and not api.calls("DELETE")
