"""How the TPU client waits on a queued resource: one loop that reads the QR every poll
interval, reports its state and follows an operation, until a verdict, the wait's timeout or the
command's deadline (the QueuedResource half of tpuserve.gcp.tpu.client.TpuClient, as NodeCalls
is its node half). A read whose transient errors outlasted their retries is UNREADABLE, not a
verdict: the loop polls again.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from tpuserve.gcp.errors import ApiError
from tpuserve.gcp.retry import RetryPolicy
from tpuserve.gcp.tpu.queued_resources import (
    API_VERSION,
    DEAD_STATES,
    MISSING,
    QR_PROG,
    UNREADABLE,
    Progress,
    QueuedResource,
    QueuedResourceError,
    QueuedResourceRef,
    WaitTimeout,
    dead_message,
)

Settled = Callable[[QueuedResource | None, str, Mapping[str, Any]], bool]
"""A wait's verdict on one read (QR or None, its state, the operation): True ends the wait;
raising ends it with that error; False polls again."""


def no_progress(state: str, elapsed: float) -> None:
    return None


def failed_op(op: Mapping[str, Any], action: str) -> ApiError | None:
    if op.get("done") and isinstance(op.get("error"), dict):
        return ApiError.from_status(op["error"], action=action, service="tpu")
    return None


class QueuedResourceWaits:
    """The wait loop of TpuClient (a GoogleApi with get_queued_resource)."""

    policy: RetryPolicy
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    poll_interval: float
    get_queued_resource: Callable[[QueuedResourceRef], QueuedResource | None]
    request: Callable[..., Any]
    call_budget: Callable[[], float]

    def _poll(self, ref: QueuedResourceRef) -> tuple[QueuedResource | None, str]:
        """One read of the QR for a wait loop: (QR or None, state). A read whose transient
        errors outlasted their retries is UNREADABLE, not a verdict: the loop polls again."""
        try:
            qr = self.get_queued_resource(ref)
        except ApiError as exc:
            if not self.policy.is_transient(exc.code):
                raise
            return None, f"{UNREADABLE} ({exc.code} {exc.status})"
        return qr, qr.state if qr else MISSING

    def _out_of_time(self, start: float, timeout: float) -> bool:
        """No time left for another read: the wait's own timeout is spent, or the command's
        deadline is nearer than a retry may start (RetryPolicy.min_try_s): a read begun now
        would be cut, and its cut would hide what the last read said."""
        return self.clock() - start >= timeout or self.call_budget() <= self.policy.min_try_s

    def _pause(self, elapsed: float, timeout: float) -> None:
        """One poll interval, never past the timeout."""
        self.sleep(min(self.poll_interval, max(0.0, timeout - elapsed)))

    def _poll_until(
        self, ref: QueuedResourceRef, settled: Settled, *, timeout: float,
        progress: Progress, operation: Mapping[str, Any],
        timed_out: Callable[[str, float], Exception],
        before_read: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> QueuedResource | None:
        """The one wait loop: read the QR every poll interval and report its state until
        `settled` says so, following `operation` (e.g. the create's) meanwhile.

        `before_read` may end the wait on the operation alone, before the next read (a create
        whose operation failed need not look); otherwise `settled` judges the operation after
        the read (a delete: a QR that is gone is gone, whatever its operation says).
        """
        start = self.clock()
        op = dict(operation)
        while True:
            if before_read is not None:
                before_read(op)
            qr, state = self._poll(ref)
            elapsed = self.clock() - start
            progress(state, elapsed)
            if settled(qr, state, op):
                return qr
            if elapsed >= timeout:
                raise timed_out(state, elapsed)
            self._pause(elapsed, timeout)
            if self._out_of_time(start, timeout):
                raise timed_out(state, self.clock() - start)
            if op.get("name") and not op.get("done"):
                op = self._poll_operation(op)

    def _poll_operation(self, op: Mapping[str, Any]) -> dict[str, Any]:
        """The operation's next state; the last one known while reads fail transiently."""
        try:
            return self.get_operation(str(op["name"]))
        except ApiError as exc:
            if not self.policy.is_transient(exc.code):
                raise
            return dict(op)

    def get_operation(self, name: str) -> dict[str, Any]:
        return self.request("GET", f"{API_VERSION}/{name}", action=f"get operation {name}")

    def _unreadable_pause(self, ref: QueuedResourceRef, elapsed: float, timeout: float) -> None:
        """In a delete's wait: past `timeout` a WaitTimeout, else one poll interval."""
        if elapsed >= timeout:
            raise WaitTimeout(
                f"queued resource {ref.name} could not be read for {elapsed:.0f} s (transient "
                "API errors) -> run the delete again (cdktf destroy flex)"
            )
        self._pause(elapsed, timeout)

    def wait_for_state(
        self, ref: QueuedResourceRef, targets: Collection[str], *, timeout: float,
        fail_states: Collection[str] | None = None, on_progress: Progress | None = None,
        operation: Mapping[str, Any] | None = None,
    ) -> QueuedResource | None:
        """Poll until the QR's state is in `targets` (MISSING = gone); return it (None if gone).

        `fail_states` (default: the dead states, and MISSING unless targeted) raise at once.
        A done `operation` with an error raises it. Reads that fail transiently (after their
        own retries) are polled again until `timeout`.
        """
        fails = (DEAD_STATES | ({MISSING} - set(targets)) if fail_states is None
                 else fail_states)
        wanted = "/".join(sorted(targets))

        def settled(qr: QueuedResource | None, state: str, op: Mapping[str, Any]) -> bool:
            if state in targets:
                return True
            if state in fails:
                raise QueuedResourceError(
                    dead_message(qr) if qr else f"queued resource {ref.name} disappeared "
                    f"while waiting for {wanted}"
                )
            failed = failed_op(op, f"wait for queued resource {ref.name}")
            if failed is not None:
                raise failed
            return False

        def timed_out(state: str, elapsed: float) -> Exception:
            return WaitTimeout(
                f"queued resource {ref.name} is {state} after {elapsed:.0f} s, not {wanted} "
                f"-> wait longer, or check it with `{QR_PROG} describe`"
            )

        return self._poll_until(ref, settled, timeout=timeout,
                                progress=on_progress or no_progress,
                                operation=operation or {}, timed_out=timed_out)
