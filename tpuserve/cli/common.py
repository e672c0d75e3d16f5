"""What every command shares: options, config loading, API clients, one-line errors, JSON."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from tpuserve.kinds import KINDS, STACK_NAMES
from tpuserve.ops.errors import EXIT_INTERRUPTED, EXIT_USAGE, OpsError, one_line
from tpuserve.settings import ConfigError, Deployment, load

if TYPE_CHECKING:
    from rich.console import Console

    from tpuserve.ops.bounded_http import Deadline
    from tpuserve.ops.server import ServerTarget

API_KEY_ENV = "OPENAI_API_KEY"

class _LazyConsole:
    """A rich Console built on first use: `plan --json` and other JSON paths never import rich
    (~60 ms of start-up)."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return getattr(self._console, name)


# stdout carries results (tables, or JSON with --json); stderr carries progress and errors.
console: Console = _LazyConsole(highlight=False)  # type: ignore[assignment]
err_console: Console = _LazyConsole(stderr=True, highlight=False)  # type: ignore[assignment]

JsonOpt = Annotated[
    bool, typer.Option("--json", help="Machine-readable JSON on stdout (progress on stderr).")
]
StackArg = Annotated[str, typer.Argument(help=f"Stack: {', '.join(STACK_NAMES)}.")]
OptionalStackArg = Annotated[
    str | None,
    typer.Argument(help=f"Stack: {', '.join(STACK_NAMES)}. Omit it with --endpoint.",
                   show_default=False),
]
EndpointOpt = Annotated[
    str | None,
    typer.Option("--endpoint", help="Server root URL (e.g. https://34.1.2.3:8000) instead of a "
                 "stack: any OpenAI-compatible server.", show_default=False),
]
FingerprintOpt = Annotated[
    str | None,
    typer.Option("--fingerprint", help="With an https --endpoint: the SHA-256 of the server's "
                 "certificate (`tpuserve endpoint STACK` prints it); only that certificate is "
                 "trusted.", show_default=False),
]
CacertOpt = Annotated[
    Path | None,
    typer.Option("--cacert", help="With an https --endpoint: a PEM certificate or CA to verify "
                 "the server with (names checked), instead of the system's CAs.",
                 show_default=False),
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option("--api-key", envvar=API_KEY_ENV, show_envvar=True, show_default=False,
                 help="The server's API key (prefer the environment variable: argv is visible "
                 "to other users)."),
]


def positive_ints(option: str, text: str) -> tuple[int, ...]:
    """A comma-separated option of positive integers (bench's and tune's --contexts/--clients)."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise OpsError(f"{option} = {text!r}: a comma-separated list of positive integers, "
                       "e.g. 1,4,16,64", exit_code=EXIT_USAGE)
    return values


def emit_json(obj: Any, *, line: bool = False) -> None:
    """One JSON document on stdout (no rich markup, no wrapping); `line`: on one line (JSON
    Lines, for streams of documents such as `status --watch --json`)."""
    sys.stdout.write(json.dumps(obj, indent=None if line else 2, default=str) + "\n")
    sys.stdout.flush()


def log(msg: str) -> None:
    err_console.print(msg, markup=False, emoji=False)


F = TypeVar("F", bound=Callable[..., Any])


def command(fn: F) -> F:
    """Run a command body: every known failure becomes one line on stderr (and a JSON error
    with --json) and its exit code; Ctrl-C exits 130. Never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("json_output"))
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise  # typer reports usage errors itself (exit 2)
        except OpsError as exc:
            _fail(exc.line, exc.exit_code, as_json)
        except ConfigError as exc:
            _fail("invalid configuration: " + "; ".join(exc.problems), EXIT_USAGE, as_json)
        except KeyboardInterrupt:
            _fail("interrupted", EXIT_INTERRUPTED, as_json)
        except Exception as exc:
            if _is_api_error(exc):
                _fail(str(exc), 1, as_json)
            if os.environ.get("TPUSERVE_DEBUG"):
                raise
            # Known library errors that escaped a narrower handler: still one line.
            _fail(f"{type(exc).__name__}: {one_line(exc)} (set TPUSERVE_DEBUG=1 for a "
                  "traceback)", 1, as_json)

    return wrapper  # type: ignore[return-value]


def _is_api_error(exc: Exception) -> bool:
    """An ApiError of the Google API edge, without importing the edge (and its HTTP stack)
    into commands that never call Google: if it was never imported, nothing raised one."""
    api = sys.modules.get("tpuserve.gcp.errors")
    return api is not None and isinstance(exc, api.ApiError)


def _fail(line: str, code: int, as_json: bool) -> None:
    # emoji=False: a fingerprint's ":AB:" would print as an emoji.
    err_console.print(f"tpuserve: error: {line}", markup=False, emoji=False, soft_wrap=True)
    if as_json:
        emit_json({"ok": False, "error": line, "exit_code": code})
    raise typer.Exit(code)


def deployments() -> dict[str, Deployment]:
    return load().deployments


def load_stack(name: str) -> Deployment:
    if name not in STACK_NAMES:
        raise OpsError(f"stack {name!r}: not one of {', '.join(STACK_NAMES)}",
                       exit_code=EXIT_USAGE)
    found = deployments()
    if name not in found:
        raise OpsError(f"stack {name!r} is not in the configuration (configured: "
                       f"{', '.join(found) or 'none'})", exit_code=EXIT_USAGE)
    return found[name]


