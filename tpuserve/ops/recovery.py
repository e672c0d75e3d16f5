"""`recover`: bring a lost stack back by deleting what is dead and re-running its deployment.

Terraform stays the one engine that creates infrastructure: recovery only deletes (a PREEMPTED
or TERMINATED spot node through the TPU API; a SUSPENDED or FAILED flex queued resource with
force) and then runs the stack's own deployment (`npx cdktf deploy STACK --auto-approve`), which
recreates it.
Bounded retries with backoff; every step is logged through a callback.

Spot and on-demand nodes: recovery then re-arms the billing guard (a Cloud Tasks task at the
node's createTime + max_run_hours, tpuserve.gcp.billing_guard), and a healthy node's guard is
re-armed too. Arming is idempotent: an armed node keeps its one task.

Ctrl-C: a deletion already requested completes on Google's side; a running deployment gets
SIGINT forwarded and is waited for, so Terraform stops gracefully and saves its state instead
of dying mid-apply with a locked state.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tpuserve import kinds
from tpuserve.bounded_call import client_deadline
from tpuserve.gcp.errors import ApiError
from tpuserve.gcp.tpu.nodes import NodeView
from tpuserve.gcp.tpu.queued_resources import (
    ALIVE_STATES,
    QueuedResource,
    QueuedResourceError,
    QueuedResourceRef,
    ref_for,
)
from tpuserve.paths import REPO_ROOT
from tpuserve.settings import Deployment

from .errors import EXIT_INTERRUPTED, OpsError
from .stack_status import RECOVERABLE_NODE_STATES, RECOVERABLE_QR_STATES

DEPLOY_COMMAND_ENV = "TPUSERVE_DEPLOY_COMMAND"  # e.g. "make deploy STACK={stack}"
DEFAULT_DEPLOY_COMMAND = "npx cdktf deploy {stack} --auto-approve"
DEFAULT_RETRIES = 3
DELETE_TIMEOUT_S = 1800.0  # SPEC 2: a PROVISIONING QR cannot be deleted until it finishes
BACKOFF_S = (30.0, 120.0, 300.0)
# Secrets of this process that a deployment never needs (rules: no secret in a child's env).
CHILD_ENV_DROP = ("OPENAI_API_KEY",)

Log = Callable[[str], None]
Deploy = Callable[[str, Log], int]


class GuardOps(Protocol):
    def arm(self, d: Deployment) -> str | None: ...


class TpuOps(Protocol):
    """What recovery calls of the TPU client (tpuserve.gcp.tpu.client.TpuClient)."""

    def get_node(self, d: Deployment) -> NodeView | None: ...
    def delete_node(self, d: Deployment) -> bool: ...
    def get_queued_resource(self, ref: QueuedResourceRef) -> QueuedResource | None: ...
    def delete_queued_resource(self, ref: QueuedResourceRef, *, force: bool = ...,
                               timeout: float = ..., on_progress: Any = ...) -> bool: ...


@dataclass
class RecoveryResult:
    stack: str
    action: str  # "none" (nothing to recover) or "recovered"
    reason: str
    attempts: int = 0
    log: list[str] = field(default_factory=list)
    guard: str | None = None  # the billing guard's state after recovery (spot, on-demand)

    def to_json(self) -> dict[str, object]:
        return {"stack": self.stack, "action": self.action, "reason": self.reason,
                "attempts": self.attempts, "log": self.log, "guard": self.guard}


def deploy_argv(stack: str, environ: Mapping[str, str] | None = None) -> list[str]:
    env = os.environ if environ is None else environ
    template = env.get(DEPLOY_COMMAND_ENV) or DEFAULT_DEPLOY_COMMAND
    return [part.replace("{stack}", stack) for part in shlex.split(template)]


def run_deploy(stack: str, log: Log, *, environ: Mapping[str, str] | None = None,
               cwd: str | os.PathLike[str] = REPO_ROOT) -> int:
    """Run the stack's deployment, logging its output line by line; its exit code.

    The child runs in its own process group, so a terminal Ctrl-C reaches only us; we forward
    one SIGINT and wait, which is how Terraform wants to be interrupted."""
    env = dict(os.environ if environ is None else environ)
    for name in CHILD_ENV_DROP:
        env.pop(name, None)
    argv = deploy_argv(stack, env)
    log(f"running: {shlex.join(argv)}")
    try:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, errors="replace", start_new_session=True,
        )
    except OSError as exc:
        raise OpsError(
            f"cannot run the deployment {argv[0]!r}: {exc.strerror or exc}",
            hint=f"install it, or set {DEPLOY_COMMAND_ENV} to the command that deploys a stack",
        ) from None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            log("  " + line.rstrip())
        return proc.wait()
    except KeyboardInterrupt:
        log("interrupted: asking the deployment to stop gracefully (waiting for it)")
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait()
        except KeyboardInterrupt:
            log("second interrupt: leaving the deployment running in the background; run "
                f"`tpuserve recover {stack}` again once it has finished")
        raise OpsError(
            f"recover {stack}: interrupted during the deployment",
            hint=f"check `tpuserve status {stack}`; re-run `tpuserve recover {stack}`",
            exit_code=EXIT_INTERRUPTED,
        ) from None


def _diagnose(d: Deployment, tpu: TpuOps) -> tuple[bool, str]:
    """(needs recovery, why) from the live state."""
    return _capacity(d).diagnose(d, tpu)


def _diagnose_queued(d: Deployment, tpu: TpuOps) -> tuple[bool, str]:
    qr = tpu.get_queued_resource(ref_for(d))
    if qr is None:
        return False, (
            f"no queued resource: nothing to recover (deploy it: npx cdktf deploy {d.name})"
        )
    if qr.state in RECOVERABLE_QR_STATES:
        why = f" ({qr.failure})" if qr.failure else ""
        return True, f"queued resource {qr.state}{why}"
    return False, f"queued resource {qr.state}"


def _diagnose_node(d: Deployment, tpu: TpuOps) -> tuple[bool, str]:
    node = tpu.get_node(d)
    if node is None:
        return False, (
            "no node: nothing to recover (the billing guard may have deleted it; deploy it: "
            f"npx cdktf deploy {d.name})"
        )
    if node.state in RECOVERABLE_NODE_STATES:
        return True, f"node {node.state}"
    return False, f"node {node.state}"


def recover(
    d: Deployment,
    *,
    tpu: TpuOps,
    deploy: Deploy = run_deploy,
    retries: int = DEFAULT_RETRIES,
    delete_timeout_s: float = DELETE_TIMEOUT_S,
    poll_s: float = 10.0,
    backoff_s: Sequence[float] = BACKOFF_S,
    log: Log = lambda _m: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    guard: GuardOps | None = None,
) -> RecoveryResult:
    """Recover one stack if it needs it, then re-arm its billing guard (when `guard` is given
    and the node exists). Raises OpsError when every attempt failed or the guard cannot be
    armed."""
    if retries < 1:
        raise OpsError(f"--retries = {retries}: must be >= 1")
    result = RecoveryResult(d.name, "none", "")

    def say(msg: str) -> None:
        result.log.append(msg)
        log(msg)

    needed, why = _diagnose(d, tpu)
    if not needed:
        result.reason = why
        say(f"{d.name}: {why}")
        if guard is not None and d.kind.billing_guard and (
            tpu.get_node(d) is not None
        ):
            _rearm(d, guard, result, say)
        return result
    result.reason = why
    say(f"{d.name}: {why}: replacing it")
    last_error = ""
    for attempt in range(1, retries + 1):
        result.attempts = attempt
        say(f"{d.name}: attempt {attempt}/{retries}")
        try:
            _delete_dead(d, tpu, delete_timeout_s, poll_s, say, clock, sleep)
            rc = deploy(d.name, say)
            if rc != 0:
                raise OpsError(f"the deployment exited with status {rc}")
            still, state = _diagnose(d, tpu)
            if still or not _alive(d, tpu):
                raise OpsError(f"after the deployment the stack is still not alive ({state})")
        except (OpsError, ApiError, QueuedResourceError) as exc:
            if isinstance(exc, OpsError) and exc.exit_code == EXIT_INTERRUPTED:
                raise
            last_error = str(exc)
            say(f"{d.name}: attempt {attempt} failed: {last_error}")
            if attempt < retries:
                pause = backoff_s[min(attempt - 1, len(backoff_s) - 1)] if backoff_s else 0.0
                say(f"{d.name}: retrying in {pause:.0f} s")
                sleep(pause)
            continue
        result.action = "recovered"
        say(f"{d.name}: recovered ({state}); wait for the server with `tpuserve wait {d.name}`")
        if guard is not None:
            _rearm(d, guard, result, say)
        return result
    raise OpsError(
        f"recover {d.name}: {retries} attempt(s) failed; last: {last_error}",
        hint=f"look at `tpuserve status {d.name}` and run npx cdktf deploy {d.name} by hand",
    )


def _rearm(d: Deployment, guard: GuardOps, result: RecoveryResult, say: Log) -> None:
    from tpuserve.gcp.billing_guard import GuardError  # lazy: flex-only users never load it

    try:
        result.guard = guard.arm(d)
    except (ApiError, GuardError) as exc:
        raise OpsError(
            f"recover {d.name}: the node runs WITHOUT its billing guard: {exc}",
            hint=f"re-run `tpuserve recover {d.name}`, or delete the node yourself when done",
        ) from None
    if result.guard is not None:
        say(f"{d.name}: {result.guard}")


def _alive(d: Deployment, tpu: TpuOps) -> bool:
    return _capacity(d).alive(d, tpu)


def _alive_queued(d: Deployment, tpu: TpuOps) -> bool:
    qr = tpu.get_queued_resource(ref_for(d))
    return qr is not None and qr.state in ALIVE_STATES


def _alive_node(d: Deployment, tpu: TpuOps) -> bool:
    node = tpu.get_node(d)
    return node is not None and node.state not in RECOVERABLE_NODE_STATES


def _delete_dead(
    d: Deployment, tpu: TpuOps, timeout_s: float, poll_s: float,
    say: Log, clock: Callable[[], float], sleep: Callable[[float], None],
) -> None:
    _capacity(d).delete_dead(d, tpu, timeout_s, poll_s, say, clock, sleep)


def _delete_queued(
    d: Deployment, tpu: TpuOps, timeout_s: float, poll_s: float,
    say: Log, clock: Callable[[], float], sleep: Callable[[float], None],
) -> None:
    ref = ref_for(d)
    say(f"{d.name}: deleting queued resource {ref.name} (force: its node first)")
    tpu.delete_queued_resource(ref, force=True, timeout=timeout_s)
    say(f"{d.name}: queued resource deleted")


def _delete_node(
    d: Deployment, tpu: TpuOps, timeout_s: float, poll_s: float,
    say: Log, clock: Callable[[], float], sleep: Callable[[float], None],
) -> None:
    node = tpu.get_node(d)
    if node is None or node.state not in RECOVERABLE_NODE_STATES:
        return  # gone already (an earlier attempt) or replaced meanwhile
    say(f"{d.name}: deleting node {d.node_name} ({node.state})")
    start = clock()
    with client_deadline(tpu, timeout_s):  # every call of the delete ends with its timeout
        tpu.delete_node(d)
        while tpu.get_node(d) is not None:
            if clock() - start >= timeout_s:
                raise OpsError(f"node {d.node_name} still exists {timeout_s:.0f} s after its "
                               "delete")
            sleep(poll_s)
    say(f"{d.name}: node deleted")


@dataclass(frozen=True)
class Capacity:
    """How one shape of a kind's TPU capacity is found dead, deleted and seen alive."""

    diagnose: Callable[[Deployment, TpuOps], tuple[bool, str]]
    alive: Callable[[Deployment, TpuOps], bool]
    delete_dead: Callable[[Deployment, TpuOps, float, float, Log, Callable[[], float],
                           Callable[[float], None]], None]


# A TPU VM node (spot, on-demand), and a flex-start queued resource deleted with its node.
NODE = Capacity(_diagnose_node, _alive_node, _delete_node)
QUEUED_RESOURCE = Capacity(_diagnose_queued, _alive_queued, _delete_queued)


# Each shape of capacity (tpuserve/kinds CAPACITIES) `recover` can replace; GKE replaces a
# fleet's own (tpuserve/cli/recover.py refuses it).
BY_CAPACITY: dict[str, Capacity] = {kinds.TPU_VM: NODE, kinds.QUEUED_RESOURCE: QUEUED_RESOURCE}


def _capacity(d: Deployment) -> Capacity:
    """The kind's capacity (tpuserve/kinds): a queued resource, or a node."""
    return BY_CAPACITY[d.kind.capacity]
