"""A fake Cloud Billing Catalog API (v1 REST) on 127.0.0.1: `services.skus.list`.

  GET /v1/services/SERVICE_ID/skus?pageSize=N&pageToken=T
answers ListSkusResponse {"skus": [Sku], "nextPageToken": "..."} (cloudbilling.v1 discovery;
pageSize defaults to 5000, the token is opaque and is "" on the last page, as the real API
writes it). Errors as Google answers them, google.rpc.Status whose details always hold an
ErrorInfo (AIP-193: reason, domain, metadata): 401 without the bearer token
(CREDENTIALS_MISSING, or ACCESS_TOKEN_TYPE_UNSUPPORTED for a token it did not issue); 403
PERMISSION_DENIED when `denied`; 403 SERVICE_DISABLED (domain googleapis.com, metadata service
and consumer) when `disabled`; 404 for a service it does not know (and a ResourceInfo naming
it); 400 for a pageToken it did not issue or a pageSize below 0 (and a BadRequest field
violation naming the parameter). `fail_next` queues any other
Status (429 RESOURCE_EXHAUSTED with RetryInfo ...). Requests and answers go through tests/fakes/
discovery.guarded (cloudbilling.v1's document); an answer injected with `answer_next` is
marked deliberate and passes as it is. Point code at it with
`CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDBILLING=<endpoint>`.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any

from werkzeug import Request, Response

from .discovery import Discovery, deliberate, guarded
from .metadata import FaultQueue, LoopbackServer

_SKUS = re.compile(r"/v1/services/([^/]+)/skus")
COMPUTE, TPU = "6F81-5844-456A", "E000-3F24-B8AA"
SERVICE = "cloudbilling.googleapis.com"
METHOD = "google.cloud.billing.v1.CloudCatalog.ListSkus"
DEFAULT_PAGE = 5000


def tpu_sku(sku_id: str, description: str, regions: list[str], usd: float, *,
            usage: str = "OnDemand", unit: str = "h") -> dict[str, Any]:
    """One SKU as the Catalog writes it (Sku schema), priced in USD per `unit`."""
    units, nanos = int(usd), round((usd - int(usd)) * 1e9)
    return {
        "name": f"services/{COMPUTE}/skus/{sku_id}", "skuId": sku_id,
        "description": description,
        "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": "Compute",
                     "resourceGroup": "TPU", "usageType": usage},
        "serviceRegions": regions,
        "pricingInfo": [{
            "summary": "", "effectiveTime": "2026-12-01T00:00:00Z",
            "currencyConversionRate": 1,
            "pricingExpression": {
                "usageUnit": unit, "usageUnitDescription": "hour", "baseUnit": "s",
                "baseUnitDescription": "second", "baseUnitConversionFactor": 3600,
                "displayQuantity": 1,
                "tieredRates": [{"startUsageAmount": 0, "unitPrice": {
                    "currencyCode": "USD", "units": str(units), "nanos": nanos}}]},
            "aggregationInfo": {"aggregationLevel": "ACCOUNT", "aggregationInterval": "DAILY",
                                "aggregationCount": 1}}],
        "serviceProviderName": "Google",
        "geoTaxonomy": {"type": "REGIONAL", "regions": regions},
    }


@dataclass(frozen=True)
class SkusCall:
    service: str
    page_size: str | None
    page_token: str | None
    status: int


class FakeCloudBilling:
    """The public SKUs of a few services, paged."""

    def __init__(self, *, access_token: str, consumer: str = "projects/123456789012") -> None:
        self.access_token = access_token
        self.consumer = consumer
        self.services: dict[str, list[dict[str, Any]]] = {COMPUTE: [], TPU: []}
        self.denied = False
        self.disabled = False
        self.calls: list[SkusCall] = []
        self.faults = FaultQueue()
        self._tokens: dict[str, tuple[str, int]] = {}  # token -> (service, offset)
        self._lock = threading.Lock()
        # Every request and answer checked against cloudbilling.v1's discovery document.
        self.server = LoopbackServer(guarded(Discovery.load("cloudbilling", "v1"), self._handle))

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.port}/"

    def environ(self) -> dict[str, str]:
        return {"CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDBILLING": self.endpoint,
                "CLOUDSDK_AUTH_ACCESS_TOKEN": self.access_token,
                "TPUSERVE_TIME_SCALE": "0"}

    def start(self) -> FakeCloudBilling:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def __enter__(self) -> FakeCloudBilling:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def answer_next(self, body: object, status: int = 200, *, times: int = 1) -> None:
        """The next answers are exactly this JSON (a hostile or empty one), unchecked."""
        self.faults.add(lambda r: True, lambda: deliberate(Response(
            json.dumps(body), status, mimetype="application/json")), times)

    def fail_next(self, code: int, status: str, message: str, *,
                  details: list[dict[str, Any]] | None = None, times: int = 1) -> None:
        """The next answers are this google.rpc.Status."""
        body = {"error": {"code": code, "message": message, "status": status,
                          "details": details or []}}
        self.faults.add(lambda r: True, lambda: Response(
            json.dumps(body), code, mimetype="application/json"), times)

    def _handle(self, request: Request) -> Response:
        response = self.faults.take(request) or self._answer(request)
        m = _SKUS.fullmatch(request.path)
        with self._lock:
            self.calls.append(SkusCall(m[1] if m else request.path,
                                       request.args.get("pageSize"),
                                       request.args.get("pageToken"), response.status_code))
        return response

    def _answer(self, request: Request) -> Response:
        m = _SKUS.fullmatch(request.path)
        if m is None:  # the document routes only services.list here: not served
            return error(404, "NOT_FOUND", "The requested URL was not found on this server.",
                         reason="NOT_FOUND", domain="googleapis.com",
                         metadata={"service": SERVICE})
        auth = request.headers.get("Authorization")
        if auth != f"Bearer {self.access_token}":
            return error(401, "UNAUTHENTICATED", "Request had invalid authentication "
                         "credentials. Expected OAuth 2 access token, login cookie or other "
                         "valid authentication credential.",
                         reason="CREDENTIALS_MISSING" if not auth
                         else "ACCESS_TOKEN_TYPE_UNSUPPORTED",
                         domain="googleapis.com", metadata={"service": SERVICE, "method": METHOD})
        if self.disabled:
            return error(403, "PERMISSION_DENIED", "Cloud Billing API has not been used in "
                         f"project {self.consumer.split('/')[-1]} before or it is disabled.",
                         reason="SERVICE_DISABLED", domain="googleapis.com",
                         metadata={"service": "cloudbilling.googleapis.com",
                                   "consumer": self.consumer})
        if self.denied:
            return error(403, "PERMISSION_DENIED", "The caller does not have permission",
                         reason="IAM_PERMISSION_DENIED", domain="cloudbilling.googleapis.com")
        service = m[1]
        if service not in self.services:
            return error(404, "NOT_FOUND", f"Service {service} not found.",
                         reason="RESOURCE_NOT_FOUND", metadata={"service": SERVICE},
                         extra=[{"@type": "type.googleapis.com/google.rpc.ResourceInfo",
                                 "resourceType": "cloudbilling.googleapis.com/Service",
                                 "resourceName": f"services/{service}", "owner": "",
                                 "description": f"Service {service} not found."}])
        size = int(request.args.get("pageSize") or DEFAULT_PAGE)
        if size < 0:
            return error(400, "INVALID_ARGUMENT", "page_size must be non-negative.",
                         reason="INVALID_ARGUMENT", metadata={"service": SERVICE},
                         extra=[bad_request("page_size", "page_size must be non-negative.")])
        size = size or DEFAULT_PAGE
        token = request.args.get("pageToken")
        offset = 0
        if token:
            with self._lock:
                issued = self._tokens.get(token)
            if issued is None or issued[0] != service:
                return error(400, "INVALID_ARGUMENT", "Invalid page token.",
                             reason="INVALID_ARGUMENT", metadata={"service": SERVICE},
                             extra=[bad_request("page_token", "Invalid page token.")])
            offset = issued[1]
        page = self.services[service][offset:offset + size]
        following = ""
        if offset + size < len(self.services[service]):
            with self._lock:
                following = f"tok{len(self._tokens) + 1}"
                self._tokens[following] = (service, offset + size)
        body = {"skus": page, "nextPageToken": following}
        return Response(json.dumps(body), 200, mimetype="application/json")


def bad_request(field: str, description: str) -> dict[str, Any]:
    """A google.rpc.BadRequest detail naming one field (a 400's)."""
    return {"@type": "type.googleapis.com/google.rpc.BadRequest",
            "fieldViolations": [{"field": field, "description": description}]}


def error(code: int, status: str, message: str, *, reason: str,
          domain: str = SERVICE, metadata: dict[str, str] | None = None,
          extra: list[dict[str, Any]] | None = None) -> Response:
    """google.rpc.Status JSON: an ErrorInfo first (every error has one), then `extra`."""
    details = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
                "domain": domain, "metadata": metadata or {}}, *(extra or [])]
    body = {"code": code, "message": message, "status": status, "details": details}
    return Response(json.dumps({"error": body}), code, mimetype="application/json")
