"""The fleet's plan-time preflight, as API logic: `python -m tpuserve.fleet_check
preflight` (tpuserve/fleet_check.py: stdin, output, exit codes, the one deadline), run by the
fleet stack's `data.external.fleet_preflight` before any of its resources exists, calls it.

stdin is the data source's query, a JSON object of strings:
    project, region, zone, cluster, release_channel, min_master_version, machine_type,
    provisioning (comma-separated, in the stack's order), min_replicas, max_replicas,
    apis (comma-separated service names)
It proves three things, each only from an answer that shows it (anything else refuses):
- quota: Compute `regions.get`'s `quotas[]` holds, for each pool's provisioning model, the
  Compute Engine metric GKE's TPU nodes draw on (QUOTA_METRICS, keyed by accelerator), and the
  first pool's metric has room for min_replicas nodes (the pool's floor); room below
  max_replicas is a warning. A metric that is absent refuses unless TPUSERVE_FLEET_FORCE=1;
- versions: Container `getServerConfig` for the zone offers `min_master_version` in the
  release channel's `validVersions` (the cluster is created at it); once the fleet's cluster
  exists (Container `clusters.list`), its `currentMasterVersion` is at or above it instead;
- APIs: Service Usage `services.batchGet` answers state ENABLED for every API named.
All proven: stdout {"fleet": "ok", "warnings": "<n>", "warning_text": "<lines, '; '-joined>"}
(Terraform's external data source shows no stderr of a program that succeeds: the stack puts
`warning_text` in an output, so the plan shows it), the warnings also on stderr, exit 0.
Else ONE line per failure on stderr, each naming what to request or enable, exit 1; bad input:
exit 2. Never a traceback. Calls go through the Google API edge (tpuserve.gcp.api) inside one
deadline for the whole check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tpuserve.contracts import FLEET_FORCE_ENV as ENV_FORCE
from tpuserve.gcp.api import GoogleApi
from tpuserve.gcp.errors import ApiError
from tpuserve.gcp.fleet_query import QUOTA_METRICS, Query, gke_version

# The API roots, as gcloud's CLOUDSDK_API_ENDPOINT_OVERRIDES_<SERVICE> takes them (compute's
# override carries its service path, as gcloud's does).
COMPUTE_API = "https://compute.googleapis.com/compute/v1/"
CONTAINER_API = "https://container.googleapis.com/"
SERVICEUSAGE_API = "https://serviceusage.googleapis.com/"


@dataclass
class Findings:
    """What the check found: refusals (each one line) and warnings (each one line)."""

    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _denied(exc: ApiError, permission: str, what: str, project: str) -> str:
    # The permission the answer's ErrorInfo names, when it names one.
    permission = exc.details.metadata.get("permission") or permission
    return (f"cannot check {what}: permission denied ({exc.code} {exc.status}); grant your "
            f"account {permission} in project '{project}', then plan again")


def _disabled(exc: ApiError) -> bool:
    return exc.code == 403 and (exc.reason == "SERVICE_DISABLED"
                                or "has not been used in project" in exc.message)


def _api_failure(exc: ApiError, api: str, permission: str, what: str, project: str) -> str:
    if _disabled(exc):
        return (f"cannot check {what}: {api} is not enabled in project '{project}'; enable it "
                f"(gcloud services enable {api} --project {project}), then plan again")
    if exc.code == 403:
        return _denied(exc, permission, what, project)
    return f"cannot check {what}: {exc}"


# ----------------------------------------------------------------------------- quota


def _quota_rows(region: Any) -> dict[str, tuple[float, float]] | str:
    """metric -> (limit, usage) from a Region, or why the answer proves nothing."""
    if not isinstance(region, dict):
        return "the answer is not a Region"
    warning = region.get("quotaStatusWarning")
    if warning:
        code = warning.get("code") if isinstance(warning, dict) else None
        return f"Compute reported quotaStatusWarning {code or 'without a code'}"
    rows = region.get("quotas")
    if not isinstance(rows, list) or not rows:
        return "the answer lists no quotas"
    out: dict[str, tuple[float, float]] = {}
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("metric"), str):
            return "a quota row has no metric"
        limit, usage = row.get("limit"), row.get("usage")
        if (isinstance(limit, bool) or isinstance(usage, bool)
                or not isinstance(limit, (int, float)) or not isinstance(usage, (int, float))
                or limit < 0 or usage < 0):
            return f"quota {row['metric']} has no numeric limit and usage"
        out[row["metric"]] = (float(limit), float(usage))
    return out


def _chips(n: float) -> str:
    return f"{n:g} chip{'s' if n != 1 else ''}"


def check_quota(q: Query, api: GoogleApi, findings: Findings, *, force: bool,
                cluster_exists: bool) -> None:
    what = f"the TPU quota of region {q.region}"
    try:
        region = api.request("GET", f"projects/{q.project}/regions/{q.region}",
                             action=f"get region {q.region}")
    except ApiError as exc:
        findings.failures.append(_api_failure(exc, "compute.googleapis.com",
                                              "compute.regions.get", what, q.project))
        return
    rows = _quota_rows(region)
    if isinstance(rows, str):
        findings.failures.append(f"cannot check {what}: {rows}; nothing proves the fleet's "
                                 "nodes fit, plan again later")
        return
    metrics = QUOTA_METRICS[q.accelerator]
    per_node = q.chips_per_node
    first = metrics[q.provisioning[0]]
    seen: set[str] = set()
    for model in q.provisioning:
        metric = metrics[model]
        if metric in seen:
            continue
        seen.add(metric)
        pools = [m for m in q.provisioning if metrics[m] == metric]
        who = f"{'/'.join(pools)} pool{'s' if len(pools) > 1 else ''}"
        request = (f"request {metric} quota in {q.region} (IAM & Admin > Quotas, Compute "
                   f"Engine API)")
        if metric not in rows:
            line = (f"quota {metric} for the fleet's {who} ({q.accelerator}) is not in region "
                    f"{q.region}'s quotas: {request}")
            if force:
                findings.warnings.append(f"{line}; {ENV_FORCE}=1: planning anyway")
            else:
                findings.failures.append(f"{line}, or set {ENV_FORCE}=1 to plan anyway")
            continue
        limit, usage = rows[metric]
        # A running fleet's own nodes are in `usage`: then only the limit is compared.
        room = limit if cluster_exists else limit - usage
        basis = (f"limit {limit:g}" if cluster_exists
                 else f"limit {limit:g} - usage {usage:g} = {room:g}")
        need_min = q.min_replicas * per_node
        need_max = q.max_replicas * per_node
        if metric == first and room < need_min:
            findings.failures.append(
                f"quota {metric} in {q.region} leaves {_chips(room)} ({basis}): the {who}'s "
                f"floor of fleet.min_replicas = {q.min_replicas} node(s) x {per_node} needs "
                f"{_chips(need_min)}; {request} of at least {need_min:g} available")
        elif room < need_max:
            findings.warnings.append(
                f"quota {metric} in {q.region} leaves {_chips(room)} ({basis}): fewer than "
                f"fleet.max_replicas = {q.max_replicas} node(s) x {per_node} = "
                f"{_chips(need_max)}; the {who} stop growing there ({request} to grow further)")


# ----------------------------------------------------------------------------- versions


def check_versions(q: Query, api: GoogleApi, findings: Findings,
                   existing: dict[str, Any] | None) -> None:
    """A new cluster: its channel offers the floor (it is created at it). The fleet's cluster
    already there: its control plane runs the floor or later (min_master_version is read at
    create only; the channel may no longer offer the floor itself)."""
    if existing is not None:
        running = existing.get("currentMasterVersion")
        have, floor = gke_version(str(running)), gke_version(q.floor)
        if have is None or floor is None or have < floor:
            findings.failures.append(
                f"cluster {q.cluster} in {q.zone} runs GKE {running or '(no version given)'}, "
                f"below the fleet's floor {q.floor} (the InferencePool CRD needs it): upgrade "
                f"its control plane (gcloud container clusters upgrade {q.cluster} --master "
                f"--zone {q.zone} --project {q.project} --cluster-version {q.floor} or later)")
        return
    what = f"the GKE versions of the {q.channel} channel in {q.zone}"
    try:
        config = api.request("GET", f"v1/projects/{q.project}/locations/{q.zone}/serverConfig",
                             action=f"get the GKE server config of {q.zone}")
    except ApiError as exc:
        findings.failures.append(_api_failure(
            exc, "container.googleapis.com", "container.clusters.list", what, q.project))
        return
    channels = config.get("channels") if isinstance(config, dict) else None
    entry = None
    if isinstance(channels, list):
        entry = next((c for c in channels
                      if isinstance(c, dict) and c.get("channel") == q.channel), None)
    offered = entry.get("validVersions") if isinstance(entry, dict) else None
    if not isinstance(offered, list) or not offered:
        findings.failures.append(
            f"cannot check {what}: the server config lists no valid versions for the channel; "
            "nothing proves the cluster can be created at "
            f"{q.floor} (tpuserve/contracts.py MIN_MASTER_VERSION), plan again later")
        return
    if q.floor in offered:
        return
    floor = gke_version(q.floor)
    above = sorted((v for v in offered if (gv := gke_version(v)) is not None and floor
                    and gv >= floor), key=lambda v: gke_version(v) or ())
    if above:
        fix = (f"it offers {', '.join(above[:3])}: raise MIN_MASTER_VERSION in "
               "tpuserve/contracts.py to one of them")
    else:
        fix = ("it offers nothing at or above it (the InferencePool CRD needs it): set "
               "fleet.release_channel to a channel that does (RAPID is first to get it)")
    findings.failures.append(
        f"the {q.channel} channel in {q.zone} does not offer GKE {q.floor} (the fleet "
        f"cluster's min_master_version): {fix}")


# ----------------------------------------------------------------------------- APIs


def check_apis(q: Query, api: GoogleApi, findings: Findings) -> None:
    what = f"the APIs enabled in project '{q.project}'"
    try:
        answer = api.request(
            "GET", f"v1/projects/{q.project}/services:batchGet",
            params={"names": [f"projects/{q.project}/services/{a}" for a in q.apis]},
            action=f"get the state of {len(q.apis)} APIs")
    except ApiError as exc:
        findings.failures.append(_api_failure(exc, "serviceusage.googleapis.com",
                                              "serviceusage.services.get", what, q.project))
        return
    states: dict[str, str] = {}
    services = answer.get("services") if isinstance(answer, dict) else None
    for svc in services if isinstance(services, list) else []:
        if isinstance(svc, dict) and isinstance(svc.get("name"), str):
            # Service Usage answers with the project NUMBER in the name.
            states[svc["name"].rsplit("/services/", 1)[-1]] = str(svc.get("state"))
    off = [a for a in q.apis if states.get(a) != "ENABLED"]
    for name in off:
        state = states.get(name)
        said = f"state {state}" if state else "no state in the answer"
        findings.failures.append(
            f"API {name} is not proven enabled in project '{q.project}' ({said}): enable it "
            f"(gcloud services enable {name} --project {q.project}), then plan again")


# ----------------------------------------------------------------------------- cluster


def existing_cluster(q: Query, api: GoogleApi) -> dict[str, Any] | None:
    """The fleet's cluster if it exists already (its nodes then count in the quota's usage,
    and its own version is what matters). Only a complete listing that names it says so;
    anything else is taken as "not there": the new-cluster checks, stricter, apply."""
    try:
        listing = api.request("GET", f"v1/projects/{q.project}/locations/{q.zone}/clusters",
                              action=f"list the GKE clusters of {q.zone}")
    except ApiError:
        return None
    if not isinstance(listing, dict) or listing.get("missingZones"):
        return None
    clusters = listing.get("clusters")
    found = [c for c in clusters if isinstance(c, dict) and c.get("name") == q.cluster] \
        if isinstance(clusters, list) else []
    return found[0] if len(found) == 1 else None


def check(q: Query, apis: Mapping[str, GoogleApi], *, force: bool) -> Findings:
    """Every check of the query, in turn: the APIs, the versions, the quota."""
    findings = Findings()
    check_apis(q, apis["serviceusage"], findings)
    existing = existing_cluster(q, apis["container"])
    check_versions(q, apis["container"], findings, existing)
    check_quota(q, apis["compute"], findings, force=force, cluster_exists=existing is not None)
    return findings


def make_apis(environ: Mapping[str, str]) -> dict[str, GoogleApi]:
    """One edge client per service (endpoint overrides and TPUSERVE_TIME_SCALE honoured)."""
    return {"compute": GoogleApi("compute", COMPUTE_API, environ=environ),
            "container": GoogleApi("container", CONTAINER_API, environ=environ),
            "serviceusage": GoogleApi("serviceusage", SERVICEUSAGE_API, environ=environ)}
