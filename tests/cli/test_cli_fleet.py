"""`status`, `wait`, `endpoint`, `smoke` and `bench` of the fleet: its cluster's API is a fake
Kubernetes API server on loopback (tests/fakes/kubernetes.py) reached through a kubeconfig the
test writes (KUBECONFIG, the context `gcloud container clusters get-credentials` names); its
Gateway's address and HTTP listener port are the fake OpenAI server's."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_support import API_KEY, PROJECT, Env, assert_one_line_error, invoke, write_config
from tests.fakes import kubernetes as fk
from tests.fakes.hostile_server import HostileServer, finishes_within
from tpuserve.gcp import kube
from tpuserve.render.fleet_bundle import (
    APP_LABEL,
    DEPLOYMENT,
    EPP,
    EPP_LABEL,
    GATEWAY,
    HPA,
    NAMESPACE,
)
from tpuserve.settings import Deployment, load

IMAGE = "vllm/vllm-tpu:nightly@sha256:" + "ab" * 32
FLEET = (f'\n[stacks.fleet]\nprovisioning_model = "fleet"\n\n[stacks.fleet.vllm]\n'
         f'image = "{IMAGE}"\n')
PICKER = "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0@sha256:" + "cd" * 32
METRIC = "prometheus.googleapis.com|vllm:num_requests_waiting|gauge"
CAPACITY_EVENT = ("Node scale up in zones us-west4-a associated with this pod failed: GCE out "
                  "of resources. Pod is at risk of not being scheduled.")
QUOTA_EVENT = ("Node scale up in zones us-west4-a associated with this pod failed: GCE quota "
               "exceeded. Pod is at risk of not being scheduled.")


class Fleet:
    def __init__(self, env: Env, kube_api: fk.FakeKubernetes, d: Deployment) -> None:
        self.env, self.kube, self.d = env, kube_api, d

    def seed(self, states: list[str], *, address: str | None = "127.0.0.1",
             port: int | None = None, protocol: str = "HTTP", waiting: str = "3",
             events: dict[int, tuple[str, str]] | None = None, picker_ready: int = 1) -> None:
        """Pods vllm-*-0000N in STATES (tests/fakes/kubernetes.py pod()), the Deployment and the
        HPA to match, the Gateway at ADDRESS:PORT (default: the fake OpenAI server)."""
        ready = states.count("ready")
        self.kube.put(fk.deployment(NAMESPACE, DEPLOYMENT, desired=len(states), ready=ready,
                                    labels=APP_LABEL))
        self.kube.put(fk.hpa(NAMESPACE, HPA, target="8", metric=METRIC, current=waiting,
                             current_replicas=len(states), desired_replicas=len(states),
                             min_replicas=1, max_replicas=4))
        self.kube.put(fk.gateway(NAMESPACE, GATEWAY, address=address, protocol=protocol,
                                 port=self.env.oai.port if port is None else port))
        picker = fk.deployment(NAMESPACE, EPP, desired=1, ready=picker_ready, labels=EPP_LABEL)
        picker["spec"]["template"]["spec"]["containers"] = [{"name": "epp", "image": PICKER}]
        self.kube.put(picker)
        for i, state in enumerate(states):
            self.kube.put(fk.pod(NAMESPACE, f"vllm-6d5f-0000{i}", APP_LABEL, state=state,
                                 message="0/2 nodes are available: 2 node(s) didn't match "
                                 "Pod's node affinity/selector." if state == "unschedulable"
                                 else ""))
        for i, (reason, message) in (events or {}).items():
            self.kube.put(fk.event(NAMESPACE, f"vllm-6d5f-0000{i}", reason=reason,
                                   message=message))


@pytest.fixture
def fleet(cli_env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fleet]:
    write_config(cli_env.config_path, cli_env.oai.port, FLEET)
    d = load().deployments["fleet"]
    with fk.FakeKubernetes() as api:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig(kube.context_name(d)))
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        yield Fleet(cli_env, api, d)


def _status(*extra: str) -> dict:
    result = invoke("status", "fleet", "--json", *extra)
    assert "Traceback" not in result.stdout + result.stderr
    return {"exit_code": result.exit_code, **json.loads(result.stdout)["stacks"][0]}


def test_the_context_is_the_one_gcloud_writes(fleet: Fleet) -> None:
    assert kube.context_name(fleet.d) == f"gke_{PROJECT}_us-west4-a_tpuserve-fleet"


def test_status_all_ready(fleet: Fleet) -> None:
    fleet.seed(["ready", "ready"], waiting="3500m")
    result = invoke("status", "fleet")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "2/2 ready" in out
    assert "vllm:num_requests_waiting: 3.5 / target 8 (AverageValue)" in out
    assert "2 current, 2 desired (min 1, max 4)" in out
    assert f"http://127.0.0.1:{fleet.env.oai.port}/v1" in out
    assert "ok (HTTP 200)" in out
    assert "(Accepted=True, Programmed=True)" in out
    assert "picker      1/1 ready" in out and "/epp:v1.5.0@sha256:" in out
    assert f"${2 * fleet.d.usd_per_hour:,.4f}/h: 2 replica(s)" in out
    assert "problem" not in out
    # What the CLI asked the API server: documented paths, bounded lists, nothing else.
    paths = [(p, q) for _m, p, q in fleet.kube.requests]
    assert paths == [
        (f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{DEPLOYMENT}", ""),
        (f"/apis/autoscaling/v2/namespaces/{NAMESPACE}/horizontalpodautoscalers/{HPA}", ""),
        (f"/apis/gateway.networking.k8s.io/v1/namespaces/{NAMESPACE}/gateways/{GATEWAY}", ""),
        (f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{EPP}", ""),
        (f"/api/v1/namespaces/{NAMESPACE}/pods",
         f"labelSelector=app%3Dvllm&limit={kube.MAX_LIST_ITEMS}"),
    ]


def test_status_pending_for_capacity(fleet: Fleet) -> None:
    fleet.seed(["ready", "unschedulable"], events={1: ("FailedScaleUp", CAPACITY_EVENT)})
    doc = _status()
    assert doc["exit_code"] == 0  # waiting for chips is what flex does: not a problem
    pending = doc["pods"][1]
    assert (pending["phase"], pending["state"]) == ("Pending", "capacity")
    assert pending["reason"] == f"FailedScaleUp: {CAPACITY_EVENT}"
    assert doc["pending"] == {"capacity": 1, "quota": 0, "unschedulable": 0}
    # The pending pod holds no chip: one replica is billed.
    assert doc["billed_replicas"] == 1
    assert doc["usd_per_hour"] == round(fleet.d.usd_per_hour, 4)
    # Events were asked for the pending pod only.
    queries = [q for _m, p, q in fleet.kube.requests if p.endswith("/events")]
    assert queries == [("fieldSelector=involvedObject.kind%3DPod%2CinvolvedObject.name%3D"
                       "vllm-6d5f-00001&limit=50")]


def test_status_pending_for_capacity_from_the_scheduler_alone(fleet: Fleet) -> None:
    fleet.seed(["unschedulable"])  # no autoscaler event yet: the scheduler's condition
    pod = _status()["pods"][0]
    assert pod["state"] == "capacity"
    assert "0/2 nodes are available" in pod["reason"]


def test_status_pending_for_quota(fleet: Fleet) -> None:
    fleet.seed(["ready", "unschedulable"], events={1: ("FailedScaleUp", QUOTA_EVENT)})
    result = invoke("status", "fleet")
    assert result.exit_code == 1  # a quota needs the user: a problem
    assert "quota" in result.stdout and "GCE quota exceeded" in result.stdout
    assert "problem:" in result.stdout
    doc = _status()
    assert doc["pods"][1]["state"] == "quota"
    assert any("waits on quota" in p for p in doc["problems"])


def test_status_compiling(fleet: Fleet) -> None:
    fleet.seed(["ready", "booting"])
    doc = _status()
    assert doc["exit_code"] == 0
    pod = doc["pods"][1]
    assert (pod["phase"], pod["state"], pod["ready"]) == ("Running", "compiling", False)
    assert "startup probe" in pod["reason"]
    assert doc["billed_replicas"] == 2  # a compiling replica holds its chip
    assert doc["replicas"] == {"desired": 2, "ready": 1, "updated": 2, "available": 1}


def test_status_restoring_and_failing(fleet: Fleet) -> None:
    fleet.seed(["restoring", "crashloop"])
    doc = _status()
    assert [p["state"] for p in doc["pods"]] == ["restoring", "failing"]
    assert "CrashLoopBackOff" in doc["pods"][1]["reason"]
    assert doc["exit_code"] == 1


def test_status_json_keys(fleet: Fleet) -> None:
    fleet.seed(["ready", "unschedulable"], events={1: ("FailedScaleUp", CAPACITY_EVENT)})
    doc = _status()
    assert set(doc) - {"exit_code"} == {
        "stack", "provisioning_model", "project", "zone", "cluster", "kube_context", "deployed",
        "replicas", "autoscaler", "gateway", "endpoint", "health", "pods", "pending",
        "billed_replicas", "usd_per_replica_hour", "usd_per_hour", "truncated", "problems",
        "dashboard_url", "picker",
        # the two money keys every kind has (tests/cli/test_cli_status_money.py)
        "price_usd_per_hour", "spend_usd_per_hour"}
    assert doc["autoscaler"] == {
        "min_replicas": 1, "max_replicas": 4, "current_replicas": 2, "desired_replicas": 2,
        "metrics": [{"name": METRIC, "type": "Pods", "current": 3.0, "target": 8.0,
                     "target_type": "AverageValue"}]}
    assert doc["gateway"] == {
        "name": GATEWAY, "address": "127.0.0.1", "programmed": True,
        "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
                        "message": ""},
                       {"type": "Programmed", "status": "True", "reason": "Programmed",
                        "message": ""}]}
    assert doc["picker"] == {"name": EPP, "ready": 1, "desired": 1, "image": PICKER}
    assert doc["endpoint"] == f"http://127.0.0.1:{fleet.env.oai.port}"
    assert doc["health"] == {"ok": True, "detail": "HTTP 200"}
    assert set(doc["pods"][0]) == {"name", "phase", "ready", "state", "reason", "node",
                                   "restarts"}
    assert doc["truncated"] == []


def test_a_picker_that_is_not_ready_is_a_problem(fleet: Fleet) -> None:
    fleet.seed(["ready"], picker_ready=0)
    doc = _status()
    assert doc["picker"] == {"name": EPP, "ready": 0, "desired": 1, "image": PICKER}
    [line] = [p for p in doc["problems"] if "endpoint picker" in p]
    assert line.startswith(f"endpoint picker {NAMESPACE}/{EPP}: 0/1 ready")
    assert doc["exit_code"] == 1


def test_a_missing_picker_is_a_problem(fleet: Fleet) -> None:
    fleet.seed(["ready"])
    fleet.kube.delete("Deployment", NAMESPACE, EPP)
    doc = _status()
    assert doc["picker"]["image"] is None
    assert any(p.startswith(f"no endpoint picker Deployment {NAMESPACE}/{EPP}")
               for p in doc["problems"])


@pytest.mark.parametrize(("accepted", "programmed", "words"), [
    (True, False, "Programmed is False (Pending: no backend yet)"),
    (False, True, "Accepted is False (Invalid)"),
])
def test_a_gateway_not_accepted_or_not_programmed_is_a_problem(
        fleet: Fleet, accepted: bool, programmed: bool, words: str) -> None:
    fleet.seed(["ready"])
    fleet.kube.put(fk.gateway(NAMESPACE, GATEWAY, address="127.0.0.1", port=fleet.env.oai.port,
                              accepted=accepted, programmed=programmed,
                              message="no backend yet" if not programmed else ""))
    doc = _status()
    assert f"Gateway {NAMESPACE}/{GATEWAY}: {words}" in doc["problems"]
    assert {"type": "Accepted", "status": str(accepted), "reason":
            "Accepted" if accepted else "Invalid", "message": ""} in doc["gateway"]["conditions"]


def test_wait_reports_the_picker_as_a_phase(fleet: Fleet) -> None:
    fleet.seed(["ready"], picker_ready=0)
    result = invoke("wait", "fleet", "--poll-interval", "0.1", "--timeout", "0.5")
    assert result.exit_code == 3
    assert_one_line_error(result, "not serving after", "picker: endpoint picker")


def test_status_not_deployed(fleet: Fleet) -> None:
    doc = _status()
    assert doc["exit_code"] == 0 and doc["deployed"] is False
    assert "not deployed" in invoke("status", "fleet").stdout


def test_status_of_every_stack_reports_the_fleet_among_them(fleet: Fleet) -> None:
    fleet.seed(["ready"])
    result = invoke("status", "--json")
    docs = {s["stack"]: s for s in json.loads(result.stdout)["stacks"]}
    assert set(docs) == {"spot", "ondemand", "flex", "fleet"}
    assert docs["fleet"]["replicas"]["ready"] == 1
    assert docs["flex"]["deployed"] is False


def test_status_without_credentials_names_the_command(fleet: Fleet,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    assert_one_line_error(invoke("status", "fleet"), "no context",
                          "gcloud container clusters get-credentials tpuserve-fleet "
                          f"--zone=us-west4-a --project={PROJECT}")
    # Among every stack: not deployed (or no credentials), not a failure of the others.
    result = invoke("status")
    assert "not deployed, or no credentials" in result.stdout


def test_a_403_is_one_line(fleet: Fleet) -> None:
    fleet.seed(["ready"])
    fleet.kube.forbidden = True
    for command in (["status", "fleet"], ["endpoint", "fleet"], ["wait", "fleet"],
                    ["smoke", "fleet"]):
        result = invoke(*command)
        assert result.exit_code == 1, command
        assert_one_line_error(result, "HTTP 403 Forbidden", 'cannot get resource "deployments"'
                              if command[0] != "endpoint" else 'cannot get resource "gateways"',
                              "roles/container.viewer")


def test_a_401_is_one_line(fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet.seed(["ready"])
    path = tmp_path / "stale"
    path.write_text(fleet.kube.kubeconfig(kube.context_name(fleet.d), token="expired"))
    monkeypatch.setenv("KUBECONFIG", str(path))
    assert_one_line_error(invoke("status", "fleet", "--json"), "HTTP 401 Unauthorized")


def test_a_stalled_api_server_is_bounded(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet.seed(["ready"])
    fleet.kube.stall_s = 60
    monkeypatch.setattr(kube, "READ_TIMEOUT_S", 0.5)
    monkeypatch.setattr(kube, "CALL_DEADLINE_S", 1.0)
    start = time.monotonic()
    result = invoke("status", "fleet")
    assert time.monotonic() - start < 10
    assert_one_line_error(result, "deployment tpuserve/vllm")
    assert "timed out" in result.stderr or "no complete answer within" in result.stderr


def test_a_trickling_api_server_is_bounded(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    """Headers at once, then a byte at a time: each read is quick, the whole is not."""
    from werkzeug import Response

    def trickle() -> Response:
        def body() -> Iterator[bytes]:
            for _ in range(600):
                time.sleep(0.05)
                yield b" "

        return Response(body(), 200, mimetype="application/json")

    fleet.kube.faults.add(lambda r: True, trickle)
    monkeypatch.setattr(kube, "CALL_DEADLINE_S", 1.0)
    start = time.monotonic()
    result = invoke("endpoint", "fleet")
    assert time.monotonic() - start < 10
    assert_one_line_error(result, "no complete answer within 1 s")


def test_an_oversized_answer_is_refused(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    from werkzeug import Response

    fleet.kube.faults.add(lambda r: True, lambda: Response(b"[" + b"0," * 40_000 + b"0]", 403))
    monkeypatch.setattr(kube, "MAX_BYTES", 10_000)
    assert_one_line_error(invoke("status", "fleet"), "exceeded 10,000 bytes")


def test_wait_until_a_replica_is_ready(fleet: Fleet) -> None:
    fleet.seed(["booting"], address=None)

    def later() -> None:  # once `wait` has seen the compiling replica
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(
                p.endswith("/pods") for _m, p, _q in fleet.kube.requests):
            time.sleep(0.02)
        time.sleep(0.2)
        fleet.seed(["ready"])

    threading.Thread(target=later, daemon=True).start()
    result = invoke("wait", "fleet", "--poll-interval", "0.1", "--timeout", "30", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    base = f"http://127.0.0.1:{fleet.env.oai.port}"
    assert doc["endpoint"] == base and doc["openai_base_url"] == base + "/v1"
    assert doc["gateway_address"] == "127.0.0.1"
    assert (doc["replicas_ready"], doc["replicas_desired"]) == (1, 1)
    assert set(doc["phases"]) == {"replicas", "picker", "gateway", "health"}
    assert "compiling" in result.stderr  # the progress said why it waited
    assert any(r.path == "/health" for r in fleet.env.oai.requests)


def test_wait_text(fleet: Fleet) -> None:
    fleet.seed(["ready"])
    result = invoke("wait", "fleet", "--poll-interval", "0.1")
    assert result.exit_code == 0, result.stderr
    assert f"endpoint     http://127.0.0.1:{fleet.env.oai.port}/v1" in result.stdout
    assert "gcloud secrets versions access latest --secret=tpuserve-api-key" in result.stdout


def test_wait_times_out_with_exit_3(fleet: Fleet) -> None:
    fleet.seed(["unschedulable"], events={0: ("FailedScaleUp", CAPACITY_EVENT)})
    result = invoke("wait", "fleet", "--poll-interval", "0.1", "--timeout", "0.5")
    assert result.exit_code == 3
    assert_one_line_error(result, "not serving after", "timeout", "replicas: 0/1 ready",
                          "capacity", "tpuserve status fleet")


def test_wait_without_a_deployment_fails_at_once(fleet: Fleet) -> None:
    result = invoke("wait", "fleet", "--timeout", "30")
    assert result.exit_code == 1
    assert_one_line_error(result, "no Deployment tpuserve/vllm", "npx cdktf deploy fleet")


def test_endpoint_http(fleet: Fleet) -> None:
    fleet.seed(["ready"])
    result = invoke("endpoint", "fleet")
    assert result.exit_code == 0, result.stderr
    base = f"http://127.0.0.1:{fleet.env.oai.port}"
    assert f"OpenAI base  {base}/v1" in result.stdout
    assert "plain HTTP" in result.stdout
    assert (f'export OPENAI_API_KEY="$(gcloud secrets versions access latest '
            f'--secret={fleet.d.api_key_secret_id} --project={PROJECT})"') in result.stdout
    assert API_KEY not in result.stdout + result.stderr
    doc = json.loads(invoke("endpoint", "fleet", "--json").stdout)
    assert set(doc) == {"stack", "cluster", "kube_context", "gateway_address",
                        "gateway_programmed", "base_url", "openai_base_url", "tls", "curl",
                        "api_key_required", "api_key_secret", "api_key_command",
                        "create_api_key_command"}
    assert doc["openai_base_url"] == base + "/v1" and doc["tls"] is None
    assert doc["api_key_secret"] == fleet.d.api_key_secret_id
    assert fleet.env.oai.requests == []  # the server is not even asked


def test_endpoint_on_port_80_has_no_port(fleet: Fleet) -> None:
    fleet.seed(["ready"], address="34.1.2.3", port=80)
    doc = json.loads(invoke("endpoint", "fleet", "--json").stdout)
    assert doc["openai_base_url"] == "http://34.1.2.3/v1"


def test_endpoint_https_with_a_domain(fleet: Fleet) -> None:
    write_config(fleet.env.config_path, fleet.env.oai.port,
                 FLEET + '\n[stacks.fleet.fleet]\ndomain = "llm.example.com"\n')
    fleet.seed(["ready"], address="34.1.2.3", port=443, protocol="HTTPS")
    result = invoke("endpoint", "fleet")
    assert result.exit_code == 0, result.stderr
    assert "OpenAI base  https://llm.example.com/v1" in result.stdout
    assert "point llm.example.com at it" in result.stdout
    doc = json.loads(invoke("endpoint", "fleet", "--json").stdout)
    assert doc["openai_base_url"] == "https://llm.example.com/v1"
    assert doc["tls"]["domain"] == "llm.example.com"
    assert doc["gateway_address"] == "34.1.2.3"


def test_endpoint_before_the_gateway_has_an_address(fleet: Fleet) -> None:
    fleet.seed(["booting"], address=None)
    assert_one_line_error(invoke("endpoint", "fleet"), "has no address yet",
                          "tpuserve wait fleet")
    assert_one_line_error(invoke("endpoint", "fleet", "--cert-out", "x.pem"), "--cert-out")


def test_smoke_through_the_gateway(fleet: Fleet) -> None:
    fleet.seed(["ready", "ready"])
    result = invoke("smoke", "fleet", "--json")
    assert result.exit_code == 0, result.stderr + result.stdout
    doc = json.loads(result.stdout)
    assert doc["base_url"] == f"http://127.0.0.1:{fleet.env.oai.port}"
    checks = {c["check"]: c["result"] for c in doc["checks"]}
    assert checks["chat completion"] == "pass"
    assert "fail" not in checks.values()
    # The key-refusal checks ran: the fleet's proxy guards every path but /health.
    assert any(not r.authorized and r.path.startswith("/v1") for r in fleet.env.oai.requests)


def test_smoke_refuses_a_pin_for_the_fleet(fleet: Fleet) -> None:
    fleet.seed(["ready"])
    result = invoke("smoke", "fleet", "--fingerprint", "ab" * 32)
    assert result.exit_code == 2
    assert_one_line_error(result, "go with --endpoint")


def test_recover_refuses_the_fleet_without_a_call(fleet: Fleet) -> None:
    result = invoke("recover", "fleet", env={"TPUSERVE_DEPLOY_COMMAND": "false"})
    assert result.exit_code == 2
    assert_one_line_error(result, "the fleet heals itself", "tpuserve status fleet")
    assert fleet.kube.requests == [] and fleet.env.tpu.requests == []


def test_smoke_without_a_key(fleet: Fleet) -> None:
    fleet.seed(["ready"])
    result = invoke("smoke", "fleet", env={"OPENAI_API_KEY": ""})
    assert result.exit_code == 2
    assert_one_line_error(result, "no key was given",
                          "gcloud secrets versions access latest --secret=tpuserve-api-key")


def test_bench_through_the_gateway(fleet: Fleet, tmp_path: Path) -> None:
    fleet.seed(["ready"])
    result = invoke("bench", "fleet", "--contexts", "32", "--clients", "2", "--repetitions", "1",
                    "--output-tokens", "4", "--out", str(tmp_path), "--no-chart", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["stack"] == "fleet"
    assert Path(doc["json_path"]).name.startswith("bench-fleet-")


@pytest.mark.parametrize("command", ["status", "smoke", "bench"])
def test_the_kubernetes_client_stays_out_of_other_paths(command: str) -> None:
    from tests.cli.test_cli_lazy import _imported_after

    modules = _imported_after(command, "--help")
    assert f"tpuserve.cli.{command}" in modules  # the command was loaded
    assert not {m for m in modules if m == "kubernetes" or m.startswith("kubernetes.")}


def test_wait_timeout_bounds_a_kubernetes_api_that_hangs(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`wait --timeout` bounds every Kubernetes call: each was bounded by its own 20 s only."""
    with HostileServer("hang") as url:
        config = json.loads(fleet.kube.kubeconfig(kube.context_name(fleet.d)))
        config["clusters"][0]["cluster"]["server"] = url
        path = tmp_path / "hanging-kubeconfig"
        path.write_text(json.dumps(config))
        monkeypatch.setenv("KUBECONFIG", str(path))
        result = finishes_within(60, lambda: invoke(
            "wait", "fleet", "--timeout", "3", "--poll-interval", "1"))
    assert result.exit_code == 3
    assert_one_line_error(result, "not serving after", "(timeout)", "tpuserve status fleet")


def test_smoke_deadline_bounds_the_fleets_kubernetes_lookup(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--deadline bounds the Gateway's lookup too, not 20 s per Kubernetes call on top of it."""
    with HostileServer("hang") as url:
        config = json.loads(fleet.kube.kubeconfig(kube.context_name(fleet.d)))
        config["clusters"][0]["cluster"]["server"] = url
        path = tmp_path / "hanging-kubeconfig"
        path.write_text(json.dumps(config))
        monkeypatch.setenv("KUBECONFIG", str(path))
        result = finishes_within(60, lambda: invoke("smoke", "fleet", "--deadline", "3"))
    assert result.exit_code == 1
    assert_one_line_error(result, "overall deadline of 3 s passed", "--deadline")
