"""The flex stack's provisioners: `python -m tpuserve.queued_resource` runs `main` here.

    python -m tpuserve.queued_resource create     # body in $TPUSERVE_QR_BODY_GZ, $TPUSERVE_QR_BODY
                                                  # or --body-file
    python -m tpuserve.queued_resource delete     # force, waits until gone
    python -m tpuserve.queued_resource probe      # Terraform `external` data source protocol
    python -m tpuserve.queued_resource describe   # the QR as JSON
    python -m tpuserve.queued_resource converge   # the node's metadata to the body's, in place

The QR name comes from --name or $TPUSERVE_QR_NAME (projects/P/locations/Z/queuedResources/ID).
create and converge read the body from --body-file, else $TPUSERVE_QR_BODY_GZ (gzipped and
base64-coded: what the stack passes, Terraform's base64gzip), else $TPUSERVE_QR_BODY (plain
JSON, for hand runs), and the generation
label from $TPUSERVE_QR_GENERATION (or --generation; converge falls back to the QR's own).
create, delete and converge end within their --timeout (converge: 1800 s by default), every
API call beneath it, its retries and each try's last byte included; probe and describe make one
read, bounded by the edge's per-call retry deadline (120 s).
An error prints one line to stderr and exits 1 (bad input: 2); never a traceback. Progress is
one line per state change (a spinner on a terminal).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import gzip
import json
import math
import os
import secrets
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

from tpuserve.gcp.errors import ApiError
from tpuserve.gcp.tpu.client import ACCEPT_TIMEOUT_S, DEFAULT_POLL_S, DELETE_TIMEOUT_S, TpuClient
from tpuserve.gcp.tpu.nodes import UPDATE_TIMEOUT_S
from tpuserve.gcp.tpu.queued_resources import (
    ALIVE_STATES,
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
from tpuserve.render.queued_resource_body import body_metadata, check_body, with_generation

# The flex stack's Terraform passes these to the provisioners (stacks/flex.py).
ENV_NAME = "TPUSERVE_QR_NAME"
ENV_BODY = "TPUSERVE_QR_BODY"
# The stack's form: a body over 100 KB does not fit one environment string (128 KiB).
ENV_BODY_GZ = "TPUSERVE_QR_BODY_GZ"
ENV_GENERATION = "TPUSERVE_QR_GENERATION"
ENV_POLL = "TPUSERVE_QR_POLL_SECONDS"


# ----------------------------------------------------------------------------- progress


class StatePrinter:
    """A Progress callback that prints one line whenever the state changes."""

    def __init__(self, label: str, stream: IO[str] | None = None) -> None:
        self.label = label
        self.stream = stream
        self.last: str | None = None

    def __call__(self, state: str, elapsed: float) -> None:
        if state != self.last:
            self.last = state
            print(f"tpuserve: {self.label}: {state} ({elapsed:.0f} s)",
                  file=self.stream or sys.stderr, flush=True)


@contextlib.contextmanager
def rich_progress(label: str, stream: IO[str] | None = None) -> Iterator[Progress]:
    """A spinner for terminals (rich); one line per state change otherwise (provisioners)."""
    out = stream or sys.stderr
    if not out.isatty():  # Terraform's local-exec, CI, a pipe: plain lines, and no rich import
        yield StatePrinter(label, out)
        return
    from rich.console import Console

    console = Console(file=out)
    with console.status(f"{label}: ...") as status:
        printer = StatePrinter(label, console.file)

        def update(state: str, elapsed: float) -> None:
            if state != printer.last:
                console.log(f"{label}: {state}")
                printer.last = state
            status.update(f"{label}: {state} ({elapsed:.0f} s)")

        yield update


# ----------------------------------------------------------------------------- probe


def new_generation(now: float | None = None) -> str:
    """A fresh token (UTC time + 4 hex digits), valid as a label value."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{secrets.token_hex(2)}"


def probe(client: TpuClient, ref: QueuedResourceRef) -> dict[str, str]:
    """The replacement token the flex stack puts in triggers_replace.

    A live QR answers with the generation label it was created with, so the plan is a no-op;
    a missing, SUSPENDED, FAILED or DELETING one answers with a new token, so Terraform plans
    a replacement exactly when the QR is dead. A state this client does not know
    (STATE_UNSPECIFIED) is not a reason to replace: the QR keeps its token, reported as
    unknown; without a token to keep, the probe fails (UnknownState) rather than guess.
    """
    qr = client.get_queued_resource(ref)
    state = qr.state if qr else MISSING
    if qr is not None and state not in KNOWN_STATES:
        if not qr.generation:
            raise UnknownState(qr)
        return {"generation": qr.generation, "state": f"UNKNOWN ({state})"}
    if qr is not None and state in ALIVE_STATES and qr.generation:
        return {"generation": qr.generation, "state": state}
    return {"generation": new_generation(), "state": state}


