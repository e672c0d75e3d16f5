"""The one client for the TPU API: queued resources over REST v2alpha1 (through the Google API
edge, tpuserve.gcp.api; google-cloud-tpu cannot express flex-start) and nodes with
their guest attributes through google-cloud-tpu. One retry policy serves both halves.

Transient faults never cost a queue position: every call is retried by the edge's
policy within the command's timeout; a wait whose reads keep failing polls again (state
UNREADABLE) until that timeout; and a create deletes what it made only on a definitive outcome
(FAILED/SUSPENDED, or the create operation refused the spec). Otherwise it leaves the QR in the
queue and says so: the next deploy adopts it.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

from tpuserve.gcp.api import GoogleApi, UnprovenAnswer, json_kind
from tpuserve.gcp.endpoints import TPU_API
from tpuserve.gcp.errors import ApiError
from tpuserve.gcp.retry import CREATE_TRANSIENT_CODES, RetryPolicy
from tpuserve.gcp.tpu.nodes import NodeCalls, make_client
from tpuserve.gcp.tpu.qr_waits import QueuedResourceWaits, failed_op, no_progress
from tpuserve.gcp.tpu.queued_resources import (
    ACCEPTED_OR_LATER,
    ALIVE_STATES,
    API_VERSION,
    DEAD_STATES,
    KNOWN_STATES,
    MISSING,
    QR_PROG,
    UNREADABLE,
    CreateResult,
    Progress,
    QueuedResource,
    QueuedResourceError,
    QueuedResourceRef,
    Spared,
    SpecMismatch,
    UnknownState,
    WaitTimeout,
    dead_message,
)
from tpuserve.render.queued_resource_body import (
    body_without_metadata,
    check_body,
    spec_differences,
)

DEFAULT_POLL_S = 5.0
ACCEPT_TIMEOUT_S = 600.0
# SPEC 2: a QR in PROVISIONING cannot be deleted, and provisioning takes minutes.
DELETE_TIMEOUT_S = 1800.0
CLEANUP_TIMEOUT_S = 600.0
# A refused delete comes as 400, 409 or 412, with or without a status: the QR's own state, read
# after the refusal, says whether waiting helps.
DELETE_REFUSAL_CODES = frozenset({400, 409, 412})

class _Definitive(Exception):
    """A create's definitive failure (FAILED, or the spec refused): what it made is removed."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _not_a_tpu_queued_resource(data: Mapping[str, Any]) -> str | None:
    """What in a QR answer is not the documented shape the reads below rely on (v2alpha1
    QueuedResource: `state` a QueuedResourceState object, `tpu.nodeSpec` a non-empty list of
    NodeSpec objects, each `node` an object), or None. Read as it is, a QR with no node spec
    would look live and unlabelled (the probe would plan a replacement) and the rest would be
    a traceback."""
    state = data.get("state")
    if not isinstance(state, dict):
        return f"its state is {json_kind(state)}, not a QueuedResourceState object"
    tpu = data.get("tpu")
    specs = tpu.get("nodeSpec") if isinstance(tpu, dict) else None
    if not (isinstance(specs, list) and specs):
        return ("its tpu is " + json_kind(tpu) if not isinstance(tpu, dict)
                else f"its tpu.nodeSpec is {json_kind(specs) if specs != [] else 'empty'}")
    for spec in specs:
        node = spec.get("node") if isinstance(spec, dict) else None
        if not isinstance(node, dict):
            return "a tpu.nodeSpec entry is not a NodeSpec with a node object"
    return None


