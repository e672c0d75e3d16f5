"""The fleet's way in: the Gateway (address, listeners, conditions), its endpoint picker, and
the endpoint they make, for status, wait, smoke and bench.

The fleet's endpoint is `http://ADDRESS` (the Gateway's HTTP listener), or `https://DOMAIN`
with `fleet.domain` (a Google-managed certificate: the system's CAs verify it, nothing is
pinned).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpuserve.gcp import kube
from tpuserve.render.fleet_bundle import DEPLOYMENT, EPP, GATEWAY, NAMESPACE
from tpuserve.settings import Deployment

from .errors import EXIT_USAGE, OpsError, one_line
from .kube_fields import as_int as _int
from .kube_fields import dig as _d
from .kube_fields import dig_list as _list
from .server import ServerTarget


def gateway_address(gw: dict[str, Any] | None) -> str | None:
    for a in _list(gw, "status", "addresses"):
        if isinstance(a, dict) and isinstance(a.get("value"), str) and a["value"].strip():
            return a["value"].strip()
    return None


def _listener_port(gw: dict[str, Any] | None, protocol: str) -> int | None:
    for ln in _list(gw, "spec", "listeners"):
        if isinstance(ln, dict) and ln.get("protocol") == protocol and _int(ln.get("port")):
            return _int(ln.get("port"))
    return None


def endpoint_url(d: Deployment, gw: dict[str, Any] | None) -> str | None:
    """The server's root URL through the Gateway (no /v1); None until it has an address
    (without a domain)."""
    if d.fleet.domain:
        port = _listener_port(gw, "HTTPS")
        return f"https://{d.fleet.domain}" + (f":{port}" if port not in (None, 443) else "")
    address = gateway_address(gw)
    if address is None:
        return None
    host = f"[{address}]" if ":" in address else address
    port = _listener_port(gw, "HTTP")
    return f"http://{host}" + (f":{port}" if port not in (None, 80) else "")


def gateway_conditions(gw: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The Gateway's status conditions as {type, status, reason, message} (strings)."""
    return [{k: str(c.get(k) or "") for k in ("type", "status", "reason", "message")}
            for c in _list(gw, "status", "conditions") if isinstance(c, dict)]


def gateway_not_serving(gw: dict[str, Any] | None) -> list[str]:
    """A line per condition the Gateway needs and has not True (Accepted, Programmed): an
    absent condition proves nothing and counts as not True."""
    by_type = {c["type"]: c for c in gateway_conditions(gw)}
    out = []
    for kind in ("Accepted", "Programmed"):
        c = by_type.get(kind)
        if c is None:
            out.append(f"Gateway {NAMESPACE}/{GATEWAY}: no {kind} condition yet")
        elif c["status"] != "True":
            why = ": ".join(x for x in (c["reason"], one_line(c["message"], 160)) if x)
            out.append(f"Gateway {NAMESPACE}/{GATEWAY}: {kind} is {c['status'] or 'unset'}"
                       + (f" ({why})" if why else ""))
    return out


def picker_view(dep: dict[str, Any] | None) -> dict[str, Any]:
    """The endpoint picker's Deployment as {name, ready, desired, image}."""
    containers = _list(dep, "spec", "template", "spec", "containers")
    image = next((c.get("image") for c in containers
                  if isinstance(c, dict) and c.get("name") == "epp"), None)
    return {"name": EPP, "ready": _int(_d(dep, "status", "readyReplicas")),
            "desired": _int(_d(dep, "spec", "replicas")),
            "image": image if isinstance(image, str) else None}


def picker_problem(dep: dict[str, Any] | None) -> str | None:
    v = picker_view(dep)
    if dep is None:
        return (f"no endpoint picker Deployment {NAMESPACE}/{EPP}: the Gateway's InferencePool "
                "has no picker and answers nothing (re-apply: npx cdktf deploy fleet)")
    if v["desired"] < 1 or v["ready"] < v["desired"]:
        return (f"endpoint picker {NAMESPACE}/{EPP}: {v['ready']}/{v['desired']} ready; with "
                "failureMode FailClose the Gateway answers nothing without it (`kubectl -n "
                f"{NAMESPACE} logs deploy/{EPP}`)")
    return None


def programmed(gw: dict[str, Any] | None) -> bool | None:
    for c in _list(gw, "status", "conditions"):
        if isinstance(c, dict) and c.get("type") == "Programmed":
            return c.get("status") == "True"
    return None





def fleet_target(d: Deployment, api_key: str | None, *, key_hint: str, pinned: bool = False,
                 connect: Callable[[Deployment], kube.Kube] = kube.connect) -> ServerTarget:
    """The fleet's endpoint as a server: plain HTTP, or https to the domain verified with the
    system's CAs (no pinned certificate: the Gateway's is Google-managed). PINNED: the user
    gave --fingerprint or --cacert, which go with --endpoint."""
    if pinned:
        raise OpsError("--fingerprint and --cacert go with --endpoint; the fleet's Gateway "
                       "serves plain HTTP or a Google-managed certificate (nothing to pin)",
                       exit_code=EXIT_USAGE)
    k = connect(d)
    if k.deployment(NAMESPACE, DEPLOYMENT) is None:
        raise OpsError(f"{d.name}: no Deployment {NAMESPACE}/{DEPLOYMENT} in cluster "
                       f"{kube.cluster_name(d)}", hint=f"deploy it: npx cdktf deploy {d.name}")
    base = endpoint_url(d, k.gateway(NAMESPACE, GATEWAY))
    if base is None:
        raise OpsError(f"{d.name}: the Gateway {NAMESPACE}/{GATEWAY} has no address yet",
                       hint=f"`tpuserve wait {d.name}` blocks until it serves")
    if d.access.api_key_proxy and not api_key:
        raise OpsError(f"{d.name}: the API-key proxy is on and no key was given",
                       hint=key_hint, exit_code=EXIT_USAGE)
    return ServerTarget(base, api_key or None)

