"""`python -m tpuserve.fleet_check preflight`: the fleet's plan-time check of its TPU quota,
its release channel's versions and its APIs, against the fake Compute, Container and Service
Usage APIs; in-process and as Terraform runs it. Positive proof only: every answer that does
not show the thing refuses, one line per failure naming what to request or enable."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.compute import FakeCompute
from tests.fakes.container import FakeContainer
from tests.fakes.serviceusage import FakeServiceUsage
from tpuserve import fleet_check
from tpuserve.gcp.fleet_query import QUOTA_METRICS
from tpuserve.paths import REPO_ROOT

TOKEN = "ya29.fake-fleet-token"
PROJECT, NUMBER, REGION, ZONE = "proj-test-1", "123456789012", "us-west4", "us-west4-a"
FLOOR = "1.34.0-gke.1626000"
APIS = ["container.googleapis.com", "compute.googleapis.com",
        "cloudresourcemanager.googleapis.com", "networkservices.googleapis.com",
        "monitoring.googleapis.com", "logging.googleapis.com"]
SPOT = "PREEMPTIBLE_TPU_LITE_PODSLICE_V5"
ONDEMAND = "TPU_LITE_PODSLICE_V5"


@contextlib.contextmanager
def fleet_cloud() -> Iterator[dict[str, Any]]:
    """A project that has all the fleet needs: the APIs, quota for 2..6 spot/flex chips, and
    the floor in the REGULAR channel."""
    compute = FakeCompute(project=PROJECT, access_token=TOKEN).start()
    usage = FakeServiceUsage(project=PROJECT, number=NUMBER, access_token=TOKEN).start()
    container = FakeContainer(project=PROJECT, access_token=TOKEN,
                              project_number=NUMBER).start()
    container.channels = {
        "RAPID": ["1.35.0-gke.1795000", "1.34.1-gke.1829001", FLOOR],
        "REGULAR": ["1.34.1-gke.1829001", FLOOR, "1.33.5-gke.1308000"],
        "STABLE": ["1.33.5-gke.1308000", "1.33.4-gke.1245000"]}
    usage.enable(*APIS, "certificatemanager.googleapis.com")
    compute.set_quota(REGION, "CPUS", 24, 4)
    compute.set_quota(REGION, SPOT, 8, 0)
    compute.set_quota(REGION, ONDEMAND, 8, 0)
    env = {"CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": compute.endpoint,
           "CLOUDSDK_API_ENDPOINT_OVERRIDES_CONTAINER": container.endpoint,
           "CLOUDSDK_API_ENDPOINT_OVERRIDES_SERVICEUSAGE": usage.endpoint,
           "CLOUDSDK_AUTH_ACCESS_TOKEN": TOKEN, "TPUSERVE_TIME_SCALE": "0"}
    try:
        yield {"compute": compute, "usage": usage, "container": container, "env": env}
    finally:
        compute.stop()
        usage.stop()
        container.stop()


@pytest.fixture
def cloud() -> Iterator[dict[str, Any]]:
    with fleet_cloud() as fakes:
        yield fakes


def query(**over: str) -> str:
    return json.dumps({
        "project": PROJECT, "region": REGION, "zone": ZONE, "cluster": "tpuserve-fleet",
        "release_channel": "REGULAR", "min_master_version": FLOOR,
        "machine_type": "ct5lp-hightpu-1t", "provisioning": "flex,spot", "min_replicas": "2",
        "max_replicas": "6", "apis": ",".join(APIS), **over})


def run(env: dict[str, str], stdin: str) -> tuple[int, str, list[str]]:
    out, err = io.StringIO(), io.StringIO()
    code = fleet_check.main(["preflight"], environ=env, stdin=io.StringIO(stdin), stdout=out,
                            stderr=err)
    lines = err.getvalue().splitlines()
    assert all(ln.startswith("tpuserve: ") for ln in lines), lines
    assert "Traceback" not in err.getvalue()
    return code, out.getvalue(), lines


def test_the_metric_names_are_computes_own() -> None:
    """Every metric of the table is a value of compute.v1's Quota.metric enum."""
    import googleapiclient

    doc = json.loads((Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"
                      / "compute.v1.json").read_text())
    enum = set(doc["schemas"]["Quota"]["properties"]["metric"]["enum"])
    used = {m for by_model in QUOTA_METRICS.values() for m in by_model.values()}
    assert used == {SPOT, ONDEMAND} and used <= enum


