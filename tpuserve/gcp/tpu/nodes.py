"""TPU nodes through google-cloud-tpu's v2 client (REST transport): the client, the view the
CLI reads, and its errors (the calls themselves are tpuserve.gcp.tpu.client.TpuClient's).

REST, not gRPC, so gcloud's `CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU` can point it at any root
(a fake on 127.0.0.1 in tests); credentials follow tpuserve.gcp.credentials (the
`CLOUDSDK_AUTH_ACCESS_TOKEN` bearer token, else Application Default Credentials). Every API
failure becomes tpuserve.gcp.errors.ApiError: one line with the status, the message and what to
do, rendered by the same code as the REST path's. Transient failures are retried by the REST
path's policy and loop (tpuserve.gcp.retry): one policy for both.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from tpuserve.bounded_call import CallTimedOut, within
from tpuserve.gcp.api import DEADLINE_HINT
from tpuserve.gcp.credentials import credentials
from tpuserve.gcp.endpoints import TOKEN_ENV, TPU_API, api_root
from tpuserve.gcp.errors import ApiError, CredentialsError, ErrorDetails
from tpuserve.gcp.retry import RetryPolicy, Transient, call_with_retry, retry_after_seconds
from tpuserve.gcp.tpu.queued_resources import WaitTimeout

if TYPE_CHECKING:
    from tpuserve.settings import Deployment

# One API call's deadline; transient failures are retried by the policy (RetryPolicy).
CALL_TIMEOUT_S = 30.0
# A metadata update's operation: it finishes in seconds; minutes mean something is wrong.
UPDATE_TIMEOUT_S = 300.0
T = TypeVar("T")


@dataclass(frozen=True)
class NodeView:
    """What the CLI needs of a TPU node."""

    name: str
    state: str  # READY, CREATING, PREEMPTED, ... (google.cloud.tpu_v2.Node.State)
    health: str  # HEALTHY, ... or HEALTH_UNSPECIFIED
    external_ip: str | None
    create_time: dt.datetime | None
    accelerator_type: str
    spot: bool
    health_description: str = ""


def node_path(d: Deployment) -> str:
    return f"projects/{d.gcp.project}/locations/{d.gcp.zone}/nodes/{d.node_name}"


def make_client(environ: Mapping[str, str] | None = None) -> Any:
    """google.cloud.tpu_v2.TpuClient on the REST transport at gcloud's TPU endpoint."""
    from google.cloud import tpu_v2

    env = os.environ if environ is None else environ
    try:
        root = api_root("tpu", TPU_API, env)
    except ValueError as exc:
        raise ApiError(
            0, "INVALID_ARGUMENT", str(exc), action="TPU endpoint", hint="fix it"
        ) from None
    return tpu_v2.TpuClient(
        transport="rest",
        client_options={"api_endpoint": root.rstrip("/")},
        credentials=credentials(env),
    )


def transient(exc: Exception, policy: RetryPolicy) -> Transient | None:
    """The REST path's rule for google-api-core / transport exceptions."""
    from google.api_core import exceptions as gexc

    if isinstance(exc, gexc.GoogleAPICallError):
        code = exc.code if isinstance(exc.code, int) else 0
        if not policy.is_transient(code):
            return None
        headers = getattr(getattr(exc, "response", None), "headers", None) or {}
        return Transient(retry_after_seconds(headers.get("Retry-After")))
    if isinstance(exc, OSError):  # requests' ConnectionError and Timeout are OSErrors
        return Transient()
    return None