# ------------------------------------------------------------------ API clients (injectable)
# Tests swap these factories; by default they follow gcloud's environment variables.


def tpu_api() -> Any:
    """The TPU API client: nodes, guest attributes and queued resources."""
    from tpuserve.gcp.tpu.client import TpuClient

    return TpuClient()


def deploy_runner() -> Any:
    """How `recover` re-runs a stack's deployment (tpuserve.ops.recovery.run_deploy)."""
    from tpuserve.ops.recovery import run_deploy

    return run_deploy


def resolve_target(
    stack: str | None, endpoint: str | None, api_key: str | None,
    fingerprint: str | None = None, cacert: Path | None = None,
    deadline: Deadline | None = None,
) -> tuple[ServerTarget, Deployment | None]:
    """A stack (its node's external IP from the TPU API, TLS pinned to the certificate the node
    published) or an explicit --endpoint (https: --fingerprint, --cacert or the system's CAs).
    A server whose certificate is not the pinned one is refused before any key is sent.
    DEADLINE (the command's overall one) bounds the TPU calls and the certificate probe."""
    from tpuserve.bounded_call import client_deadline
    from tpuserve.ops import tls
    from tpuserve.ops.server import ServerTarget, normalize_base_url

    left = deadline.remaining() if deadline is not None else None
    probe_s = tls.CONNECT_TIMEOUT_S if left is None else max(0.0, min(tls.CONNECT_TIMEOUT_S,
                                                                      left))

    if endpoint and stack:
        raise OpsError("give a STACK or --endpoint, not both", exit_code=EXIT_USAGE)
    if fingerprint and cacert:
        raise OpsError("give --fingerprint or --cacert, not both", exit_code=EXIT_USAGE)
    if endpoint:
        base = normalize_base_url(endpoint)
        if (fingerprint or cacert) and not base.startswith("https://"):
            raise OpsError(f"--endpoint = {endpoint!r}: --fingerprint and --cacert need an "
                           "https:// URL", exit_code=EXIT_USAGE)
        context = None
        if fingerprint:
            context = tls.fingerprint_context(base, tls.parse_fingerprint(fingerprint), probe_s)
        elif cacert:
            context = tls.cacert_context(cacert)
        return ServerTarget(base, api_key or None, ssl_context=context), None
    if fingerprint or cacert:
        raise OpsError("--fingerprint and --cacert go with --endpoint; a stack's certificate "
                       "is pinned from its node's guest attributes", exit_code=EXIT_USAGE)
    if not stack:
        vms = ", ".join(k.name for k in KINDS if not k.on_gke)
        raise OpsError(f"give a STACK ({vms}) or --endpoint URL", exit_code=EXIT_USAGE)
    d = load_stack(stack)
    tpu = tpu_api()
    with client_deadline(tpu, left):
        return _stack_target(d, stack, tpu, api_key, probe_s)


def _stack_target(d: Deployment, stack: str, tpu: Any, api_key: str | None,
                  probe_s: float) -> tuple[ServerTarget, Deployment]:
    from tpuserve.ops import tls

    node = tpu.get_node(d)
    if node is None:
        raise OpsError(f"{stack}: node {d.node_name} does not exist in "
                       f"{d.gcp.project}/{d.gcp.zone}",
                       hint=f"deploy it (npx cdktf deploy {stack}), then `tpuserve wait {stack}`")
    if not node.external_ip:
        raise OpsError(f"{stack}: node {d.node_name} is {node.state} with no external IP yet",
                       hint=f"`tpuserve wait {stack}` blocks until it serves")
    if d.access.api_key_proxy and not api_key:
        raise OpsError(
            f"{stack}: the API-key proxy is on and no key was given",
            hint=f'export {API_KEY_ENV}="$({key_command(d)})"',
            exit_code=EXIT_USAGE,
        )
    from tpuserve.ops.boot_phases import NAMESPACE

    attrs = tpu.guest_attributes(d, NAMESPACE) if d.access.tls_on else {}
    target = tls.stack_target(d, node.external_ip, attrs, api_key or None)
    if target.pin is not None:
        tls.verify_peer(target.base_url, target.pin, probe_s)
    return target, d


def fleet_target(d: Deployment, api_key: str | None, *, pinned: bool,
                 deadline: Deadline) -> ServerTarget:
    """The fleet's Gateway as a server (tpuserve.ops.fleet_status.fleet_target), its cluster
    reads (each bounded on its own) ending with DEADLINE, the command's overall one."""
    from tpuserve.bounded_call import within
    from tpuserve.ops import fleet_status

    def look() -> ServerTarget:
        return fleet_status.fleet_target(
            d, api_key, pinned=pinned, key_hint=f'export {API_KEY_ENV}="$({key_command(d)})"')

    left = deadline.remaining()
    if left is None:
        return look()
    return within(left, look, lambda: OpsError(
        f"{d.name}: the overall deadline of {deadline.seconds:g} s passed while the cluster's "
        "API was read for the Gateway's address", hint="allow more time (--deadline)"))


def key_command(d: Deployment) -> str:
    """The gcloud command that prints the stack's API key (we print the command, never the key)."""
    return (f"gcloud secrets versions access latest --secret={d.api_key_secret_id} "
            f"--project={d.gcp.project}")
