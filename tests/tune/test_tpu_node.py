"""The TPU-API TuneNode against the fake TPU API: a config is applied by a nodes.patch of the
startup-script metadata (the script its settings render), its boot read from the watcher's
`reconverge` word for that script's sha256 and the boot phases; a failed word, a node that
went away and a watcher that never answers each end the wait."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.tpu_api import FakeTpuApi
from tests.gcp.tpu_support import Clock
from tpuserve.gcp.tpu.client import TpuClient
from tpuserve.ops_error import OpsError
from tpuserve.render.boot_script import render_startup
from tpuserve.settings.loader import from_raw, load_raw
from tpuserve.tune.node import Measurement, NodeGone
from tpuserve.tune.tpu_node import TpuNode

PROJECT, ZONE = "proj-test-1", "us-west4-a"
PHASES = {
    "boot": "2030-01-01T10:00:00Z started",
    "cache": "2030-01-01T10:00:02Z {cache} object_bytes=1 files=2 bytes=3",
    "container": "2030-01-01T10:01:05Z started",
    "kv_cache": "2030-01-01T10:01:40Z blocks=5021",
    "startup_complete": "2030-01-01T10:12:45Z seen",
    "health": "2030-01-01T10:12:46Z ok",
    "state": "2030-01-01T10:12:46Z ready",
}


@pytest.fixture
def api() -> Iterator[FakeTpuApi]:
    with FakeTpuApi() as server:
        yield server


@pytest.fixture
def env(api: FakeTpuApi) -> dict[str, Any]:
    raw = load_raw(environ={"TPUSERVE_PROJECT": PROJECT, "TPUSERVE_ZONE": ZONE})
    d = from_raw(raw).deployments["spot"]
    api.seed_node(PROJECT, ZONE, d.node_name, spec={
        "acceleratorType": "v5litepod-1", "runtimeVersion": "v2-alpha-tpuv5-lite",
        "networkConfig": {"network": "default", "enableExternalIps": True},
        "metadata": {"startup-script": render_startup(d), "enable-oslogin": "TRUE"}})
    clock = Clock()
    tpu = TpuClient(environ=api.environ(), clock=clock, sleep=clock.sleep, poll_interval=5.0)
    node = TpuNode(d, raw, tpu, measure=lambda w, r: Measurement((), 0.0), clock=clock,
                   sleep=clock.sleep, poll_s=15.0, boot_timeout_s=900.0)
    return {"d": d, "node": node, "clock": clock}


def _script(api: FakeTpuApi, d: Any) -> str:
    return api.nodes[d.node_path].spec["metadata"]["startup-script"]


def _watcher(api: FakeTpuApi, d: Any, *, word: str = "applied", cache: str = "hit") -> None:
    """What the node's watcher writes once the patched script's boot ends."""
    def boot() -> None:
        sha = hashlib.sha256(_script(api, d).encode()).hexdigest()
        for key, value in PHASES.items():
            api.set_guest_attribute(d.node_name, key, value.format(cache=cache))
        tail = "" if word == "applied" else \
            " not ready after 4 attempts: RuntimeProgramAllocationFailure"
        api.set_guest_attribute(d.node_name, "reconverge",
                                f"2030-01-01T10:12:47Z {word} sha256={sha}{tail}")
        if word == "failed":
            api.set_guest_attribute(d.node_name, "state", "2030-01-01T10:11:31Z failed oom")
    api.on_next_patch_applied(boot)


def test_apply_patches_the_rendered_script_and_reads_the_boot(api: FakeTpuApi,
                                                              env: dict[str, Any]) -> None:
    d, node = env["d"], env["node"]
    terraform = _script(api, d)
    node.check_deployed()  # the node runs what the config renders
    _watcher(api, d, cache="miss")
    rec = node.apply({"max_num_batched_tokens": 8192, "env": {"NUM_PRECOMPILE_WORKERS": 4}})
    assert rec.ok and rec.boot_s == 766 and rec.compile_s == 665 and rec.cache_hit is False
    script = _script(api, d)
    assert "--max-num-batched-tokens 8192" in script and "NUM_PRECOMPILE_WORKERS=4" in script
    [patch] = api.calls("PATCH")
    assert patch.query["updateMask"] == "metadata"
    assert patch.body["metadata"]["enable-oslogin"] == "TRUE"  # the rest of the map kept
    with pytest.raises(OpsError, match="npx cdktf deploy spot"):
        node.check_deployed()
    _watcher(api, d)
    assert node.restore().cache_hit is True
    assert _script(api, d) == terraform


def test_a_failed_word_is_a_failed_boot(api: FakeTpuApi, env: dict[str, Any]) -> None:
    _watcher(api, env["d"], word="failed")
    rec = env["node"].apply({"gpu_memory_utilization": 0.93,
                             "allow_untested_gpu_memory_utilization": True})
    assert not rec.ok and "RuntimeProgramAllocationFailure" in (rec.error or "")


def test_a_word_for_another_script_is_not_taken(api: FakeTpuApi, env: dict[str, Any]) -> None:
    d = env["d"]
    api.set_guest_attribute(d.node_name, "reconverge",
                            "2030-01-01T10:00:00Z applied sha256=" + "0" * 64)
    rec = env["node"].apply({"max_num_batched_tokens": 8192})
    assert not rec.ok and "no applied or failed word" in (rec.error or "")
    assert env["clock"].now >= 900


def test_a_node_that_went_away(api: FakeTpuApi, env: dict[str, Any]) -> None:
    d = env["d"]
    api.on_next_patch_applied(lambda: api.set_node_state(d.node_name, "PREEMPTED"))
    with pytest.raises(NodeGone, match="PREEMPTED"):
        env["node"].apply({"max_num_batched_tokens": 8192})
    assert json.dumps(api.node_json(d.node_name))  # still readable, just not serving


def test_restore_of_the_script_already_there_reads_the_nodes_own_boot(
        api: FakeTpuApi, env: dict[str, Any]) -> None:
    d = env["d"]
    for key, value in PHASES.items():  # booted at creation; the watcher only watches
        api.set_guest_attribute(d.node_name, key, value.format(cache="hit"))
    api.set_guest_attribute(d.node_name, "reconverge", "2030-01-01T10:12:50Z watching etag=1")
    rec = env["node"].restore()
    assert rec.ok and rec.cache_hit is True and not api.calls("PATCH")
    api.set_guest_attribute(d.node_name, "state", "2030-01-01T10:12:46Z booting")
    rec = env["node"].restore()  # still booting: waits, then gives up at the deadline
    assert not rec.ok and env["clock"].now >= 900
