"""`tpuserve status`: node / queued resource / boot / health / money, against the fake TPU API."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from tests.cli_support import (
    BOOT_READY,
    PROJECT,
    ZONE,
    Env,
    assert_one_line_error,
    invoke,
)
from tpuserve.gcp.tpu.nodes import NodeView
from tpuserve.gcp.tpu.queued_resources import QueuedResource
from tpuserve.ops.boot_phases import parse_boot
from tpuserve.ops.served_config import ServedConfig, deployed_sha256, parse_served
from tpuserve.ops.stack_status import StackStatus, format_duration
from tpuserve.render.boot_script import vllm_command
from tpuserve.render.vllm_args import served_config_sha256


def test_status_of_a_ready_spot_stack(cli_env: Env) -> None:
    cli_env.seed_ready("spot")
    result = invoke("status", "spot", "--json")
    assert result.exit_code == 0, result.stderr
    (s,) = json.loads(result.stdout)["stacks"]
    assert s["node_state"] == "READY"
    assert s["external_ip"] == "127.0.0.1"
    assert s["endpoint"] == f"http://127.0.0.1:{cli_env.oai.port}"
    assert s["health"]["ok"] is True
    assert s["boot"]["state"] == "ready"
    assert [p["key"] for p in s["boot"]["phases"]] == [
        "boot", "guard", "secret", "image", "cache", "container", "startup_complete", "health",
    ]
    assert s["end_rule"] == "billing guard"  # the boot script's exact deadline
    assert s["ends_at"].startswith("2030-01-01T18:00:00")
    assert s["usd_per_hour"] == pytest.approx(0.5779)
    assert s["running_s"] is not None and s["spent_usd"] is not None
    assert s["problems"] == []
    # /health was asked without the key (never guarded), and nothing else.
    assert [(r.method, r.path) for r in cli_env.oai.requests] == [("GET", "/health")]


def test_status_table_lists_every_configured_stack(cli_env: Env) -> None:
    cli_env.seed_ready("flex")
    result = invoke("status")
    assert result.exit_code == 0, result.stderr
    for stack in ("spot", "ondemand", "flex"):
        assert stack in result.stdout
    assert "not deployed" in result.stdout
    assert "queued resource ACTIVE" in result.stdout and "boot phase" in result.stdout


@pytest.mark.parametrize("lost", ["PREEMPTED", "TERMINATED"])
def test_preempted_spot_node_is_a_problem_with_the_way_out(cli_env: Env, lost: str) -> None:
    d = cli_env.seed_ready("spot")
    cli_env.tpu.set_node_state(d.node_name, lost)
    result = invoke("status", "spot", "--json")
    assert result.exit_code == 1
    (s,) = json.loads(result.stdout)["stacks"]
    assert s["recoverable"] is True
    assert s["health"]["ok"] is None  # not READY: the server is not asked
    assert any(lost in p and "tpuserve recover spot" in p for p in s["problems"])
    assert not any("cdktf deploy" in p for p in s["problems"])  # a deploy would plan nothing


def test_suspended_flex_queued_resource(cli_env: Env) -> None:
    d = cli_env.seed_ready("flex")
    cli_env.tpu.set_state(d.node_name, "SUSPENDED")
    result = invoke("status", "flex")
    assert result.exit_code == 1
    assert "SUSPENDED" in result.stdout
    assert "tpuserve recover flex" in result.stdout


def test_boot_failure_from_guest_attributes(cli_env: Env) -> None:
    d = cli_env.seed_ready("ondemand", attrs={
        "boot": "2030-01-01T10:00:00.000Z started",
        "state": "2030-01-01T10:05:00.000Z failed image pull: manifest unknown",
    })
    result = invoke("status", "ondemand", "--json")
    assert result.exit_code == 1
    (s,) = json.loads(result.stdout)["stacks"]
    assert s["boot"]["state"] == "failed"
    assert "boot failed: image pull: manifest unknown" in s["problems"]
    assert d.node_name == s["node_name"]


# ---------------------------------------------------------------- which config is served


def _words(text: str) -> str:
    """The table's text with its wrapping undone."""
    return " ".join(text.split())


