"""`python -m tpuserve.queued_resource create|delete|probe|describe|converge`: the flex stack's
provisioners. The name is written into deployed stacks' Terraform (and the README), so it
stays; this is the process (commands, inputs, output, exit codes), the TPU calls are
tpuserve.gcp's (provisioner, qr_converge, tpu.client).

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
import gzip
import json
import math
import os
import sys
from collections.abc import Mapping
from typing import IO, Any

from tpuserve import contracts, entry_point
from tpuserve.contracts import QR_BODY_ENV as ENV_BODY
from tpuserve.contracts import QR_BODY_GZ_ENV as ENV_BODY_GZ
from tpuserve.contracts import QR_GENERATION_ENV as ENV_GENERATION
from tpuserve.contracts import QR_NAME_ENV as ENV_NAME
from tpuserve.contracts import QR_POLL_ENV as ENV_POLL
from tpuserve.gcp.errors import ApiError
from tpuserve.gcp.provisioner import probe
from tpuserve.gcp.qr_converge import CONVERGE_TIMEOUT_S, converge
from tpuserve.gcp.tpu.client import ACCEPT_TIMEOUT_S, DEFAULT_POLL_S, DELETE_TIMEOUT_S, TpuClient
from tpuserve.gcp.tpu.queued_resources import (
    CreateResult,
    Progress,
    QueuedResourceError,
    QueuedResourceRef,
)
from tpuserve.progress_lines import rich_progress
from tpuserve.render.queued_resource_body import check_body, with_generation


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
        prog=contracts.QUEUED_RESOURCE.prog,
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
    return entry_point.run(lambda: _run(args, env, stdin or sys.stdin, out, err), err,
                           usage=(_UsageError,), failed=(ApiError, QueuedResourceError))

if __name__ == "__main__":
    sys.exit(main())
