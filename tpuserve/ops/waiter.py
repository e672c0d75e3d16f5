"""`wait`: block until a stack's server answers, phase by phase, within one overall timeout.

Phases: queued resource ACTIVE (flex only) -> node READY -> boot (guest attributes, until the
boot script reports `ready`) -> GET /health answers 200. A dead end fails at once with its
reason: a FAILED/SUSPENDED queued resource, a PREEMPTED (or otherwise lost) node, a boot
failure the boot script recorded. Clock and sleep are injectable; nothing here prints.

The timeout bounds every call beneath it: the TPU client's calls run under it
(each try, its retries), and so does /health when the caller's client has the same deadline
(tpuserve wait). A TPU read that fails transiently or is cut by the timeout is not a verdict:
the wait polls again, and at the timeout exits 3 naming the phase and the last thing seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import httpx

from tpuserve import kinds
from tpuserve.bounded_call import client_deadline
from tpuserve.gcp.errors import ApiError
from tpuserve.gcp.retry import DEFAULT_POLICY
from tpuserve.gcp.tpu.queued_resources import (
    ALIVE_STATES,
    KNOWN_STATES,
    MISSING,
    UNREADABLE,
    ref_for,
)
from tpuserve.settings import Deployment

from . import server, tls
from .boot_phases import NAMESPACE, parse_boot
from .errors import EXIT_TIMEOUT, OpsError
from .stack_status import LOST_NODE_STATES, TpuSource

PHASE_QR = "queued resource"
PHASE_NODE = "node"
PHASE_BOOT = "boot"
PHASE_HEALTH = "health"
# SPEC 4: a cold boot takes facts.COLD_START_S (~14 min); flex capacity may queue before that.
DEFAULT_TIMEOUT_S = 3600.0
DEFAULT_POLL_S = 10.0
# A missing node right after its QR went ACTIVE is normal for a moment; for this long.
NODE_APPEAR_GRACE_S = 120.0
T = TypeVar("T")


@dataclass(frozen=True)
class WaitEvent:
    phase: str
    state: str  # what the phase reports now (a QR state, a node state, a boot phase, ...)
    elapsed_s: float
    done: bool = False  # the phase just completed


@dataclass
class WaitResult:
    stack: str
    endpoint: str
    external_ip: str
    elapsed_s: float
    phases: dict[str, float] = field(default_factory=dict)  # phase -> seconds when it completed
    tls_sha256: str | None = None  # the pinned certificate's fingerprint (https only)

    def to_json(self) -> dict[str, object]:
        return {
            "stack": self.stack,
            "ready": True,
            "endpoint": self.endpoint,
            "external_ip": self.external_ip,
            "elapsed_s": round(self.elapsed_s, 1),
            "phases": {k: round(v, 1) for k, v in self.phases.items()},
            "tls_sha256": self.tls_sha256,
        }


class WaitFailed(OpsError):
    """A dead end; `phase` says where."""

    def __init__(self, phase: str, message: str, hint: str = "", exit_code: int = 1) -> None:
        self.phase = phase
        super().__init__(message, hint=hint, exit_code=exit_code)


class _Unreadable(Exception):
    """A TPU read failed transiently after its retries (or was cut by the deadline): not a
    verdict, the wait polls again until its timeout."""


def _read(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except ApiError as exc:
        if not DEFAULT_POLICY.is_transient(exc.code):
            raise
        raise _Unreadable(f"{UNREADABLE} ({exc.code} {exc.status}: {exc.message})") from None


# The phases each shape of capacity (tpuserve/kinds CAPACITIES) passes through, in order; the
# fleet's wait is tpuserve/ops/fleet_wait.py's.
PHASES: dict[str, tuple[str, ...]] = {
    kinds.TPU_VM: (PHASE_NODE, PHASE_BOOT, PHASE_HEALTH),
    kinds.QUEUED_RESOURCE: (PHASE_QR, PHASE_NODE, PHASE_BOOT, PHASE_HEALTH),
}


def phases_of(d: Deployment) -> tuple[str, ...]:
    """The phases the stack's kind passes through, in order (tpuserve/kinds)."""
    return PHASES[d.kind.capacity]


