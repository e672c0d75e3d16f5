"""The checks Terraform runs around a deployment's long-lived base, as API logic:
`python -m tpuserve.base_check` (tpuserve/base_check.py: arguments, environment, output, exit
codes and the run's deadline) calls them.

    python -m tpuserve.base_check preflight   # Terraform `external` data source protocol
    python -m tpuserve.base_check teardown    # the base's destroy-time provisioner

preflight: every serving stack runs it at plan time, so a missing base is one clear error
before anything is created. stdin is the data source's query, a JSON object of strings:
    project, deployment, region, base_command       required
    secrets, buckets, service_accounts              comma-separated, may be empty
It asks Secret Manager (secrets.get), Cloud Storage (buckets.get) and IAM
(serviceAccounts.get) whether each exists: a 200 proves it only with the resource itself (its
`name`, or a service account's `email`, is the one asked for). All there: stdout {"base": "ok",
"checked": "<n>"}, exit 0. Anything missing: ONE line on stderr naming all of it and
`base_command`, exit 1; a 403: ONE line naming the permissions, exit 1; a query that names
nothing to check: exit 2 (nothing checked proves nothing).

teardown: reads TPUSERVE_BASE_PROJECT, TPUSERVE_BASE_DEPLOYMENT, TPUSERVE_BASE_REGION (and
TPUSERVE_BASE_FORCE). It lists the TPU nodes and queued resources of every zone of the region
and the project's GKE clusters (tpuserve.gcp.gke_clusters); those labelled
managed-by=tpuserve and deployment=<deployment> belong to serving stacks still up: one line
each on stderr (with `cdktf destroy <stack>`), a last line saying the base was not destroyed,
exit 1. The base may go (one line on stdout, exit 0) only on positive proof that none is
there: complete lists (no `unreachable` location, no missing zone, every page, at least one
zone), or an API proven off in this very project (tpuserve.gcp.service_disabled). Anything
else is ONE line naming what could not be proven, exit 1. TPUSERVE_BASE_FORCE=1: the same
lines as warnings, exit 0.

Each run ends within DEADLINE_S (preflight 300 s, teardown 600 s): every call beneath it, its
retries and each try's last byte included, is bounded by it (the edge's `deadline_within`), so
an API that hangs or trickles its answer cannot hold a plan or a destroy; Terraform's
`external` data source and `local-exec` have no timeout of their own. A call cut by it is one
line naming the bound (teardown: nothing is proven, the base is not destroyed).

Errors are one line on stderr (exit 1; bad input: exit 2), never a traceback. Calls go through
the Google API edge (tpuserve.gcp.api): its endpoint overrides, credentials and retries.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tpuserve.contracts import DEPLOYMENT_LABEL, MANAGED_BY, MANAGED_BY_LABEL, STACK_LABEL
from tpuserve.gcp.api import GoogleApi, UnprovenAnswer
from tpuserve.gcp.endpoints import IAM_API, SECRETMANAGER_API, STORAGE_JSON_API, TPU_API
from tpuserve.gcp.errors import ApiError
from tpuserve.gcp.gke_clusters import CONTAINER_API, CONTAINER_SERVICE, clusters_in_region
from tpuserve.gcp.service_disabled import CRM_API, CRM_SERVICE, proves_off, says_disabled
from tpuserve.gcp.tpu.listing import (
    list_nodes,
    list_queued_resources,
    node_labels,
    queued_resource_labels,
    zones_in_region,
)

# preflight's query (Terraform's `external` data source sends strings only).
REQUIRED_KEYS = ("project", "deployment", "region", "base_command")
LIST_KEYS = ("secrets", "buckets", "service_accounts")


# Project ids (also domain-scoped: example.com:proj), regions, deployment names: nothing that
# could change the URL a name is put into.
_PROJECT_RE = re.compile(r"(?:[a-z][a-z0-9.-]*[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]")
_REGION_RE = re.compile(r"[a-z]+(?:-[a-z]+)*\d+")
_DEPLOYMENT_RE = re.compile(r"[a-z][a-z0-9-]{0,61}[a-z0-9]")


class UsageError(Exception):
    """Bad input (query, environment): one line, exit 2."""


# ----------------------------------------------------------------------------- preflight


@dataclass(frozen=True)
class Kind:
    """One kind of base resource preflight checks: how to GET one, and what a 403 lacks."""

    key: str  # the query key listing them
    noun: str  # "secret", "bucket", "service account"
    service: str  # the edge's service name (endpoint override CLOUDSDK_API_ENDPOINT_..._<S>)
    root: str
    permission: str
    pattern: re.Pattern[str]
    path: Callable[[str, str], str]  # (project, name) -> path under the root
    field: str  # the answer's field that names the resource
    names: Callable[[str, str], bool]  # (field's value, name asked for) -> is it that one?


KINDS = (
    Kind("secrets", "secret", "secretmanager", SECRETMANAGER_API, "secretmanager.secrets.get",
         re.compile(r"[A-Za-z0-9_-]{1,255}"), lambda p, n: f"v1/projects/{p}/secrets/{n}",
         # Secret.name is projects/<project NUMBER>/secrets/<id>
         "name", lambda v, n: bool(re.fullmatch(rf"projects/[^/]+/secrets/{re.escape(n)}", v))),
    Kind("buckets", "bucket", "storage", STORAGE_JSON_API, "storage.buckets.get",
         re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]"), lambda p, n: f"b/{n}",
         "name", lambda v, n: v == n),
    Kind("service_accounts", "service account", "iam", IAM_API, "iam.serviceAccounts.get",
         re.compile(r"[a-z0-9][a-z0-9._+-]*@[a-z0-9][a-z0-9.-]*[a-z0-9]"),
         lambda p, n: f"v1/projects/{p}/serviceAccounts/{n}",
         "email", lambda v, n: v.lower() == n.lower()),
)


@dataclass(frozen=True)
class Query:
    project: str
    deployment: str
    region: str
    base_command: str
    names: dict[str, list[str]]  # Kind.key -> names, in the query's order, without repeats


def parse_query(text: str) -> Query:
    try:
        query = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"preflight: stdin is not JSON ({exc})") from None
    if not isinstance(query, dict):
        raise UsageError("preflight: stdin must be a JSON object of strings "
                         '(Terraform\'s external data source query), like {"project": ...}')
    unknown = sorted(set(query) - set(REQUIRED_KEYS) - set(LIST_KEYS))
    if unknown:
        raise UsageError(f"preflight: unknown query key(s) {', '.join(unknown)}; known: "
                         f"{', '.join(REQUIRED_KEYS + LIST_KEYS)}")
    not_str = sorted(k for k, v in query.items() if not isinstance(v, str))
    if not_str:
        raise UsageError(f"preflight: query value(s) of {', '.join(not_str)} must be strings")
    missing = [k for k in REQUIRED_KEYS if not query.get(k, "").strip()]
    if missing:
        raise UsageError(f"preflight: the query lacks {', '.join(missing)}")
    project, deployment, region = (query[k].strip() for k in ("project", "deployment", "region"))
    check_common(project, deployment, region, "preflight: query")
    names: dict[str, list[str]] = {}
    for kind in KINDS:
        items = [n.strip() for n in query.get(kind.key, "").split(",") if n.strip()]
        bad = [n for n in items if not kind.pattern.fullmatch(n)]
        if bad:
            raise UsageError(f"preflight: query {kind.key}: {bad[0]!r} is not a valid "
                             f"{kind.noun} name")
        names[kind.key] = list(dict.fromkeys(items))
    if not any(names.values()):
        raise UsageError(f"preflight: the query names no {', '.join(k.key for k in KINDS)}: "
                         "with nothing checked, nothing proves the base is there")
    return Query(project, deployment, region, " ".join(query["base_command"].split()), names)


def check_common(project: str, deployment: str, region: str, where: str) -> None:
    if not _PROJECT_RE.fullmatch(project):
        raise UsageError(f"{where}: project {project!r} is not a Google Cloud project id")
    if not _DEPLOYMENT_RE.fullmatch(deployment):
        raise UsageError(f"{where}: deployment {deployment!r} is not a deployment name "
                         "(lowercase letters, digits, hyphens)")
    if not _REGION_RE.fullmatch(region):
        raise UsageError(f"{where}: region {region!r} is not a region (like us-west4)")


@dataclass
class PreflightResult:
    checked: int
    missing: list[tuple[Kind, str]]
    denied: list[tuple[Kind, str]]
    disabled: list[str] = field(default_factory=list)  # APIs not enabled (their things: missing)


def check_base(query: Query, apis: Mapping[str, GoogleApi]) -> PreflightResult:
    """GET every named resource: present (200 with that very resource), missing (404, or its
    API proven off in the project) or not ours to see (403). Anything else (after the edge's
    retries: an answer that is not the resource, a SERVICE_DISABLED whose consumer is not
    provably the project) raises ApiError."""
    result = PreflightResult(0, [], [])
    for kind in KINDS:
        for name in query.names[kind.key]:
            api = apis[kind.service]
            action = f"get {kind.noun} {name}"
            try:
                data = api.request("GET", kind.path(query.project, name), action=action)
                value = data.get(kind.field)
                if not (isinstance(value, str) and kind.names(value, name)):
                    shown = repr(value)[:80] if value is not None else "missing"
                    raise UnprovenAnswer(200, f"the answer is not {kind.noun} {name} (its "
                                         f"{kind.field} is {shown}): it proves nothing",
                                         action=action, service=api.service)
            except UnprovenAnswer:
                raise
            except ApiError as exc:
                if exc.code == 404:
                    result.missing.append((kind, name))
                elif says_disabled(exc):
                    proves_off(exc, query.project, apis.get(CRM_SERVICE))  # else: raises
                    result.missing.append((kind, name))
                    api_name = f"{kind.service}.googleapis.com"
                    if api_name not in result.disabled:
                        result.disabled.append(api_name)
                elif exc.code == 403:
                    result.denied.append((kind, name))
                else:
                    raise
            result.checked += 1
    return result


def _grouped(items: Sequence[tuple[Kind, str]]) -> str:
    """"secret a, b, bucket c": each kind once, in KINDS order, names in query order."""
    parts = []
    for kind in KINDS:
        names = [n for k, n in items if k is kind]
        if names:
            parts.append(f"{kind.noun} {', '.join(names)}")
    return ", ".join(parts)


def preflight_message(query: Query, result: PreflightResult) -> str | None:
    """The one line a failed preflight prints (without the 'tpuserve: ' prefix), or None."""
    where = (f"the base of deployment '{query.deployment}' in project '{query.project}' "
             f"(region {query.region})")
    if result.denied:
        permissions = ", ".join(dict.fromkeys(k.permission for k, _ in result.denied))
        also = f"; missing: {_grouped(result.missing)}" if result.missing else ""
        return (f"cannot check {where}: permission denied ({permissions}) on "
                f"{_grouped(result.denied)}{also}: grant your account {permissions} in project "
                f"'{query.project}' (or check the project id), then plan again")
    if result.missing:
        off = (f" (not enabled in the project: {', '.join(result.disabled)})"
               if result.disabled else "")
        return (f"the base of deployment '{query.deployment}' is not deployed in project "
                f"'{query.project}' (region {query.region}): missing {_grouped(result.missing)}"
                f"{off}. Create it first: {query.base_command}")
    return None


# ----------------------------------------------------------------------------- teardown


@dataclass(frozen=True)
class Survivor:
    """A resource of a serving stack of this deployment that is still there (a TPU node or
    queued resource, or a fleet's GKE cluster)."""

    kind: str  # "node", "queued resource" or "GKE cluster"
    name: str
    zone: str
    state: str
    stack: str  # its `stack` label ("" when it has none)

    def line(self) -> str:
        what = f"{self.kind} {self.name} ({self.state})"
        if self.stack:
            return (f"serving stack '{self.stack}' is still up: {what}; remove it with "
                    f"`cdktf destroy {self.stack}`")
        short = self.name.rsplit("/", 1)[-1]
        command = {
            "node": f"gcloud compute tpus tpu-vm delete {short} --zone {self.zone}",
            "queued resource": f"gcloud compute tpus queued-resources delete {short} --zone "
                               f"{self.zone} --force",
        }.get(self.kind, f"gcloud container clusters delete {short} --location {self.zone}")
        return f"a serving stack's {what} has no stack label; remove it with `{command}`"


def _state(raw: Mapping[str, Any]) -> str:
    state = raw.get("state")
    if isinstance(state, dict):  # a QR: {"state": {"state": "ACTIVE", ...}}
        state = state.get("state")
    return str(state or "STATE_UNSPECIFIED")


def _ours(labels: Mapping[str, str], deployment: str) -> bool:
    return labels.get(MANAGED_BY_LABEL) == MANAGED_BY and labels.get(DEPLOYMENT_LABEL) == deployment


def tpu_survivors(api: GoogleApi, project: str, region: str, deployment: str,
                  ) -> list[Survivor]:
    """Every node and queued resource of `deployment` in the zones of `region`."""
    found: list[Survivor] = []
    for zone in zones_in_region(api, project, region):
        for node in list_nodes(api, project, zone):
            labels = node_labels(node)
            if _ours(labels, deployment):
                found.append(Survivor("node", str(node.get("name", "")), zone, _state(node),
                                      labels.get(STACK_LABEL, "")))
        for qr in list_queued_resources(api, project, zone):
            labels = queued_resource_labels(qr)
            if _ours(labels, deployment):
                found.append(Survivor("queued resource", str(qr.get("name", "")), zone,
                                      _state(qr), labels.get(STACK_LABEL, "")))
    return found


def cluster_survivors(api: GoogleApi, project: str, region: str, deployment: str,
                      ) -> list[Survivor]:
    """Every GKE cluster of `deployment` in `region` or its zones (a fleet stack)."""
    return [Survivor("GKE cluster", c.name, c.location or "?", c.status,
                     c.labels.get(STACK_LABEL, ""))
            for c in clusters_in_region(api, project, region) if _ours(c.labels, deployment)]


@dataclass
class Census:
    """What teardown proved: the survivors, the APIs proven off, what could not be proven."""

    found: list[Survivor] = field(default_factory=list)
    off: list[str] = field(default_factory=list)  # "the TPU API", ...
    unproven: list[ApiError] = field(default_factory=list)


PARTS: tuple[tuple[str, str, Callable[[GoogleApi, str, str, str], list[Survivor]]], ...] = (
    ("tpu", "the TPU API", tpu_survivors),
    (CONTAINER_SERVICE, "the Kubernetes Engine API", cluster_survivors),
)


def census(apis: Mapping[str, GoogleApi], project: str, region: str, deployment: str,
           ) -> Census:
    """Every serving stack's resource of `deployment` in `region`, each API asked in turn."""
    out = Census()
    for service, title, find in PARTS:
        try:
            out.found.extend(find(apis[service], project, region, deployment))
        except ApiError as exc:
            try:
                if proves_off(exc, project, apis.get(CRM_SERVICE)):
                    out.off.append(title)  # off in this very project: nothing of it exists
                    continue
            except ApiError as refusal:
                exc = refusal
            out.unproven.append(exc)
    out.found.sort(key=lambda s: (s.stack, s.zone, s.kind != "queued resource", s.name))
    return out


def make_apis(environ: Mapping[str, str]) -> dict[str, GoogleApi]:
    """One edge client per service (endpoint overrides and TPUSERVE_TIME_SCALE honoured)."""
    try:
        apis = {kind.service: GoogleApi(kind.service, kind.root, environ=environ)
                for kind in KINDS}
        apis["tpu"] = GoogleApi("tpu", TPU_API, environ=environ)
        apis[CONTAINER_SERVICE] = GoogleApi(CONTAINER_SERVICE, CONTAINER_API, environ=environ)
        apis[CRM_SERVICE] = GoogleApi(CRM_SERVICE, CRM_API, environ=environ)
    except ValueError as exc:  # a malformed endpoint override or TPUSERVE_TIME_SCALE
        raise UsageError(str(exc)) from None
    return apis