def test_all_proven_passes(cloud) -> None:
    code, out, lines = run(cloud["env"], query())
    assert (code, json.loads(out), lines) == (
        0, {"fleet": "ok", "warnings": "0", "warning_text": ""}, [])
    [batch] = [c for c in cloud["usage"].calls if c.path.endswith(":batchGet")]
    assert batch.names == tuple(f"projects/{PROJECT}/services/{a}" for a in APIS)
    assert [c.path for c in cloud["compute"].calls] == [
        f"/compute/v1/projects/{PROJECT}/regions/{REGION}"]


def test_a_floor_without_room_refuses_naming_the_metric(cloud) -> None:
    cloud["compute"].set_quota(REGION, SPOT, 3, 2)  # 1 chip left, the floor needs 2
    code, out, lines = run(cloud["env"], query())
    assert (code, out) == (1, "")
    [line] = lines
    assert f"quota {SPOT} in {REGION} leaves 1 chip (limit 3 - usage 2 = 1)" in line
    assert "fleet.min_replicas = 2" in line and f"request {SPOT} quota in {REGION}" in line


def test_room_below_max_replicas_warns(cloud) -> None:
    cloud["compute"].set_quota(REGION, SPOT, 4, 0)
    code, out, lines = run(cloud["env"], query())
    assert (code, json.loads(out)["warnings"]) == (0, "1")
    [line] = lines
    # Terraform shows no stderr of a program that succeeds: the result carries it too.
    assert json.loads(out)["warning_text"] == line.removeprefix("tpuserve: warning: ")
    assert line.startswith(f"tpuserve: warning: quota {SPOT} in {REGION} leaves 4 chips")
    assert "fleet.max_replicas = 6" in line


def test_on_demand_nodes_use_their_own_metric(cloud) -> None:
    cloud["compute"].set_quota(REGION, ONDEMAND, 1, 0)
    code, _out, lines = run(cloud["env"], query(provisioning="ondemand,spot"))
    assert code == 1
    assert [ln for ln in lines if ONDEMAND + " in" in ln and "needs 2 chips" in ln], lines


def test_an_absent_metric_refuses_unless_forced(cloud) -> None:
    cloud["compute"].quotas[REGION].pop(SPOT)
    code, _out, lines = run(cloud["env"], query())
    assert code == 1
    [line] = lines
    assert f"quota {SPOT}" in line and "is not in region us-west4's quotas" in line
    assert "TPUSERVE_FLEET_FORCE=1" in line
    code, out, lines = run({**cloud["env"], "TPUSERVE_FLEET_FORCE": "1"}, query())
    assert (code, json.loads(out)["warnings"]) == (0, "1")
    assert lines[0].startswith("tpuserve: warning: quota " + SPOT)


def test_a_running_fleets_own_nodes_do_not_refuse_its_next_plan(cloud) -> None:
    """Usage holds the fleet's own nodes once it is up: then the limit alone is compared."""
    cloud["compute"].set_quota(REGION, SPOT, 2, 2)
    assert run(cloud["env"], query())[0] == 1
    cloud["container"].add_cluster(ZONE, "tpuserve-fleet")
    code, _out, lines = run(cloud["env"], query(max_replicas="2"))
    assert (code, lines) == (0, [])


@pytest.mark.parametrize("answer", [
    {"quotaStatusWarning": {"code": "QUOTA_INFO_UNAVAILABLE"}, "name": REGION},
    {"name": REGION},
    {"name": REGION, "quotas": []},
    {"name": REGION, "quotas": [{"metric": SPOT, "limit": None, "usage": 0}]},
    {"name": REGION, "quotas": [{"metric": SPOT, "limit": "8", "usage": 0}]},
    {"name": REGION, "quotas": [{"limit": 8, "usage": 0}]},
])
def test_a_region_answer_that_proves_nothing_refuses(cloud, answer) -> None:
    cloud["compute"].answer_next(answer)
    code, _out, lines = run(cloud["env"], query())
    assert code == 1
    [line] = lines
    assert line.startswith(f"tpuserve: cannot check the TPU quota of region {REGION}: ")