@contextmanager
def api_errors(action: str, environ: Mapping[str, str] | None = None) -> Iterator[None]:
    """google-api-core and transport exceptions -> ApiError (one line, with a hint)."""
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as auth_exc

    env = os.environ if environ is None else environ
    token_in_env = bool(env.get(TOKEN_ENV, "").strip())
    try:
        yield
    except gexc.GoogleAPICallError as exc:
        code = int(exc.code or 0) if isinstance(exc.code, int) else 0
        status = exc.grpc_status_code.name if exc.grpc_status_code else ""
        message, body, content_type, reason, retry_after = "", "", "", "", None
        details = ErrorDetails()
        # REST errors carry the API's own JSON: its status and message, never api-core's
        # "GET <url>: ..." rendering; an HTML page from the front end is rendered like the
        # REST path renders it (its HTTP status and name).
        response = getattr(exc, "response", None)
        if response is not None:
            body = str(getattr(response, "text", "") or "")
            headers = getattr(response, "headers", None) or {}
            content_type = str(headers.get("Content-Type", ""))
            reason = str(getattr(response, "reason", "") or "")
            retry_after = retry_after_seconds(headers.get("Retry-After"))
            try:
                err = response.json().get("error", {})
                status = str(err.get("status") or "")
                message = str(err.get("message") or "")
                details = ErrorDetails.parse(err.get("details"))
            except (AttributeError, ValueError, TypeError):
                status = ""
        elif exc.message:
            message = exc.message
        raise ApiError.from_parts(
            code, status, message, body=body, reason=reason, content_type=content_type,
            action=action, service="tpu", token_in_env=token_in_env, retry_after=retry_after,
            details=details,
        ) from None
    except auth_exc.GoogleAuthError as exc:
        if token_in_env:  # a refused bearer token: google-auth cannot refresh it
            raise ApiError(401, "UNAUTHENTICATED", "the access token was refused",
                           action=action, service="tpu", token_in_env=True) from None
        raise CredentialsError(f"{action}: {exc}") from None
    except CallTimedOut as exc:
        raise ApiError(0, "DEADLINE_EXCEEDED", str(exc), action=action, service="tpu",
                       hint=DEADLINE_HINT) from None
    except (OSError, ValueError) as exc:
        # requests' ConnectionError is an OSError; a garbled body surfaces as ValueError.
        raise ApiError(0, "UNAVAILABLE", type(exc).__name__, action=action,
                       service="tpu") from None


def node_view(node: Any) -> NodeView:
    endpoints = list(node.network_endpoints)
    ip = endpoints[0].access_config.external_ip if endpoints else ""
    created = node.create_time if node.create_time else None
    if created is not None and not created.year > 1970:
        created = None
    return NodeView(
        name=node.name,
        state=node.state.name,
        health=node.health.name,
        external_ip=ip or None,
        create_time=created,
        accelerator_type=node.accelerator_type,
        spot=bool(node.scheduling_config.spot or node.scheduling_config.preemptible),
        health_description=node.health_description,
    )


