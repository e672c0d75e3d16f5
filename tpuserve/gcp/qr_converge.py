"""The flex stack's converge step: a queued resource's node metadata brought to the body's
without giving up capacity (`python -m tpuserve.queued_resource converge` calls `converge`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tpuserve.contracts import QUEUED_RESOURCE
from tpuserve.gcp.errors import ApiError
from tpuserve.gcp.tpu.client import DELETE_TIMEOUT_S, TpuClient
from tpuserve.gcp.tpu.nodes import UPDATE_TIMEOUT_S
from tpuserve.gcp.tpu.queued_resources import (
    DEAD_STATES,
    KNOWN_STATES,
    MISSING,
    CreateResult,
    Progress,
    QueuedResourceError,
    QueuedResourceRef,
    Spared,
    UnknownState,
)
from tpuserve.render.queued_resource_body import body_metadata

# A PROVISIONING QR is waited out (it has capacity: it is patched once ACTIVE); provisioning
# takes minutes, like a delete that waits for it (DELETE_TIMEOUT_S).
CONVERGE_TIMEOUT_S = DELETE_TIMEOUT_S
# Holds (or is about to hold) capacity: never deleted to change metadata.
CAPACITY_STATES = frozenset({"PROVISIONING", "ACTIVE"})
# How often one converge looks at a QR that changed state under it (queued -> PROVISIONING
# -> ACTIVE is two).
_CONVERGE_LOOKS = 4
# A re-create refused as a rate limit (ApiError.is_rate_limit) is tried this often in all, with
# the edge's backoff, inside converge's deadline. A quota refusal (QuotaFailure) is not retried:
# the edge never retries a create on 429 (retry.CREATE_TRANSIENT_CODES).
RECREATE_TRIES = 5
# A metadata PATCH answered 409 (the node is being changed by another operation) is tried this
# often in all, with the edge's backoff, inside the deadline.
PATCH_CONFLICT_TRIES = 5
# Rounds of (re-read, merge, PATCH, re-read) before converge gives up on a node whose metadata
# keeps changing under it: the TPU API has no fingerprint or etag on a node's metadata, so no
# PATCH can be made conditional (the window between the last read and the PATCH stays open).
METADATA_ROUNDS = 3
RESTORE_COMMAND = "cdktf deploy flex"


def merged_metadata(
    current: Mapping[str, str], desired: Mapping[str, str], managed: set[str]
) -> dict[str, str]:
    """The node's metadata after a converge: `desired`, plus the keys of `current` that are
    not ours (not in `managed` or `desired`: e.g. keys gcloud added), kept as they are."""
    keys = managed | set(desired)
    return {**{k: v for k, v in current.items() if k not in keys}, **desired}


def converge(
    client: TpuClient, ref: QueuedResourceRef, body: Mapping[str, Any], generation: str, *,
    timeout: float, progress: Progress, create: Callable[[dict[str, Any], str], CreateResult],
) -> str:
    """Bring the QR's node metadata to `body`'s (tpu.nodeSpec[0].node.metadata) without giving
    up capacity; returns the one line to print.

    ACTIVE: the node's metadata is updated in place (nodes.patch), keys that are not ours kept.
    Still queued (CREATING, ACCEPTED, WAITING_FOR_RESOURCES) with other metadata: the QR is
    deleted and created again with `body` (through `create`, as the create step does), which
    costs its place in the queue only; a re-create refused as a rate limit is retried (a
    quota refusal is not), and every failure after the delete says, in its one line, that the
    QR was deleted and that `cdktf deploy flex` restores it. PROVISIONING: waited out, then as
    ACTIVE. Dead (SUSPENDING, SUSPENDED, FAILED) or DELETING: nothing; the plan-time probe
    replaces it.
    Missing: QueuedResourceError (Terraform created it first). An unknown state: UnknownState.

    `timeout` bounds every call beneath it (the QR's reads, the delete, the re-create, the
    node's reads and PATCH), its retries and each try's last byte included (the client's
    `deadline_within`): a call it cuts is one line naming --timeout.
    """
    with client.deadline_within(timeout):
        return _converge(client, ref, body, generation, timeout=timeout, progress=progress,
                         create=create)


def _converge(
    client: TpuClient, ref: QueuedResourceRef, body: Mapping[str, Any], generation: str, *,
    timeout: float, progress: Progress, create: Callable[[dict[str, Any], str], CreateResult],
) -> str:
    desired = body_metadata(body)
    start = client.clock()
    for _ in range(_CONVERGE_LOOKS):
        remaining = max(0.0, timeout - (client.clock() - start))
        qr = client.get_queued_resource(ref)
        if qr is None:
            raise QueuedResourceError(
                f"queued resource {ref.name} does not exist, so its node's metadata cannot be "
                "updated -> deploy again (cdktf deploy flex): the plan creates it anew"
            )
        state = qr.state
        if state not in KNOWN_STATES:
            raise UnknownState(qr)
        if state in DEAD_STATES or state == "DELETING":
            return (f"tpuserve: queued resource {ref.name} is {state}: no node to update; the "
                    "next deploy replaces it, with this metadata (cdktf deploy flex)")
        if state == "PROVISIONING":
            client.wait_for_state(
                ref, (KNOWN_STATES | {MISSING}) - {"PROVISIONING"}, timeout=remaining,
                fail_states=(), on_progress=progress,
            )
            continue
        if state == "ACTIVE":
            return _converge_node(client, qr.node_names[0], body_metadata(qr.raw), desired,
                                  timeout=min(UPDATE_TIMEOUT_S, max(remaining, 1.0)))
        # Still queued (CREATING, ACCEPTED, WAITING_FOR_RESOURCES), no capacity yet: the QR's
        # own spec is what its node will boot with, and a new QR costs only the queue place.
        if body_metadata(qr.raw) == desired:
            return (f"tpuserve: queued resource {ref.name} is {state}: metadata unchanged (its "
                    "node will boot with it)")
        try:
            deleted = client.delete_queued_resource(ref, timeout=remaining,
                                                    on_progress=progress, spare=CAPACITY_STATES)
        except Spared:
            continue  # capacity came meanwhile: look again (and update the node in place)
        except (ApiError, QueuedResourceError) as exc:  # a refused delete (a 429), a timeout
            exc.add_note(_after_failed_delete(client, ref, state))
            raise
        try:
            result = _recreate(client, create, body, generation or qr.generation or "",
                               end=start + timeout)
        except (ApiError, QueuedResourceError) as exc:
            exc.add_note(_after_delete(client, ref, state))
            raise
        except KeyboardInterrupt as exc:  # no call now: say what is known
            exc.add_note(_after_delete(None, ref, state))
            raise
        if not deleted:  # gone between converge's read and its delete (someone else's)
            return (f"tpuserve: created {ref.name} anew with the new metadata: it was {state} "
                    "(no capacity yet) and was gone before converge's delete; now "
                    f"{result.queued_resource.state}")
        return (f"tpuserve: recreated {ref.name} with the new metadata: it was {state} (no "
                "capacity yet), so it lost only its place in the queue; now "
                f"{result.queued_resource.state}")
    raise QueuedResourceError(
        f"queued resource {ref.name} kept changing state while its node's metadata was being "
        "converged -> deploy again (cdktf deploy flex)"
    )


def _recreate(
    client: TpuClient, create: Callable[[dict[str, Any], str], CreateResult],
    body: Mapping[str, Any], generation: str, *, end: float,
) -> CreateResult:
    """The re-create after converge's delete; a rate limit is waited out (bounded, inside
    `end`), a quota refusal or anything else is raised at once."""
    for attempt in range(1, RECREATE_TRIES + 1):
        try:
            return create(dict(body), generation)
        except ApiError as exc:
            if not exc.is_rate_limit or attempt == RECREATE_TRIES:
                raise
            pause = client.policy.pause(attempt, exc.retry_after)
            if client.clock() + pause > end:
                raise
            client.sleep(pause)
    raise AssertionError("unreachable")  # the loop returns or raises


def _after_delete(client: TpuClient | None, ref: QueuedResourceRef, state: str) -> str:
    """What a failure after converge's delete left, in words, and what restores it: the plan's
    probe finds the QR missing (or adopts the new one) and `cdktf deploy flex` creates it.
    No client: do not look (interrupted)."""
    deleted = (f"the queued resource {ref.name} (it was {state}, no capacity yet) was DELETED "
               "to change its metadata")
    unknown = (f"{deleted}, and whether its re-create took could not be read: run "
               f"`{RESTORE_COMMAND}`, which adopts the new one or creates it anew")
    if client is None:
        return unknown
    try:
        now = client.get_queued_resource(ref)
    except ApiError:
        return unknown
    if now is None:
        return (f"{deleted} and is NOT re-created: run `{RESTORE_COMMAND}` to create it anew "
                "(its place in the queue is lost)")
    return (f"{deleted}; a new one was created and is {now.state}: run `{RESTORE_COMMAND}`, "
            "which keeps it if it is alive and replaces it if it is not")


def _after_failed_delete(client: TpuClient, ref: QueuedResourceRef, state: str) -> str:
    """What a failed delete in converge left, read again, and what restores it."""
    try:
        now = client.get_queued_resource(ref)
    except ApiError:
        return (f"whether the queued resource {ref.name} (it was {state}, no capacity yet) was "
                f"deleted could not be read: run `{RESTORE_COMMAND}`, which keeps it if it is "
                "alive and creates it anew if it is not")
    if now is None or now.state == "DELETING":
        return (f"the queued resource {ref.name} (it was {state}, no capacity yet) is "
                f"{'gone' if now is None else 'being DELETED'} and is NOT re-created: run "
                f"`{RESTORE_COMMAND}` to create it anew (its place in the queue is lost)")
    return (f"the queued resource {ref.name} was NOT deleted: it is {now.state} and keeps its "
            f"place in the queue, with the old metadata its node would boot with: run "
            f"`{RESTORE_COMMAND}` to converge it again")


def _read_metadata(client: TpuClient, node: str) -> dict[str, str]:
    current = client.node_metadata(node)
    if current is None:
        raise QueuedResourceError(
            f"node {node} does not exist although its queued resource is ACTIVE -> check it "
            f"with `{QUEUED_RESOURCE.prog} describe`, then deploy again"
        )
    return current


def _patch_metadata(client: TpuClient, node: str, wanted: Mapping[str, str], *,
                    end: float) -> None:
    """One metadata PATCH, waited for; a 409 (another operation is changing the node) is
    retried with backoff, bounded and inside `end`. Its hint never says to delete the node: it
    holds the flex-start capacity."""
    for attempt in range(1, PATCH_CONFLICT_TRIES + 1):
        try:
            client.update_node_metadata(node, wanted, timeout=max(end - client.clock(), 1.0))
            return
        except ApiError as exc:
            if exc.code != 409:
                raise
            pause = client.policy.pause(attempt, exc.retry_after)
            if attempt == PATCH_CONFLICT_TRIES or client.clock() + pause > end:
                exc.hint = (
                    f"another operation is changing the node (tried {attempt} times): wait "
                    "until it is READY (`gcloud compute tpus tpu-vm describe`), then "
                    f"`{RESTORE_COMMAND}`; do not delete it: it holds the flex-start capacity"
                )
                raise
            client.sleep(pause)


def _converge_node(
    client: TpuClient, node: str, spec_metadata: Mapping[str, str],
    desired: Mapping[str, str], *, timeout: float,
) -> str:
    """Patch the node's metadata to `desired`, keeping keys that are not ours.

    No precondition exists (the TPU API has no fingerprint or etag on node metadata), so a
    key written by someone else between a read and the PATCH would be lost. The window is
    narrowed, not closed: the metadata is re-read immediately before each PATCH and after its
    operation; a key of someone else's present before it and missing after it (or one of ours
    reverted) is merged and patched again, for at most METADATA_ROUNDS rounds.
    """
    end = client.clock() + timeout
    managed = set(spec_metadata)
    first = _read_metadata(client, node)
    if merged_metadata(first, desired, managed) == first:
        return f"tpuserve: node {node}: metadata unchanged"
    before = _read_metadata(client, node)  # immediately before the PATCH
    for _ in range(METADATA_ROUNDS):
        wanted = merged_metadata(before, desired, managed)
        try:
            _patch_metadata(client, node, wanted, end=end)
        except (ApiError, QueuedResourceError) as exc:  # refused, failed or timed out
            exc.add_note(f"nothing was deleted: the node {node} and its flex-start capacity "
                         "are kept, and its metadata may still be the old one: run "
                         f"`{RESTORE_COMMAND}` to converge it again")
            raise
        after = _read_metadata(client, node)
        lost = {k: v for k, v in before.items()
                if k not in managed and k not in desired and k not in after}
        reverted = sorted(k for k, v in desired.items() if after.get(k) != v)
        if not lost and not reverted:
            changed = sorted(k for k in set(wanted) | set(first)
                             if wanted.get(k) != first.get(k))
            return (f"tpuserve: node {node}: metadata updated in place ({', '.join(changed)}), "
                    "capacity kept; the node re-runs its boot script and re-converges")
        before = {**after, **lost}  # theirs as last seen, plus what the PATCH dropped
    missing = sorted(lost) + reverted
    raise QueuedResourceError(
        f"node {node}: its metadata kept changing while converge patched it ({METADATA_ROUNDS} "
        f"rounds; still missing or changed: {', '.join(missing)}) -> check who else writes it "
        f"(`gcloud compute tpus tpu-vm describe`), then `{RESTORE_COMMAND}`; the node and its "
        "capacity are kept"
    )