def test_the_quota_warning_the_fake_sends_refuses(cloud) -> None:
    cloud["compute"].quota_warning = "QUOTA_INFO_UNAVAILABLE"
    code, _out, [line] = run(cloud["env"], query())
    assert code == 1 and "quotaStatusWarning QUOTA_INFO_UNAVAILABLE" in line


def test_compute_not_enabled_names_the_api_to_enable(cloud) -> None:
    cloud["compute"].disabled = True
    code, _out, lines = run(cloud["env"], query())
    assert code == 1
    [line] = lines
    assert "compute.googleapis.com is not enabled" in line
    assert f"gcloud services enable compute.googleapis.com --project {PROJECT}" in line


def test_a_channel_without_the_floor_refuses(cloud) -> None:
    code, _out, lines = run(cloud["env"], query(release_channel="STABLE"))
    assert code == 1
    [line] = lines
    assert f"the STABLE channel in {ZONE} does not offer GKE {FLOOR}" in line
    assert "fleet.release_channel" in line


def test_a_channel_past_the_floor_names_what_it_offers(cloud) -> None:
    cloud["container"].channels["REGULAR"] = ["1.34.2-gke.1000000", "1.34.1-gke.1829001"]
    code, _out, [line] = run(cloud["env"], query())
    assert code == 1
    assert "it offers 1.34.1-gke.1829001, 1.34.2-gke.1000000" in line
    assert "MIN_MASTER_VERSION" in line


@pytest.mark.parametrize("versions", [[], None, ["1.34"], ["latest"]])
def test_a_server_config_that_proves_nothing_refuses(cloud, versions) -> None:
    if versions is None:
        cloud["container"].channels.pop("REGULAR")
    else:
        cloud["container"].channels["REGULAR"] = versions
    code, _out, [line] = run(cloud["env"], query())
    assert code == 1
    assert "REGULAR" in line and FLOOR in line


def test_every_api_not_enabled_is_its_own_line(cloud) -> None:
    cloud["usage"].enabled -= {"networkservices.googleapis.com", "monitoring.googleapis.com"}
    code, _out, lines = run(cloud["env"], query())
    assert code == 1
    assert lines == [
        f"tpuserve: API {api} is not proven enabled in project '{PROJECT}' (state DISABLED): "
        f"enable it (gcloud services enable {api} --project {PROJECT}), then plan again"
        for api in ("networkservices.googleapis.com", "monitoring.googleapis.com")]


@pytest.mark.parametrize("answer", [
    {}, {"services": []}, {"services": None},
    {"services": [{"name": f"projects/{NUMBER}/services/{a}", "state": "STATE_UNSPECIFIED"}
                  for a in APIS]},
    {"services": [{"name": f"projects/{NUMBER}/services/{a}"} for a in APIS]},
])
def test_a_services_answer_that_proves_nothing_refuses(cloud, answer) -> None:
    cloud["usage"].answer_next(answer)
    code, _out, lines = run(cloud["env"], query())
    assert code == 1
    assert len(lines) == len(APIS)
    assert all("is not proven enabled" in ln for ln in lines), lines


def test_an_html_page_or_a_denial_refuses_in_one_line(cloud) -> None:
    cloud["usage"].faults.html(lambda r: True, code=502, times=10)
    code, _out, [line] = run(cloud["env"], query())
    assert code == 1 and line.startswith("tpuserve: cannot check the APIs enabled")
    cloud["usage"].faults = type(cloud["usage"].faults)()
    cloud["usage"].denied.add("serviceusage.services.get")
    code, _out, [line] = run(cloud["env"], query())
    assert code == 1 and "grant your account serviceusage.services.get" in line