class TpuClient(NodeCalls, QueuedResourceWaits, GoogleApi):
    """TPU API calls: queued resources (REST v2alpha1) and nodes (google-cloud-tpu)."""

    def __init__(
        self, *, session: Any = None, root: str | None = None,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        poll_interval: float = DEFAULT_POLL_S, policy: RetryPolicy | None = None,
        rand: Callable[[], float] | None = None,
        node_client: Callable[[], Any] | None = None,
    ) -> None:
        extra: dict[str, Any] = {"rand": rand} if rand is not None else {}
        super().__init__("tpu", TPU_API, session=session, root=root, environ=environ,
                         sleep=sleep, clock=clock, policy=policy, **extra)
        self.clock = clock
        self.sleep = sleep
        self.poll_interval = poll_interval
        self._node_factory = node_client or (lambda: make_client(environ))

    # -- queued resources (REST v2alpha1)

    def get_queued_resource(self, ref: QueuedResourceRef) -> QueuedResource | None:
        """The QR, or None when it does not exist. A 200 proves it only with the QR itself:
        an answer whose `name` is another QR's (or none) is an UnprovenAnswer (its state would
        decide whether this one is replaced or deleted). The project may be named by number."""
        action = f"get queued resource {ref.name}"
        try:
            data = self.request("GET", f"{API_VERSION}/{ref.name}", action=action)
        except ApiError as exc:
            if exc.proves_not_found:
                return None
            raise
        name = data.get("name")
        if not (isinstance(name, str) and re.fullmatch(
                rf"projects/[^/]+/locations/{re.escape(ref.zone)}/queuedResources/"
                rf"{re.escape(ref.queued_resource_id)}", name)):
            shown = repr(name)[:80] if name is not None else "missing"
            raise UnprovenAnswer(200, f"the answer is not queued resource {ref.name} (its name "
                                 f"is {shown}): it proves nothing", action=action,
                                 service=self.service)
        odd = _not_a_tpu_queued_resource(data)
        if odd:
            raise UnprovenAnswer(200, f"the answer is not a TPU queued resource ({odd}): it "
                                 "proves nothing", action=action, service=self.service)
        return QueuedResource.from_json(data)

    @contextlib.contextmanager
    def _command(self, timeout: float) -> Iterator[float]:
        """Retries inside this block end with the command's timeout; yields its start."""
        with self.deadline_within(timeout) as start:
            yield start

    def create_queued_resource(
        self, ref: QueuedResourceRef, body: Mapping[str, Any], *,
        timeout: float = ACCEPT_TIMEOUT_S, on_progress: Progress | None = None,
    ) -> CreateResult:
        """Create the QR and return once it is ACCEPTED or further.

        Idempotent: a live QR with the same spec is adopted; a different one raises
        SpecMismatch naming the fields. A dead one (SUSPENDED, FAILED) holds the name and
        quota, so it is deleted first; a DELETING one is waited out; one in a state this
        client does not know is left alone (UnknownState).

        What this create made is deleted again only on a definitive outcome (the QR FAILED
        or was SUSPENDED, or the create operation refused the spec); any other failure (a
        timeout, reads that keep failing) leaves it, and the error says how to resume.
        """
        body = check_body(ref.parent, dict(body))
        progress = on_progress or no_progress
        with self._command(timeout) as start:
            existing = self.get_queued_resource(ref)
            if existing is not None and existing.state not in KNOWN_STATES:
                raise UnknownState(existing)
            if existing is not None and existing.state not in ALIVE_STATES:
                self.delete_queued_resource(ref, timeout=timeout, on_progress=progress)
                existing = None
            op: dict[str, Any] = {}
            if existing is None:
                try:
                    # Retried on 5xx and resets: the id makes a repeat answer 409, judged below.
                    op = self.request(
                        "POST", f"{API_VERSION}/{ref.parent}/queuedResources",
                        params={"queuedResourceId": ref.queued_resource_id}, body=body,
                        action=f"create queued resource {ref.name}", idempotent=True,
                        transient_codes=CREATE_TRANSIENT_CODES,
                    )
                except ApiError as exc:
                    if exc.code != 409:
                        raise
                    ours = self.earlier_try_unanswered
                    existing = self.get_queued_resource(ref)  # lost a race: judge what is there
                    if existing is None:
                        raise
                    if ours:
                        # An earlier try of this very POST may have acted (its answer was lost
                        # or a 5xx): the QR is this create's own, cleanup included.
                        existing = None
            if existing is not None:
                # Metadata is not the QR's to match: the flex stack's node_metadata step
                # converges it on the node (`converge`), so a QR left by an earlier apply is kept.
                diffs = spec_differences(body_without_metadata(body), existing.raw)
                if diffs:
                    raise SpecMismatch(ref.name, diffs)
            remaining = max(0.0, timeout - (self.clock() - start))
            try:
                qr = self._wait_accepted(ref, op, remaining, progress)
            except _Definitive as failed:
                if existing is None:
                    self._remove_failed_create(ref, failed.error, progress)
                raise failed.error from None
            except (ApiError, QueuedResourceError) as exc:
                if existing is None:
                    exc.add_note(
                        f"the queued resource {ref.name} was left in place (it keeps its place "
                        "in the queue): deploy again (cdktf deploy flex) to adopt it, or delete "
                        f"it with `{QR_PROG} delete --name {ref.name}`"
                    )
                raise
        return CreateResult(qr, adopted=existing is not None)

    def _remove_failed_create(
        self, ref: QueuedResourceRef, exc: Exception, progress: Progress
    ) -> None:
        """Delete what a definitively failed create made: Terraform skips destroy provisioners
        of a tainted resource, so a QR left here could provision later and bill with nothing
        tracking it."""
        try:
            if self.delete_queued_resource(ref, timeout=CLEANUP_TIMEOUT_S, on_progress=progress):
                exc.add_note("the queued resource this create made was deleted again")
        except (ApiError, QueuedResourceError) as cleanup:
            exc.add_note(
                f"removing the queued resource this create made failed too ({cleanup}): delete "
                f"it with `{QR_PROG} delete --name {ref.name}`"
            )

    def delete_queued_resource(
        self, ref: QueuedResourceRef, *, force: bool = True,
        timeout: float = DELETE_TIMEOUT_S, on_progress: Progress | None = None,
        spare: Collection[str] = (),
    ) -> bool:
        """Delete the QR (with force: its node first) and wait until it is gone.

        A missing QR is success (returns False: nothing was deleted). A QR in PROVISIONING
        cannot be deleted (SPEC 2): a refused delete (400, 409 or 412, whatever its status
        says) is retried within `timeout` while the QR, read again, is PROVISIONING.

        A QR read in one of the `spare` states just before a delete request (e.g. one that
        got capacity meanwhile: PROVISIONING, ACTIVE) is not deleted: Spared is raised.
        """
        progress = on_progress or no_progress

        def still_provisioning(elapsed: float) -> WaitTimeout:
            return WaitTimeout(
                f"queued resource {ref.name} is still PROVISIONING after {elapsed:.0f} s and "
                "cannot be deleted until it finishes (SPEC 2) -> run the delete again in a few "
                "minutes (cdktf destroy flex)"
            )

        with self._command(timeout) as start:
            op: dict[str, Any] = {}
            refused = False
            waiting = (f"PROVISIONING (cannot be deleted until provisioning ends; retrying for "
                       f"up to {timeout:.0f} s)")
            while True:
                qr, state = self._poll(ref)
                elapsed = self.clock() - start
                if state.startswith(UNREADABLE):  # transient faults outlasted their retries
                    progress(state, elapsed)
                    self._unreadable_pause(ref, elapsed, timeout)
                    continue
                if qr is None:
                    progress(MISSING, elapsed)
                    return False
                progress(waiting if refused and qr.state == "PROVISIONING" else qr.state,
                         elapsed)
                if qr.state == "DELETING":
                    break
                if qr.state in spare:
                    raise Spared(ref.name, qr.state)
                try:
                    op = self.request(
                        "DELETE", f"{API_VERSION}/{ref.name}",
                        params={"force": "true"} if force else None,
                        action=f"delete queued resource {ref.name}",
                    )
                    break
                except ApiError as exc:
                    if exc.proves_not_found:
                        progress(MISSING, self.clock() - start)
                        return False
                    if exc.code not in DELETE_REFUSAL_CODES:
                        raise
                    # The refusal's words vary; the QR's own state says whether to wait.
                    now, state = self._poll(ref)
                    if state.startswith(UNREADABLE):
                        progress(state, elapsed)
                        self._unreadable_pause(ref, elapsed, timeout)
                        continue
                    if now is None:
                        progress(MISSING, self.clock() - start)
                        return False
                    if now.state == "DELETING":
                        break
                    if now.state in spare:
                        raise Spared(ref.name, now.state) from None
                    if now.state != "PROVISIONING":
                        raise
                    if not refused:
                        refused = True
                        progress(waiting, elapsed)
                    if elapsed >= timeout:
                        raise still_provisioning(elapsed) from None
                    self._pause(elapsed, timeout)
                    if self._out_of_time(start, timeout):
                        raise still_provisioning(self.clock() - start) from None
            remaining = max(0.0, timeout - (self.clock() - start))
            self.wait_for_state(ref, {MISSING}, timeout=remaining, fail_states=(),
                                on_progress=progress, operation=op)
        return True

    def _wait_accepted(
        self, ref: QueuedResourceRef, op: Mapping[str, Any], timeout: float, progress: Progress
    ) -> QueuedResource:
        def before_read(op: Mapping[str, Any]) -> None:
            failed = failed_op(op, f"create queued resource {ref.name}")
            if failed is not None:
                raise _Definitive(failed)

        def settled(qr: QueuedResource | None, state: str, op: Mapping[str, Any]) -> bool:
            if qr is not None and qr.state in DEAD_STATES:
                raise _Definitive(QueuedResourceError(dead_message(qr)))
            return qr is not None and qr.state in ACCEPTED_OR_LATER

        def timed_out(state: str, elapsed: float) -> Exception:
            return WaitTimeout(
                f"queued resource {ref.name} is {state} after {elapsed:.0f} s, not "
                f"ACCEPTED yet -> check it with `{QR_PROG} describe`, then deploy again "
                "(create is idempotent)"
            )

        qr = self._poll_until(ref, settled, timeout=timeout, progress=progress, operation=op,
                              timed_out=timed_out, before_read=before_read)
        assert qr is not None  # settled only on a QR ACCEPTED or later
        return qr
