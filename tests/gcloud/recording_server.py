"""A recording Google API endpoint on 127.0.0.1: what a client (gcloud) sends, kept verbatim.

Every request is checked against the API version's discovery document (tests/fakes/
discovery.py: method, path, query parameters and body; anything else is refused the way
Google refuses it), then recorded as (method, path, query, JSON body). Creates answer a valid
long-running Operation, so `gcloud ... --async` exits 0 without touching any cloud:
- TPU API (tpu.v2 / tpu.v2alpha1): google.longrunning.Operation, `done: false`;
- Kubernetes Engine API (container.v1beta1): an Operation of `operationType`
  CREATE_NODE_POOL, status RUNNING, also answered to the one operations.get gcloud makes
  after an `--async` node-pool create.
Any other method of the document is answered 501 UNIMPLEMENTED (google.rpc.Status JSON), so a
client that needs more than the create fails loudly instead of reading a made-up answer.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from werkzeug.wrappers import Request, Response

from tests.fakes.container import error
from tests.fakes.discovery import (
    Discovery,
    DiscoveryRefusal,
    check_answer,
    raw_path,
    request_body,
)
from tests.fakes.metadata import LoopbackServer

TPU_CREATES = {"tpu.projects.locations.nodes.create",
               "tpu.projects.locations.queuedResources.create"}
NODE_POOL_CREATE = "container.projects.locations.clusters.nodePools.create"
OPERATION_GET = "container.projects.locations.operations.get"


@dataclass(frozen=True)
class Recorded:
    """One request as the client sent it (the query without gcloud's `alt=json`)."""

    method: str
    path: str
    query: dict[str, str]
    body: Any


class RecordingServer:
    """One API version (`api`, `version` as in its discovery document), on a free port."""

    def __init__(self, api: str, version: str, *, access_token: str) -> None:
        self.doc = Discovery.load(api, version)
        self.access_token = access_token
        self.requests: list[Recorded] = []
        self.refusals: list[str] = []
        self._lock = threading.Lock()
        self._server = LoopbackServer(self._handle)

    @property
    def endpoint(self) -> str:
        """The value of CLOUDSDK_API_ENDPOINT_OVERRIDES_<API>."""
        return f"http://127.0.0.1:{self._server.port}/"

    def __enter__(self) -> RecordingServer:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    def creates(self) -> list[Recorded]:
        """The POSTs recorded so far."""
        with self._lock:
            return [r for r in self.requests if r.method == "POST"]

    def _handle(self, request: Request) -> Response:
        if request.headers.get("Authorization") != f"Bearer {self.access_token}":
            return error(401, "UNAUTHENTICATED", "Request had invalid authentication "
                         "credentials. Expected OAuth 2 access token, login cookie or other "
                         "valid authentication credential.")
        query = parse_qs(request.query_string.decode("latin-1"), keep_blank_values=True)
        raw = request_body(request)
        try:
            call = self.doc.check_request(request.method, raw_path(request), query, raw)
        except DiscoveryRefusal as refusal:
            with self._lock:
                self.refusals.append(f"{request.method} {request.full_path}: {refusal.message}")
            return refusal.response()
        body = json.loads(raw) if raw else None
        with self._lock:
            self.requests.append(Recorded(
                request.method, request.path,
                {k: v[0] for k, v in query.items() if k != "alt"}, body))
        return check_answer(self.doc, call, self._answer(call.method_id, request.path))

    def _answer(self, method_id: str, path: str) -> Response:
        parent = "/".join(path.strip("/").split("/")[1:5])  # projects/P/locations/L
        if method_id in TPU_CREATES:
            return _json({"name": f"{parent}/operations/operation-recorded", "done": False})
        if method_id in (NODE_POOL_CREATE, OPERATION_GET):
            location = parent.rsplit("/", 1)[-1]
            return _json({"name": "operation-recorded", "zone": location,
                          "location": location, "operationType": "CREATE_NODE_POOL",
                          "status": "RUNNING",
                          "selfLink": f"{self.endpoint}{self.doc.document['version']}/"
                                      f"{parent}/operations/operation-recorded",
                          "targetLink": f"{self.endpoint}{path.lstrip('/')}"})
        return error(501, "UNIMPLEMENTED", f"recording server: {method_id} is not recorded")


def _json(body: dict[str, Any]) -> Response:
    return Response(json.dumps(body), 200, content_type="application/json; charset=UTF-8")