# ----------------------------------------------------------------------------- converge

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
            "with `python -m tpuserve.queued_resource describe`, then deploy again"
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


# ----------------------------------------------------------------------------- CLI


class _UsageError(Exception):
    pass


def _env_poll(environ: Mapping[str, str]) -> float:
    raw = environ.get(ENV_POLL, "")
    if not raw:
        return DEFAULT_POLL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 600:
        raise _UsageError(f"{ENV_POLL} = {raw!r}: seconds between polls, 0-600")
    return value


def _ref_arg(args: argparse.Namespace, environ: Mapping[str, str]) -> QueuedResourceRef:
    name = args.name or environ.get(ENV_NAME, "")
    if not name:
        raise _UsageError(f"the queued resource name is missing: pass --name or set {ENV_NAME}")
    try:
        return QueuedResourceRef.parse(name)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None


def _body_arg(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any]:
    if args.body_file:
        source, text = f"--body-file {args.body_file}", _read(args.body_file)
    elif environ.get(ENV_BODY_GZ):
        source = ENV_BODY_GZ
        try:
            text = gzip.decompress(base64.b64decode(environ[ENV_BODY_GZ], validate=True)).decode()
        except (binascii.Error, OSError, EOFError, UnicodeDecodeError) as exc:
            raise _UsageError(f"{source}: not a gzipped, base64-coded body ({exc})") from None
    elif environ.get(ENV_BODY):
        source, text = ENV_BODY, environ[ENV_BODY]
    else:
        raise _UsageError(f"the queued resource body is missing: set {ENV_BODY_GZ}, "
                          f"{ENV_BODY} or --body-file")
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise _UsageError(f"{source}: not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise _UsageError(f"{source}: must be a JSON object")
    return body


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        raise _UsageError(f"--body-file {path}: {exc.strerror}") from None


def _seconds(text: str) -> float:
    """--timeout: a finite, positive number of seconds (nan or inf would leave only the
    per-call caps, and no overall bound)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number of seconds > 0")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tpuserve.queued_resource",
        description="Flex-start queued resources (TPU API v2alpha1); used by the flex stack.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    name_help = f"projects/P/locations/Z/queuedResources/ID (default: ${ENV_NAME})"
    create = sub.add_parser("create", help="create (or adopt) and wait until ACCEPTED")
    create.add_argument("--name", help=name_help)
    body_help = f"the JSON body (default: ${ENV_BODY_GZ}, else ${ENV_BODY})"
    create.add_argument("--body-file", help=body_help)
    create.add_argument("--generation", help=f"label token (default: ${ENV_GENERATION})")
    create.add_argument("--timeout", type=_seconds, default=ACCEPT_TIMEOUT_S)
    delete = sub.add_parser("delete", help="delete with force and wait until gone")
    delete.add_argument("--name", help=name_help)
    delete.add_argument("--timeout", type=_seconds, default=DELETE_TIMEOUT_S)
    describe = sub.add_parser("describe", help="print the queued resource as JSON")
    describe.add_argument("--name", help=name_help)
    conv = sub.add_parser(
        "converge", help="bring the node's metadata to the body's: in place when ACTIVE, by "
        "a new queued resource while still queued (no capacity lost)")
    conv.add_argument("--name", help=name_help)
    conv.add_argument("--body-file", help=body_help)
    conv.add_argument("--generation",
                      help=f"label token for a new QR (default: ${ENV_GENERATION}, else the "
                      "QR's own)")
    conv.add_argument("--timeout", type=_seconds, default=CONVERGE_TIMEOUT_S)
    sub.add_parser("probe", help='Terraform external data source: stdin {"name": ...}')
    return parser


def _run(
    args: argparse.Namespace, environ: Mapping[str, str], stdin: IO[str], stdout: IO[str],
    stderr: IO[str],
) -> int:
    try:
        client = TpuClient(environ=environ, poll_interval=_env_poll(environ))
    except ValueError as exc:  # a malformed endpoint override or TPUSERVE_TIME_SCALE
        raise _UsageError(str(exc)) from None
    if args.command == "probe":
        try:
            query = json.loads(stdin.read() or "{}")
        except ValueError as exc:
            raise _UsageError(f"probe: stdin is not a JSON object ({exc})") from None
        if not isinstance(query, dict) or not isinstance(query.get("name"), str):
            raise _UsageError('probe: stdin must be a JSON object like {"name": "projects/..."}')
        try:
            ref = QueuedResourceRef.parse(query["name"])
        except ValueError as exc:
            raise _UsageError(f"probe: {exc}") from None
        json.dump(probe(client, ref), stdout)
        stdout.write("\n")
        return 0
    ref = _ref_arg(args, environ)
    if args.command == "describe":
        qr = client.get_queued_resource(ref)
        if qr is None:
            print(f"tpuserve: queued resource {ref.name} does not exist", file=stderr)
            return 1
        json.dump(qr.raw, stdout, indent=2, sort_keys=True)
        stdout.write("\n")
        return 0
    label = f"queued resource {ref.queued_resource_id}"
    if args.command == "converge":
        body = _body_arg(args, environ)
        try:
            check_body(ref.parent, body)
        except ValueError as exc:
            raise _UsageError(str(exc)) from None
        generation = args.generation or environ.get(ENV_GENERATION, "")
        if generation:
            _labelled(body, generation)  # a bad token is bad input, before any API call
        with rich_progress(label, stderr) as progress:
            line = converge(
                client, ref, body, generation, timeout=args.timeout, progress=progress,
                create=lambda b, g: _create(client, ref, b, g, ACCEPT_TIMEOUT_S, progress),
            )
        print(line, file=stdout)
        return 0
    if args.command == "create":
        body = _body_arg(args, environ)
        generation = args.generation or environ.get(ENV_GENERATION, "")
        try:
            check_body(ref.parent, body)
        except ValueError as exc:
            raise _UsageError(str(exc)) from None
        _labelled(body, generation)  # a bad token is bad input, before any API call
        with rich_progress(label, stderr) as progress:
            result = _create(client, ref, body, generation, args.timeout, progress)
        verb = "adopted" if result.adopted else "created"
        print(
            f"tpuserve: {verb} {ref.name}: {result.queued_resource.state}; ACTIVE can take a "
            "while: wait for it with `tpuserve wait flex`", file=stdout,
        )
        return 0
    with rich_progress(label, stderr) as progress:
        deleted = client.delete_queued_resource(ref, timeout=args.timeout, on_progress=progress)
    print(f"tpuserve: {'deleted' if deleted else 'already gone:'} {ref.name}", file=stdout)
    return 0


def _labelled(body: dict[str, Any], generation: str) -> dict[str, Any]:
    """`body` with the generation label (unchanged without one); a bad token: _UsageError."""
    if not generation:
        return body
    try:
        return with_generation(body, generation)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None


def _create(
    client: TpuClient, ref: QueuedResourceRef, body: dict[str, Any], generation: str,
    timeout: float, progress: Progress,
) -> CreateResult:
    """The create step's own path (create, and converge's new QR): label, create, wait."""
    return client.create_queued_resource(ref, _labelled(body, generation), timeout=timeout,
                                         on_progress=progress)


def main(
    argv: list[str] | None = None, *, environ: Mapping[str, str] | None = None,
    stdin: IO[str] | None = None, stdout: IO[str] | None = None, stderr: IO[str] | None = None,
) -> int:
    env = os.environ if environ is None else environ
    out, err = stdout or sys.stdout, stderr or sys.stderr
    args = _parser().parse_args(argv)
    try:
        return _run(args, env, stdin or sys.stdin, out, err)
    except _UsageError as exc:
        print(f"tpuserve: {exc}", file=err)
        return 2
    except (ApiError, QueuedResourceError) as exc:
        notes = "".join(f"; {note}" for note in getattr(exc, "__notes__", ()))
        print(f"tpuserve: {exc}{notes}", file=err)
        return 1
    except KeyboardInterrupt as exc:
        notes = "".join(f"; {note}" for note in getattr(exc, "__notes__", ()))
        print(f"tpuserve: interrupted{notes}", file=err)
        return 130


if __name__ == "__main__":
    sys.exit(main())