def wait_for_stack(
    d: Deployment,
    *,
    tpu: TpuSource,
    http: httpx.Client,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    poll_s: float = DEFAULT_POLL_S,
    on_event: Callable[[WaitEvent], None] = lambda _e: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> WaitResult:
    name = d.name
    flex = d.kind.queued_resource  # its node comes from a queued resource: one phase more
    phases = phases_of(d)
    start = clock()
    done: dict[str, float] = {}
    last: dict[str, str] = {}
    node_missing_since: float | None = None

    def report(phase: str, state: str, finished: bool = False) -> None:
        elapsed = clock() - start
        if finished and phase not in done:
            done[phase] = elapsed
            on_event(WaitEvent(phase, state, elapsed, True))
        elif last.get(phase) != state and phase not in done:
            on_event(WaitEvent(phase, state, elapsed))
        last[phase] = state

    def current_phase() -> str:
        for phase in phases:
            if phase not in done:
                return phase
        return PHASE_HEALTH

    def check_time() -> None:
        elapsed = clock() - start
        if elapsed >= timeout_s:
            phase = current_phase()
            raise WaitFailed(
                phase,
                f"{name}: timed out after {elapsed:.0f} s waiting for {phase} "
                f"(last: {last.get(phase, 'nothing yet')})",
                hint=f"wait longer (--timeout) or look at `tpuserve status {name}`",
                exit_code=EXIT_TIMEOUT,
            )

    def poll_once() -> WaitResult | None:
        """One look at every phase: the result once /health answers, else None."""
        nonlocal node_missing_since
        # 1. queued resource (flex)
        if flex:
            qr = _read(lambda: tpu.get_queued_resource(ref_for(d)))
            state = qr.state if qr else MISSING
            if qr is None:
                raise WaitFailed(
                    PHASE_QR, f"{name}: no queued resource {ref_for(d).name}",
                    hint=f"deploy it first: npx cdktf deploy {name}",
                )
            if state not in KNOWN_STATES:  # STATE_UNSPECIFIED: unknown, not dead: keep polling
                state = f"UNKNOWN ({state})"
            elif state not in ALIVE_STATES:
                why = f": {qr.failure}" if qr.failure else ""
                raise WaitFailed(
                    PHASE_QR, f"{name}: queued resource is {state}{why}",
                    hint=f"`tpuserve recover {name}` replaces it (or npx cdktf deploy {name})",
                )
            report(PHASE_QR, state, finished=state == "ACTIVE")
        # 2. node
        node = None
        if not flex or PHASE_QR in done:
            node = _read(lambda: tpu.get_node(d))
            if node is None:
                node_missing_since = node_missing_since if node_missing_since else clock()
                if not flex or clock() - node_missing_since > NODE_APPEAR_GRACE_S:
                    raise WaitFailed(
                        PHASE_NODE, f"{name}: node {d.node_name} does not exist in "
                        f"{d.gcp.project}/{d.gcp.zone}",
                        hint=f"deploy it: npx cdktf deploy {name}",
                    )
                report(PHASE_NODE, "not created yet")
            else:
                node_missing_since = None
                if node.state in LOST_NODE_STATES:
                    raise WaitFailed(
                        PHASE_NODE, f"{name}: node {d.node_name} is {node.state}",
                        hint=(f"`tpuserve recover {name}` deletes it and redeploys"
                              if node.state == "PREEMPTED"
                              else f"redeploy: npx cdktf deploy {name}"),
                    )
                report(PHASE_NODE, node.state, finished=node.state == "READY")
        # 3. boot phases, 4. health
        if node is not None and node.state == "READY":
            attrs = _read(lambda: tpu.guest_attributes(d, NAMESPACE))
            boot = parse_boot(attrs)
            if boot.state == "failed":
                raise WaitFailed(
                    PHASE_BOOT, f"{name}: boot failed: {boot.reason or 'no reason recorded'}",
                    hint=f"`tpuserve status {name}` shows every phase (the full log is on the "
                    f"node's serial console); fix the cause, then npx cdktf deploy {name}",
                )
            step = boot.last.label if boot.last else "no boot phase recorded yet"
            if boot.state == "waiting":
                step = f"waiting {boot.reason}"
            elif boot.state == "ready":
                step = "ready"
            report(PHASE_BOOT, step, finished=boot.state == "ready")
            if node.external_ip:
                try:
                    target = tls.stack_target(d, node.external_ip, attrs)
                except OpsError as exc:
                    # The TLS certificate comes with the boot's secrets step: keep waiting.
                    target, detail = None, exc.message
                ok = False
                if target is not None:
                    ok, detail = server.health(http, target)
                if ok and target is not None:
                    # A boot script without guest attributes: /health is the only signal.
                    report(PHASE_BOOT, "ready", finished=True)
                    report(PHASE_HEALTH, "ok", finished=True)
                    return WaitResult(name, target.base_url, node.external_ip,
                                      clock() - start, done,
                                      target.pin.fingerprint if target.pin else None)
                report(PHASE_HEALTH, detail)
            else:
                raise WaitFailed(
                    PHASE_NODE, f"{name}: node {d.node_name} is READY without an external IP",
                    hint="the node must be created with enableExternalIps (see the stack)",
                )
        return None

    with client_deadline(tpu, timeout_s):  # each TPU call, retries included
        while True:
            try:
                result = poll_once()
            except _Unreadable as exc:  # the API did not answer: poll again until timeout
                report(current_phase(), str(exc))
            else:
                if result is not None:
                    return result
            check_time()
            sleep(min(poll_s, max(0.0, timeout_s - (clock() - start))))
            check_time()  # no time left for another read: its calls could not even start
