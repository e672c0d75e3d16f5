"""Where Google's APIs are, and which scope and token variable reach them: gcloud's own
environment variables, so one override points both gcloud and this code at a fake.
Constants only, and no imports beyond the standard library: nothing here loads
an HTTP stack.

- `CLOUDSDK_API_ENDPOINT_OVERRIDES_<SERVICE>` replaces a service's API root
  (`api_root("tpu", TPU_API)`, `api_root("secretmanager", ...)`, `api_root("storage", ...)`).
- `CLOUDSDK_AUTH_ACCESS_TOKEN` is used as a bearer token (tpuserve.gcp.credentials).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

TPU_API = "https://tpu.googleapis.com/"
SECRETMANAGER_API = "https://secretmanager.googleapis.com/"
STORAGE_API = "https://storage.googleapis.com/"
TOKEN_ENV = "CLOUDSDK_AUTH_ACCESS_TOKEN"


def api_root(service: str, default: str, environ: Mapping[str, str] | None = None) -> str:
    """gcloud's endpoint override for `service` (e.g. "tpu"), else `default`; ends with '/'."""
    env = os.environ if environ is None else environ
    root = env.get(f"CLOUDSDK_API_ENDPOINT_OVERRIDES_{service.upper()}") or default
    if not re.match(r"https?://[^/\s]+", root):
        raise ValueError(
            f"CLOUDSDK_API_ENDPOINT_OVERRIDES_{service.upper()} = {root!r}: must be an API root "
            "URL like https://tpu.googleapis.com/ or http://127.0.0.1:8123/"
        )
    return root if root.endswith("/") else root + "/"
# Cloud Storage's JSON API root as gcloud's override takes it (storage: https://HOST/storage/v1/,
# as the boot script's lib.sh reads it); STORAGE_API above is the bare host.
STORAGE_JSON_API = "https://storage.googleapis.com/storage/v1/"
IAM_API = "https://iam.googleapis.com/"  # override: CLOUDSDK_API_ENDPOINT_OVERRIDES_IAM
# The Cloud Billing Catalog API (services.skus.list); override: ..._OVERRIDES_CLOUDBILLING.
CLOUDBILLING_API = "https://cloudbilling.googleapis.com/"

# A Private Service Connect endpoint for Google APIs is named SERVICE-ENDPOINT.p.googleapis.com
# (cloud.google.com/vpc/docs/about-accessing-google-apis-endpoints): lowercase DNS labels, then
# `.p.googleapis.com`; the root is the bare host, over HTTPS on its default port.
_PSC_ROOT_RE = re.compile(
    r"https://((?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+p\.googleapis\.com)/?"
)
PSC_RULE = (
    "must be the https:// root of a Private Service Connect endpoint for Google APIs, "
    "https://NAME.p.googleapis.com/ (lowercase DNS labels; no port, path, query or user: Google "
    "names these endpoints SERVICE-ENDPOINT.p.googleapis.com, "
    "cloud.google.com/vpc/docs/about-accessing-google-apis-endpoints); unset, the billing "
    f"guard's task calls {TPU_API}"
)


def psc_root(setting: str, value: str) -> str:
    """`value` as an API root ending in '/' when it is a PSC endpoint's; else a ValueError
    naming the setting, the value and the rule (one line)."""
    m = _PSC_ROOT_RE.fullmatch(value)
    if m is None or len(m.group(1)) > 253:
        shown = repr(value) if len(value) <= 80 else f"{value[:80]!r}... ({len(value)} characters)"
        raise ValueError(f"{setting} = {shown}: {PSC_RULE}")
    return f"https://{m.group(1)}/"


def guard_task_root(setting: str, value: str | None) -> str:
    """Where a billing-guard task calls the TPU API: Google's production root, or a PSC
    endpoint. Never an endpoint override: the task runs in Google's cloud with the guard
    account's token, so a host of the caller's shell would get the token and not the delete."""
    return TPU_API if value in (None, TPU_API) else psc_root(setting, str(value))