def test_the_server_serves_the_deployed_config(cli_env: Env) -> None:
    d = cli_env.d("spot")
    deployed = served_config_sha256(d, vllm_command(d))
    assert deployed_sha256(d) == deployed
    cli_env.seed_ready("spot", attrs={
        **BOOT_READY, "config": f"2030-01-01T10:01:05.000Z argv_sha256={deployed}"})
    result = invoke("status", "spot", "--json")
    assert result.exit_code == 0, result.stderr
    (s,) = json.loads(result.stdout)["stacks"]
    assert s["config"] == {"running": deployed, "deployed": deployed, "current": True,
                           "state": "current", "recorded_at": "2030-01-01T10:01:05Z",
                           "reconverge": None}
    assert s["boot"]["state"] == "ready" and s["problems"] == []  # the old keys as they were
    # The deployment's dashboard, the link every stack's outputs print too.
    url = f"dashboards/custom/tpuserve-serving?project={d.gcp.project}"
    assert s["dashboard_url"].endswith(url)
    table = invoke("status", "spot")
    assert url in "".join(table.stdout.split())  # the table may wrap the long link
    assert table.exit_code == 0, table.stderr
    assert f"config serving the deployed config (argv sha256 {deployed})" in _words(table.stdout)
    assert "reconverge" not in table.stdout


def test_an_older_config_still_served_while_the_node_reconverges(cli_env: Env) -> None:
    d = cli_env.d("spot")
    deployed = served_config_sha256(d, vllm_command(d))
    cli_env.seed_ready("spot", attrs={
        **BOOT_READY, "config": "2030-01-01T10:01:05.000Z argv_sha256=0123456789abcdef",
        "reconverge": "2030-01-02T09:00:00.000Z changed sha256=feedc0ffee"})
    result = invoke("status", "spot", "--json")
    assert result.exit_code == 0, result.stderr
    (s,) = json.loads(result.stdout)["stacks"]
    c = s["config"]
    assert (c["running"], c["deployed"], c["current"], c["state"]) == (
        "0123456789abcdef", deployed, False, "stale")
    assert c["reconverge"] == {"state": "changed", "detail": "sha256=feedc0ffee",
                               "at": "2030-01-02T09:00:00Z"}
    table = _words(invoke("status", "spot").stdout)
    assert (f"config serving another config: running 0123456789abcdef, deployed {deployed} "
            "(once deployed, the node re-converges in place: watch this)") in table
    assert "reconverge changed sha256=feedc0ffee (at 01-02 09:00:00 UTC)" in table


def test_a_failed_reconverge_is_a_problem(cli_env: Env) -> None:
    cli_env.seed_ready("ondemand", attrs={
        **BOOT_READY, "config": "2030-01-01T10:01:05.000Z argv_sha256=0123456789abcdef",
        "reconverge": "2030-01-02T09:00:00.000Z failed image pull: manifest unknown"})
    result = invoke("status", "ondemand", "--json")
    assert result.exit_code == 1
    (s,) = json.loads(result.stdout)["stacks"]
    assert s["config"]["reconverge"]["state"] == "failed"
    assert s["problems"] == [
        "the node could not apply the changed config: failed image pull: manifest unknown"]


def test_a_server_booted_before_tpuserve_recorded_its_config(cli_env: Env) -> None:
    d = cli_env.seed_ready("flex")  # BOOT_READY: no `config` attribute
    deployed = served_config_sha256(d, vllm_command(d))
    result = invoke("status", "flex", "--json")
    assert result.exit_code == 0, result.stderr
    (s,) = json.loads(result.stdout)["stacks"]
    assert s["config"]["running"] is None and s["config"]["current"] is None
    assert (s["config"]["state"], s["config"]["deployed"]) == ("unknown", deployed)
    table = _words(invoke("status", "flex").stdout)
    assert f"config unknown (booted before tpuserve recorded it); deployed {deployed}" in table


def test_served_config_states() -> None:
    boot = {"boot": "2030-01-01T10:00:00.000Z started"}
    assert parse_served({}, "ab", booting=True) == ServedConfig("ab")
    assert parse_served(boot, "ab", booting=True).state == "booting"
    assert parse_served(boot, "ab", booting=False).state == "unknown"
    odd = parse_served({**boot, "config": "garbled"}, "ab", booting=False)
    assert (odd.state, odd.running, odd.current) == ("unknown", None, None)


def test_not_deployed_is_not_a_failure(cli_env: Env) -> None:
    result = invoke("status", "flex", "--json")
    assert result.exit_code == 0
    (s,) = json.loads(result.stdout)["stacks"]
    assert s["deployed"] is False and s["queued_resource_state"] == "MISSING"
    assert s["config"]["state"] == "none" and s["config"]["current"] is None