class NodeCalls:
    """The node half of tpuserve.gcp.tpu.client.TpuClient: google-cloud-tpu's client (built on
    first use by `_node_factory`), called through the same retry policy as the REST half."""

    _node_factory: Callable[[], Any]
    _node_client: Any = None
    _environ: Mapping[str, str] | None
    policy: RetryPolicy
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    poll_interval: float
    deadline: float | None  # the running command's end (GoogleApi's), or None

    @property
    def node_client(self) -> Any:
        if self._node_client is None:
            self._node_client = self._node_factory()
        return self._node_client

    def _node_call(self, action: str, fn: Callable[[], T], *, deadline: float | None = None,
                   ) -> T:
        """One node call through the edge's retry loop; failures as one-line ApiErrors.
        Retries end with `deadline` (an absolute clock time) or the command's, if sooner."""
        ends = [t for t in (deadline, self.deadline) if t is not None]
        end = min(ends) if ends else None

        def bounded() -> T:
            # google-cloud-tpu's `timeout` is requests' per-read one: a server trickling its
            # answer holds the call past it. The whole try ends within its cap and `end`.
            budget = CALL_TIMEOUT_S if end is None else min(CALL_TIMEOUT_S, end - self.clock())
            why = "the command's deadline passed" if budget <= 0 else (
                f"no complete answer within {budget:.1f} s")
            return within(budget, fn, lambda: CallTimedOut(why))

        with api_errors(action, self._environ):
            return call_with_retry(bounded, lambda exc: transient(exc, self.policy),
                                    policy=self.policy, deadline=end,
                                    clock=self.clock, sleep=self.sleep)

    def get_node(self, d: Deployment) -> NodeView | None:
        """The stack's node, or None when it does not exist."""
        name = node_path(d)
        try:
            node = self._node_call(f"get node {name}", lambda: self.node_client.get_node(
                name=name, retry=None, timeout=CALL_TIMEOUT_S))
        except ApiError as exc:
            if exc.proves_not_found:
                return None
            raise
        return node_view(node)

    def guest_attributes(self, d: Deployment, namespace: str) -> dict[str, str]:
        """{key: value} of one guest-attribute namespace; {} while none were written (the API
        answers NOT_FOUND for an empty namespace, and refuses while the VM is not up)."""
        name = node_path(d)
        try:
            resp = self._node_call(f"get guest attributes of {name}",
                                   lambda: self.node_client.get_guest_attributes(
                                       request={"name": name, "query_path": f"{namespace}/"},
                                       retry=None, timeout=CALL_TIMEOUT_S))
        except ApiError as exc:
            if exc.code in (404, 400) or exc.status in ("NOT_FOUND", "FAILED_PRECONDITION"):
                return {}
            raise
        out: dict[str, str] = {}
        for attrs in resp.guest_attributes:
            for item in attrs.query_value.items:
                if item.namespace in ("", namespace):
                    out[item.key] = item.value
        return out

    def delete_node(self, d: Deployment) -> bool:
        """Ask for the node's deletion (the caller polls `get_node` until it is gone, on its
        own clock); False when it was already gone. Idempotent: retried like a read."""
        name = node_path(d)
        try:
            self._node_call(f"delete node {name}", lambda: self.node_client.delete_node(
                name=name, retry=None, timeout=CALL_TIMEOUT_S))
        except ApiError as exc:
            if exc.proves_not_found:
                return False
            raise
        return True

    def node_metadata(self, name: str) -> dict[str, str] | None:
        """The metadata of node `name` (projects/P/locations/Z/nodes/N), or None when the node
        does not exist."""
        try:
            node = self._node_call(f"get node {name}", lambda: self.node_client.get_node(
                name=name, retry=None, timeout=CALL_TIMEOUT_S))
        except ApiError as exc:
            if exc.proves_not_found:
                return None
            raise
        return dict(node.metadata)

    def update_node_metadata(
        self, name: str, metadata: Mapping[str, str], *, timeout: float = UPDATE_TIMEOUT_S,
    ) -> None:
        """Replace node `name`'s metadata with `metadata` (the whole map: TPU API v2
        nodes.patch, updateMask=metadata) and wait until the operation is done.

        Idempotent, so retried like a read. The operation is polled every poll interval until
        `timeout`; a poll whose transient errors outlast their retries is polled again. An
        operation that ends with an error raises it as an ApiError; one still running at
        `timeout` raises WaitTimeout.
        """
        from google.cloud import tpu_v2
        from google.protobuf import field_mask_pb2

        action = f"update the metadata of node {name}"
        start = self.clock()
        end = start + timeout
        node = tpu_v2.Node(name=name, metadata=dict(metadata))
        mask = field_mask_pb2.FieldMask(paths=["metadata"])
        future = self._node_call(action, lambda: self.node_client.update_node(
            node=node, update_mask=mask, retry=None, timeout=CALL_TIMEOUT_S), deadline=end)
        op = future.operation
        while not op.done:
            elapsed = self.clock() - start
            if elapsed >= timeout:
                raise WaitTimeout(
                    f"{action}: the operation {op.name} is still running after {elapsed:.0f} s "
                    "-> check the node's metadata (gcloud compute tpus tpu-vm describe), then "
                    "deploy again"
                )
            self.sleep(min(self.poll_interval, max(0.0, timeout - elapsed)))
            try:
                op = self._node_call(
                    f"get operation {op.name}",
                    lambda op_name=op.name: self.node_client.get_operation(
                        request={"name": op_name}, retry=None, timeout=CALL_TIMEOUT_S),
                    deadline=end,
                )
            except ApiError as exc:
                if not self.policy.is_transient(exc.code):
                    raise
        if op.HasField("error") and op.error.code:
            raise ApiError.from_status({"code": op.error.code, "message": op.error.message},
                                       action=action, service="tpu")
