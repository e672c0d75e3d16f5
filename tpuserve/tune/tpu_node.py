"""The TuneNode of a deployed TPU VM, through the TPU API: a config is applied by writing the
boot script its settings render into the node's `startup-script` metadata (nodes.patch); the
node's watcher runs it, and its `reconverge` guest attribute says, for that script's sha256,
applied or failed (ops/reconverge.py); the boot phases come from the same guest attributes
(ops/boot_phases.py). No node is replaced and no capacity is lost.

Measuring is injected (the CLI runs the project's benchmark against the node's endpoint).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from tpuserve.ops.boot_phases import NAMESPACE, parse_boot
from tpuserve.ops.reconverge import FINAL_STATES, parse_reconverge
from tpuserve.ops_error import OpsError
from tpuserve.settings import Deployment
from tpuserve.settings.loader import deep_merge, from_raw
from tpuserve.tune.node import (
    BootRecord,
    CandidateFailed,
    Measurement,
    NodeGone,
    NodeUnproven,
    boot_record,
)
from tpuserve.tune.workload import Workload

# How a boot the tuner gave up waiting for begins: no word from the node's watcher (it may be
# dead or slow), so it proves nothing of the config (tune/record.py learns no refusal from it).
NO_WORD = "no applied or failed word"

SCRIPT_KEY = "startup-script"
# A boot is bounded: SPEC 4's cold boot took 857 s; the watcher retries a failed one.
BOOT_TIMEOUT_S = 3600.0
POLL_S = 15.0
# Between a healthy boot and the watcher's word (the script's cache publish, then the word):
# a fifteenth of the poll interval, 1 s on a real node (one guest-attribute read a second).
FAST_POLL_SHARE = 1 / 15
# The node states in which no boot will ever end (TPU API v2 Node.State).
_GONE = frozenset({"PREEMPTED", "TERMINATED", "DELETING", "STOPPING", "STOPPED", "HIDING",
                   "HIDDEN"})


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def overlaid(raw: Mapping[str, Any], stack: str, overlay: Mapping[str, Any]) -> Deployment:
    """The stack's deployment with OVERLAY over its [vllm], through the real loader."""
    table = deep_merge(raw.get("stacks", {}).get(stack, {}), {"vllm": dict(overlay)})
    return from_raw({**raw, "stacks": {stack: table}}).deployments[stack]