def test_api_error_is_one_line(cli_env: Env) -> None:
    cli_env.tpu.fail_next(403, "PERMISSION_DENIED", "Permission 'tpu.nodes.get' denied",
                          method="GET", path_contains="/nodes/")
    result = invoke("status", "spot")
    assert_one_line_error(result, "403", "PERMISSION_DENIED", "tpu.nodes.get", "IAM")


def test_unreachable_tpu_endpoint_is_one_line(cli_env: Env,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU", "http://127.0.0.1:9/")
    result = invoke("status", "spot", "--json")
    assert_one_line_error(result, "UNAVAILABLE")
    assert json.loads(result.stdout)["ok"] is False


def test_unknown_stack_is_a_usage_error(cli_env: Env) -> None:
    result = invoke("status", "gpu")
    assert result.exit_code == 2
    assert_one_line_error(result, "'gpu'", "spot, ondemand, flex")


def test_watch_refreshes_and_recovers_when_asked(cli_env: Env,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    d = cli_env.seed_ready("spot")
    cli_env.tpu.set_node_state(d.node_name, "PREEMPTED")
    deployed: list[str] = []

    def fake_deploy(stack: str, log: object) -> int:
        deployed.append(stack)
        cli_env.tpu.seed_node(PROJECT, ZONE, d.node_name, external_ip="127.0.0.1")
        return 0

    monkeypatch.setattr("tpuserve.cli.common.deploy_runner", lambda: fake_deploy)
    result = invoke("status", "spot", "--watch", "--recover", "--iterations", "2",
                    "--interval", "0", "--json")
    assert result.exit_code == 0, result.stderr
    docs = [json.loads(line) for line in result.stdout.splitlines()]  # JSON Lines
    assert [doc["iteration"] for doc in docs] == [1, 2]
    assert docs[0]["stacks"][0]["node_state"] == "PREEMPTED"
    assert docs[1]["stacks"][0]["node_state"] == "READY"
    assert deployed == ["spot"]
    assert "recovered" in result.stderr


def test_recover_needs_watch(cli_env: Env) -> None:
    assert invoke("status", "--recover").exit_code == 2


# ---------------------------------------------------------------- pure arithmetic


def _status(d: object, *, created: dt.datetime, now: dt.datetime, qr: QueuedResource | None = None,
            attrs: dict[str, str] | None = None) -> StackStatus:
    node = NodeView("n", "READY", "HEALTHY", "1.2.3.4", created, "v5litepod-1", True)
    return StackStatus(d, node, qr, parse_boot(attrs or {}), True, "HTTP 200", now)  # type: ignore[arg-type]


def test_money_and_time_left_for_spot(deployments: dict) -> None:
    created = dt.datetime(2030, 1, 1, 10, tzinfo=dt.UTC)
    s = _status(deployments["spot"], created=created, now=created + dt.timedelta(hours=2))
    assert s.running_s == 7200
    assert s.spent_usd == pytest.approx(2 * 0.5779)  # SPEC 2 spot price, one chip
    at, rule = s.ends_at
    assert at == created + dt.timedelta(hours=8)  # max_run_hours = 8: the guard task's time
    assert rule == "billing guard 8 h (createTime + max_run_hours)"
    assert s.ends_in_s == 6 * 3600


def test_time_left_for_flex_comes_from_the_run_duration(deployments: dict) -> None:
    created = dt.datetime(2030, 1, 1, 10, tzinfo=dt.UTC)
    qr = QueuedResource("q", "ACTIVE", {"runDuration": {"maxRunDuration": "14400s"}})
    s = _status(deployments["flex"], created=created, now=created + dt.timedelta(hours=1),
                qr=qr)
    assert s.spent_usd == pytest.approx(0.6)
    assert s.ends_in_s == 3 * 3600
    assert s.ends_at[1] == "flex max run duration 4h00m"


def test_stale_guest_attributes_of_an_earlier_boot_are_ignored() -> None:
    report = parse_boot({
        "boot": "2030-01-02T00:00:00.000Z started",
        "state": "2030-01-01T10:00:00.000Z ready",  # the previous boot's
        "secret": "2030-01-02T00:00:05.000Z fetched",
        "health": "2030-01-01T10:00:00.000Z ok",
    })
    assert report.state == "booting"
    assert [p.key for p in report.phases] == ["boot", "secret"]
    assert parse_boot(BOOT_READY).guard_deadline == dt.datetime(2030, 1, 1, 18, tzinfo=dt.UTC)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (5, 65, 3700, 90000, -65, None)] == [
        "5s", "1m05s", "1h01m", "1d01h", "-1m05s", "-"]


