"""`tpuserve wait`: QR ACTIVE -> node READY -> boot phases -> /health, and every dead end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_support import (
    BOOT_READY,
    PROJECT,
    ZONE,
    Env,
    assert_one_line_error,
    ga,
    invoke,
    write_config,
)
from tests.fakes.hostile_server import HostileServer, finishes_within
from tpuserve.gcp.tpu.client import TpuClient
from tpuserve.ops import waiter
from tpuserve.ops.errors import EXIT_TIMEOUT
from tpuserve.ops.server import http_client


def test_wait_prints_the_endpoint_of_a_serving_stack(cli_env: Env) -> None:
    cli_env.seed_ready("flex")
    result = invoke("wait", "flex", "--poll-interval", "0")
    assert result.exit_code == 0, result.stderr
    assert "external IP  127.0.0.1" in result.stdout
    assert f"http://127.0.0.1:{cli_env.oai.port}/v1" in result.stdout
    assert "gcloud secrets versions access latest --secret=tpuserve-api-key" in result.stdout
    for phase in ("queued resource: ACTIVE", "node: READY", "boot: ready", "health: ok"):
        assert phase in result.stderr


def test_wait_json(cli_env: Env) -> None:
    cli_env.seed_ready("spot")
    result = invoke("wait", "spot", "--json", "--poll-interval", "0")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["ready"] is True and doc["external_ip"] == "127.0.0.1"
    assert set(doc["phases"]) == {"node", "boot", "health"}  # no queued resource for spot


def test_wait_follows_every_phase_in_order(cli_env: Env) -> None:
    """The flex path from ACCEPTED to serving, one fake step per poll, on an injected clock."""
    d = cli_env.d("flex")
    api = cli_env.tpu
    api.seed_queued_resource(PROJECT, ZONE, d.node_name, state="ACCEPTED")
    boot_steps = [dict(list(BOOT_READY.items())[:n]) for n in (1, 3, 6, len(BOOT_READY))]
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if api.state_of(d.node_name) != "ACTIVE":
            api.advance()
        elif boot_steps:
            ga(api, d.node_name, boot_steps.pop(0))
        if api.nodes.get(f"projects/{PROJECT}/locations/{ZONE}/nodes/{d.node_name}"):
            api.set_node_ip(d.node_name, "127.0.0.1")

    events: list[waiter.WaitEvent] = []
    cli_env.oai.config.health_status = 503

    def on_event(e: waiter.WaitEvent) -> None:
        events.append(e)
        if e.phase == waiter.PHASE_BOOT and e.done:
            cli_env.oai.config.health_status = 200

    with http_client(2) as http:
        result = waiter.wait_for_stack(
            d, tpu=TpuClient(), http=http, timeout_s=1000, poll_s=10,
            on_event=on_event, clock=lambda: now[0], sleep=sleep,
        )
    assert result.external_ip == "127.0.0.1"
    qr_states = [e.state for e in events if e.phase == waiter.PHASE_QR]
    assert qr_states == ["ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"]
    boot = [e.state for e in events if e.phase == waiter.PHASE_BOOT]
    assert boot[:2] == ["no boot phase recorded yet", "boot started"] and boot[-1] == "ready"
    assert boot[2:4] == ["secrets fetched", "container started"]
    done = [e.phase for e in events if e.done]
    assert done == ["queued resource", "node", "boot", "health"]
    assert result.phases["queued resource"] == 30.0  # three polls of 10 s on the fake clock
    assert list(result.phases) == done


@pytest.mark.parametrize("state", ["FAILED", "SUSPENDED"])
def test_dead_queued_resource_fails_at_once(cli_env: Env, state: str) -> None:
    d = cli_env.d("flex")
    cli_env.tpu.seed_queued_resource(PROJECT, ZONE, d.node_name, state="WAITING_FOR_RESOURCES")
    cli_env.tpu.set_state(d.node_name, state, failure="no capacity in us-west4-a")
    result = invoke("wait", "flex", "--timeout", "600")
    assert result.exit_code == 1
    assert_one_line_error(result, f"queued resource is {state}", "tpuserve recover flex")


def test_preempted_node_fails_at_once(cli_env: Env) -> None:
    d = cli_env.seed_ready("spot")
    cli_env.tpu.set_node_state(d.node_name, "PREEMPTED")
    result = invoke("wait", "spot", "--timeout", "600")
    assert result.exit_code == 1
    assert_one_line_error(result, "PREEMPTED", "tpuserve recover spot")


def test_boot_failure_in_guest_attributes(cli_env: Env) -> None:
    cli_env.seed_ready("ondemand", attrs={
        "boot": "2030-01-01T10:00:00.000Z started",
        "state": "2030-01-01T10:01:00.000Z failed could not read secret tpuserve-hf-token",
    })
    result = invoke("wait", "ondemand", "--timeout", "600")
    assert result.exit_code == 1
    assert_one_line_error(result, "boot failed: could not read secret")


def test_timeout_exits_3_naming_the_phase(cli_env: Env) -> None:
    d = cli_env.d("spot")
    cli_env.tpu.seed_node(PROJECT, ZONE, d.node_name, state="CREATING")
    # --timeout bounds every call too: 0 s would leave no time for the one read.
    result = invoke("wait", "spot", "--timeout", "2", "--poll-interval", "0.5", "--json")
    assert result.exit_code == EXIT_TIMEOUT
    assert_one_line_error(result, "timed out", "waiting for node", "CREATING")
    assert json.loads(result.stdout)["exit_code"] == EXIT_TIMEOUT


def test_unhealthy_server_times_out_on_health(cli_env: Env) -> None:
    cli_env.seed_ready("spot")
    cli_env.oai.config.health_status = 503
    result = invoke("wait", "spot", "--timeout", "2", "--poll-interval", "0.5")
    assert result.exit_code == EXIT_TIMEOUT
    assert_one_line_error(result, "waiting for health", "HTTP 503")


def test_missing_node_says_deploy(cli_env: Env) -> None:
    result = invoke("wait", "spot")
    assert_one_line_error(result, "does not exist", "npx cdktf deploy spot")


@pytest.mark.parametrize("mode", ["hang", "trickle"])
@pytest.mark.parametrize("stack", ["spot", "flex"])  # google-cloud-tpu's node path; REST's QR path
def test_wait_timeout_bounds_a_tpu_api_that_hangs_or_trickles(
    tmp_path: Path, mode: str, stack: str,
) -> None:
    """`wait --timeout 5` against a hanging TPU API once ran 124.5 s and exited 1. Every
    TPU call ends with the wait's timeout, whatever the API does, and the exit is 3."""
    config = write_config(tmp_path / "user.toml", 8000)
    with HostileServer(mode, interval_s=0.2) as tpu_root:
        env = {"CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": tpu_root + "/",
               "CLOUDSDK_AUTH_ACCESS_TOKEN": "tok", "TPUSERVE_CONFIG": str(config),
               "TPUSERVE_TIME_SCALE": "0"}
        result = finishes_within(60, lambda: invoke(
            "wait", stack, "--timeout", "5", "--poll-interval", "1", env=env))
    assert result.exit_code == EXIT_TIMEOUT, result.stderr
    phase = "queued resource" if stack == "flex" else "node"
    assert_one_line_error(result, "timed out after", f"waiting for {phase}",
                          "DEADLINE_EXCEEDED")