class TpuNode:
    def __init__(self, d: Deployment, raw: Mapping[str, Any], tpu: Any, *,
                 measure: Callable[[Workload, int], Measurement],
                 render: Callable[[Deployment], str] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 poll_s: float | None = None, boot_timeout_s: float | None = None,
                 time_scale: float = 1.0) -> None:
        if render is None:
            from tpuserve.render.boot_script import render_startup as render
        self.d, self.raw, self.tpu, self._measure = d, raw, tpu, measure
        self.render, self.clock, self.sleep = render, clock, sleep
        self.poll_s = POLL_S if poll_s is None else poll_s
        self.fast_poll_s = self.poll_s * FAST_POLL_SHARE
        self.boot_timeout_s = BOOT_TIMEOUT_S if boot_timeout_s is None else boot_timeout_s
        # Wall seconds per node second (TPUSERVE_TIME_SCALE on a simulated node, 1 on a real
        # one): a boot's phases are read back in node seconds, so the budget and the report
        # count a boot as the node's time, not the simulation's.
        self.time_scale = time_scale if time_scale > 0 else 1.0

    def terraform_script(self) -> str:
        """The script Terraform deployed: what the stack's own config renders."""
        return self.render(self.d)

    def check_deployed(self) -> None:
        """Refuse to start when the node's script is not the config's (an undeployed change,
        or another tuner's config left on it): the end could not restore what is not known."""
        try:
            meta = self._metadata()
        except NodeGone as exc:
            raise OpsError(f"{self.d.name}: {exc}", hint=f"deploy it (npx cdktf deploy "
                           f"{self.d.name}) before tuning") from None
        if meta.get(SCRIPT_KEY) != self.terraform_script():
            raise OpsError(
                f"{self.d.name}: node {self.d.node_name}'s startup-script is not the one this "
                f"config renders (sha256 {sha256(meta.get(SCRIPT_KEY, ''))[:12]} vs "
                f"{sha256(self.terraform_script())[:12]})",
                hint=f"deploy the config (npx cdktf deploy {self.d.name}) before tuning")

    def apply(self, overlay: Mapping[str, Any]) -> BootRecord:
        return self._run(self.render(overlaid(self.raw, self.d.name, overlay)))

    def restore(self) -> BootRecord:
        return self._run(self.terraform_script())

    def measure(self, workload: Workload, repetitions: int) -> Measurement:
        """The benchmark; when it fails, the TPU API says whose failure it was: the node's
        end (NodeGone, on proof only), the candidate's (CandidateFailed, the node READY), or
        unknown (NodeUnproven: recorded as neither)."""
        try:
            return self._measure(workload, repetitions)
        except CandidateFailed as exc:
            self._judge(f"the benchmark failed ({exc.reason})")
            raise

    def _verdict(self) -> tuple[str, str]:
        """("gone", why) on proof: nodes.get answers NOT_FOUND (TpuClient.get_node's None)
        or a state in which no boot will end; ("alive", "") for this node READY; otherwise
        ("unproven", why): a failed or unreadable answer, another node's, a node changing."""
        try:
            node = self.tpu.get_node(self.d)
        except Exception as exc:  # a 5xx past its retries, a timeout: proves nothing
            return "unproven", f"nodes.get failed: {type(exc).__name__}: {exc}"
        if node is None:
            return "gone", f"node {self.d.node_name} does not exist (NOT_FOUND)"
        if not str(node.name).endswith(f"/locations/{self.d.gcp.zone}/nodes/"
                                       f"{self.d.node_name}"):
            return "unproven", f"nodes.get answered for another node ({str(node.name)[:80]})"
        if node.state in _GONE:
            return "gone", f"node {self.d.node_name} is {node.state}"
        if node.state != "READY":
            return "unproven", f"node {self.d.node_name} is {node.state}"
        return "alive", ""

    def _judge(self, failure: str) -> None:
        """After FAILURE: NodeGone when the node is proven gone, NodeUnproven when its state
        is unknown; returns when the node is READY (the failure is the candidate's)."""
        verdict, why = self._verdict()
        if verdict == "gone":
            raise NodeGone(why)
        if verdict == "unproven":
            raise NodeUnproven(
                f"{failure}, and the TPU API did not prove node {self.d.node_name} there or "
                f"gone ({why}): not recorded as the candidate's failure",
                hint="the state is saved; run the same command again to resume (it first "
                     "returns the node to the last good config)")

    def _metadata(self) -> dict[str, str]:
        meta = self.tpu.node_metadata(self.d.node_path)
        if meta is None:
            raise NodeGone(f"node {self.d.node_name} does not exist")
        return meta

    def _run(self, script: str) -> BootRecord:
        want = sha256(script)
        meta = self._metadata()
        patched = meta.get(SCRIPT_KEY) != script
        if patched:
            try:
                self.tpu.update_node_metadata(self.d.node_path, {**meta, SCRIPT_KEY: script})
            except Exception as exc:  # a node being deleted refuses the patch
                self._judge(f"nodes.patch failed ({type(exc).__name__}: {exc})")
                raise
        start = next_check = self.clock()
        while True:
            attrs = self.tpu.guest_attributes(self.d, NAMESPACE)
            word = parse_reconverge(attrs)
            if not patched and (word is None or word.state == "watching"):
                # The script was already the node's and the watcher never ran one: the
                # node's own boot ran it, and its phases say how that boot ended.
                report = parse_boot(attrs)
                if report.state in ("ready", "failed"):
                    rec = self._in_node_seconds(boot_record(report))
                    if not rec.ok:
                        self._judge(f"the boot failed ({rec.error})")
                    return rec
            if word is not None and word.script_sha256 == want and word.state in FINAL_STATES:
                rec = self._in_node_seconds(boot_record(parse_boot(attrs)))
                if word.state == "applied" and rec.ok:
                    return rec
                why = word.why or rec.error or "failed"
                self._judge(f"the boot failed ({why})")  # a node at its end fails boots too
                return BootRecord(False, rec.boot_s, rec.compile_s, rec.cache_hit, why,
                                  rec.phases, rec.digest)
            now = self.clock()
            if now >= next_check:  # the node's state: once a poll interval, fast or not
                verdict, why = self._verdict()
                if verdict == "gone":
                    raise NodeGone(why)
                next_check = now + self.poll_s
            elapsed = now - start
            if elapsed >= self.boot_timeout_s:
                error = (f"{NO_WORD} for script sha256 {want[:12]} after "
                         f"{elapsed:.0f} s")
                self._judge(error)
                return BootRecord(False, elapsed / self.time_scale, error=error)
            # Once this script's boot is healthy only its tail is left (the cache publish,
            # then the watcher's word, seconds): a full poll interval (15 s on a real node)
            # would be node time wasted, so the word is looked for every FAST_POLL_S.
            running = word is not None and word.script_sha256 == want and \
                word.state in ("changed", "retrying")
            gap = self.fast_poll_s if running and parse_boot(attrs).state == "ready" \
                else self.poll_s
            self.sleep(min(gap, self.boot_timeout_s - elapsed))

    def _in_node_seconds(self, rec: BootRecord) -> BootRecord:
        if self.time_scale == 1.0:
            return rec
        return replace(rec, boot_s=rec.boot_s / self.time_scale,
                       compile_s=None if rec.compile_s is None
                       else rec.compile_s / self.time_scale)
