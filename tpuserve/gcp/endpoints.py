"""Where Google's APIs are, and which scope and token variable reach them: gcloud's own
environment variables, so one override points both gcloud and this code at a fake (issue 3,
"Conventions"). Constants only, and no imports beyond the standard library: nothing here loads
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
