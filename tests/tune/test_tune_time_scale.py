"""A node booting TPUSERVE_TIME_SCALE times faster (the simulated server): the CLI's TpuNode polls
in proportion (main polled the patch operation every 5 s and the watcher's word every 15 s,
more than a whole simulated candidate) and reads a boot back in node seconds, so the budget
counts a boot as the node's time."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
from typing import Any

import pytest

from tpuserve.cli import tune as cli_tune
from tpuserve.settings.loader import from_raw, load_raw
from tpuserve.tune.tpu_node import TpuNode
from tpuserve.tune.workload import Workload

PHASES = {
    "boot": "2030-01-01T10:00:00Z started",
    "cache": "2030-01-01T10:00:02Z miss no object",
    "kv_cache": "2030-01-01T10:00:01Z blocks=5021",
    "startup_complete": "2030-01-01T10:00:03Z seen",
    "health": "2030-01-01T10:00:04Z ok",
    "state": "2030-01-01T10:00:04Z ready",
}


class Api:
    """The TPU API as TpuNode calls it: the patch lands, the watcher's word follows."""

    def __init__(self, script: str) -> None:
        self.meta = {"startup-script": script}
        self.attrs: dict[str, str] = {}
        self.poll_interval = 5.0

    def node_metadata(self, _path: str) -> dict[str, str]:
        return dict(self.meta)

    def update_node_metadata(self, _path: str, meta: dict[str, str]) -> None:
        self.meta = dict(meta)
        sha = hashlib.sha256(meta["startup-script"].encode()).hexdigest()
        self.attrs = {**PHASES, "reconverge": f"2030-01-01T10:00:05Z applied sha256={sha}"}

    def guest_attributes(self, _d: Any, _ns: str) -> dict[str, str]:
        return dict(self.attrs)

    def get_node(self, _d: Any) -> Any:
        return SimpleNamespace(state="READY")


def _flex() -> tuple[Any, dict[str, Any]]:
    raw = load_raw(environ={})
    return from_raw(raw).deployments["flex"], raw


def test_a_boot_is_read_back_in_node_seconds() -> None:
    d, raw = _flex()
    api = Api("old")
    node = TpuNode(d, raw, api, measure=lambda w, r: None,  # type: ignore[arg-type, return-value]
                   render=lambda dep: f"script {dep.vllm.max_num_batched_tokens}",
                   time_scale=0.01, poll_s=0)
    rec = node.apply({"max_num_batched_tokens": 8192})
    assert rec.ok
    # 4 s from `boot` to `health`, 2 s of compile, on a node 100x faster: 400 and 200 s.
    assert rec.boot_s == pytest.approx(400.0)
    assert rec.compile_s == pytest.approx(200.0)


def test_the_clis_node_polls_in_proportion_to_the_time_scale(
        monkeypatch: pytest.MonkeyPatch) -> None:
    d, raw = _flex()
    api = Api("x")
    monkeypatch.setattr(cli_tune.common, "tpu_api", lambda: api)
    monkeypatch.setenv("TPUSERVE_TIME_SCALE", "0.002")
    node = cli_tune.node_for(d, raw, Workload((64,), (1,)), "key")
    assert node.poll_s == pytest.approx(cli_tune.MIN_POLL_S)  # 15 s x 0.002, floored
    assert api.poll_interval == pytest.approx(cli_tune.MIN_POLL_S)  # 5 s x 0.002, floored
    assert node.time_scale == 0.002
    assert node.boot_timeout_s == cli_tune.MIN_BOOT_TIMEOUT_S
    # A real node (no scale): the measured-boot figures and the 15 s / 5 s polls stay.
    monkeypatch.delenv("TPUSERVE_TIME_SCALE")
    api.poll_interval = 5.0
    node = cli_tune.node_for(d, raw, Workload((64,), (1,)), "key")
    assert (node.poll_s, api.poll_interval, node.time_scale) == (15.0, 5.0, 1.0)
