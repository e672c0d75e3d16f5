"""Secret Manager v1 versions, through the REST edge (tpuserve.gcp.api): add one, list the
enabled ones, disable one. Request and answer shapes as the v1 discovery document has them
(secrets.addVersion: AddSecretVersionRequest {payload: {data, dataCrc32c}} -> SecretVersion;
secrets.versions.list; secrets.versions.disable: DisableSecretVersionRequest -> SecretVersion).
The payload is only ever in a request body, never in a URL, a log line or an error.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping

from tpuserve.gcp.api import GoogleApi
from tpuserve.gcp.endpoints import SECRETMANAGER_API
from tpuserve.gcp.errors import ApiError


def secretmanager(environ: Mapping[str, str] | None = None) -> GoogleApi:
    return GoogleApi("secretmanager", SECRETMANAGER_API, environ=environ)


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), bitwise: payloads are at most 64 KiB."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def add_version(api: GoogleApi, project: str, secret: str, data: bytes) -> str:
    """Add DATA as the secret's new (latest) version; its resource name. Sent once (a POST
    that may have acted is never repeated: a second one would add another version)."""
    body = {"payload": {"data": base64.b64encode(data).decode(),
                        "dataCrc32c": str(crc32c(data))}}
    answer = api.request("POST", f"v1/projects/{project}/secrets/{secret}:addVersion",
                         body=body, action=f"add a version to secret {secret}")
    name = answer.get("name")
    if not isinstance(name, str) or "/versions/" not in name:
        raise ApiError.from_parts(200, "UNKNOWN", "the answer names no version",
                                  action=f"add a version to secret {secret}",
                                  service="secretmanager")
    return name


def enabled_versions(api: GoogleApi, project: str, secret: str) -> list[str]:
    """The names of the secret's enabled versions, newest first."""
    names: list[str] = []
    token = ""
    for _page in range(100):
        params = {"filter": "state:ENABLED", "pageSize": 100, **({"pageToken": token} if token
                                                                 else {})}
        answer = api.request("GET", f"v1/projects/{project}/secrets/{secret}/versions",
                             params=params, action=f"list the versions of secret {secret}")
        names.extend(v["name"] for v in answer.get("versions") or []
                     if isinstance(v, dict) and isinstance(v.get("name"), str)
                     and v.get("state") == "ENABLED")
        token = answer.get("nextPageToken") or ""
        if not token:
            break
    return names


def disable_version(api: GoogleApi, name: str) -> None:
    """Disable one version by its resource name (projects/*/secrets/*/versions/*)."""
    answer = api.request("POST", f"v1/{name}:disable", body={}, idempotent=True,
                         action=f"disable {name}")
    if answer.get("state") != "DISABLED":
        raise ApiError.from_parts(200, "UNKNOWN", f"the answer says state "
                                  f"{answer.get('state')!r}, not DISABLED",
                                  action=f"disable {name}", service="secretmanager")