def test_all_failures_at_once_are_one_line_each(cloud) -> None:
    cloud["usage"].enabled.discard("logging.googleapis.com")
    cloud["compute"].set_quota(REGION, SPOT, 0, 0)
    code, _out, lines = run(cloud["env"], query(release_channel="STABLE"))
    assert code == 1 and len(lines) == 3, lines
    assert [re.sub(r" .*", "", ln.removeprefix("tpuserve: ")) for ln in lines] == [
        "API", "the", "quota"]


@pytest.mark.parametrize(("stdin", "words"), [
    ("nope", "stdin is not JSON"),
    ('{"project": 1}', "must be strings"),
    (query(zone="europe-west4-a"), "is not in region"),
    (query(machine_type="ct5p-hightpu-4t"), "known TPU machine types"),
    # A v6e machine is the accelerator table's, but no Compute Engine quota metric names v6e:
    # the check refuses rather than pass a quota it cannot read (docs/accelerators.md).
    (query(machine_type="ct6e-standard-1t"), ("no quota metric is known for tpu-v6e-slice "
     "flex, spot nodes: compute.v1's Quota.metric (its discovery document) names none for it")),
    (query(provisioning="flex,flex"), "distinct models"),
    (query(min_replicas="7"), "exceeds max_replicas"),
    (query(min_master_version="1.34"), "a full GKE version"),
    (query(apis="container.googleapis.com,../x"), "is not a service name"),
    (query(extra="x"), "unknown query key"),
])
def test_bad_input_is_one_line_exit_2(cloud, stdin, words) -> None:
    code, out, [line] = run(cloud["env"], stdin)
    assert (code, out) == (2, "") and words in line


def test_as_terraform_runs_it(cloud) -> None:
    """A bare environment, the module by name: what data.external.fleet_preflight runs."""
    cloud["usage"].enabled.discard("container.googleapis.com")
    done = subprocess.run(
        [sys.executable, "-m", "tpuserve.fleet_check", "preflight"], input=query(),
        cwd=REPO_ROOT, env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1",
                            **cloud["env"]},
        capture_output=True, text=True, timeout=120, check=False)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.splitlines() == [(
        f"tpuserve: API container.googleapis.com is not proven enabled in project '{PROJECT}' "
        f"(state DISABLED): enable it (gcloud services enable container.googleapis.com "
        f"--project {PROJECT}), then plan again")]


def test_a_running_cluster_is_held_to_its_own_version_not_the_channels(cloud) -> None:
    """min_master_version is read at create only: once the cluster is up, the channel may drop
    the floor itself; the running control plane is what must be at or above it."""
    cloud["container"].channels["REGULAR"] = ["1.35.1-gke.1000000"]
    assert run(cloud["env"], query())[0] == 1  # a new cluster could not be created at it
    cluster = cloud["container"].add_cluster(ZONE, "tpuserve-fleet")
    cluster.version = "1.35.1-gke.1000000"
    assert run(cloud["env"], query())[:3:2] == (0, [])
    cluster.version = "1.33.5-gke.1308000"
    code, _out, [line] = run(cloud["env"], query())
    assert code == 1
    assert "cluster tpuserve-fleet in us-west4-a runs GKE 1.33.5-gke.1308000, below" in line
    assert "gcloud container clusters upgrade tpuserve-fleet --master" in line


def test_a_denial_names_the_permission_the_answer_names(cloud) -> None:
    cloud["container"].denied.add("container.clusters.getServerConfig")
    code, _out, [line] = run(cloud["env"], query())
    assert code == 1
    assert "grant your account container.clusters.getServerConfig" in line


def test_one_deadline_bounds_every_call() -> None:
    apis = fleet_check.make_apis({"CLOUDSDK_AUTH_ACCESS_TOKEN": TOKEN})
    ends = {api.deadline for api in apis.values()}
    assert len(ends) == 1 and None not in ends
    [end] = ends
    import time

    assert 0 < end - time.monotonic() <= fleet_check.DEADLINE_S
    # A call cut there names this program's own bound: it has no --timeout to raise.
    hints = {api.deadline_hint for api in apis.values()}
    assert hints == {(f"{fleet_check.PROG} preflight ends every call within 90 s in all (its "
                      "overall deadline): try again once the API answers")}
