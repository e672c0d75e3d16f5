"""The boot script helper in Python: the few steps bash does badly (JSON, base64, MD5).

Static: the script carries this file verbatim (tpuserve/render/boot_script.py puts it in one
single-quoted word), writes it under its state dir at every boot and runs
`python3 "$HELPER" SUBCOMMAND ARGS...`. Standard library only (the stock python3 of a TPU VM), no
config value in it. Secrets are read from and written to files named in argv, never passed as
values. Double quotes only: the rendered script then holds it without any quote escapes.

  error-status FILE        the "status" word of a Google API error body (the JSON API of Cloud
                           Storage has none: its first "reason"), or an empty line
  secret-payload RESP DEST the payload of a Secret Manager :access answer, stripped, into DEST
                           (created with the umask of the caller)
  key-rule RAW DEST        the nginx rule marking a request that carries exactly
                           "Authorization: Bearer <key>", from the raw key file RAW
  key-header RAW DEST      that header line, 0600, for curl -H @DEST (probes of the proxy)
  md5 FILE                 base64 MD5 of FILE, as Cloud Storage reports it in x-goog-hash
  generation FILE          the "generation" of an object resource, as an integer
  watch ARGS...            the watcher: re-runs the startup-script when its content changes in
                           metadata (see watch below; the boot script starts it, start_watcher)
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from email.utils import parsedate_to_datetime

# What the proxy accepts as a key: nothing nginx would read as syntax.
KEY_RE = r"[A-Za-z0-9._~+/=-]{16,512}"
KEY_RULE = (
    "# tpuserve: the API key (written at boot, 0600, tmpfs)\n"
    "if ($http_authorization = \"Bearer %s\") {\n"
    "    set $tpuserve_pass 1;\n"
    "}\n"
)


def error_status(path: str) -> None:
    try:
        with open(path) as f:
            e = json.load(f)["error"]
        print(e.get("status") or e["errors"][0]["reason"])
    except Exception:
        print("")


def secret_payload(response: str, dest: str) -> None:
    with open(response) as f:
        data = base64.b64decode(json.load(f)["payload"]["data"]).strip()
    with open(dest, "wb") as out:
        out.write(data)


def key_rule(raw: str, dest: str) -> None:
    with open(raw, "rb") as f:
        key = f.read().strip().decode("ascii", "replace")
    if not re.fullmatch(KEY_RE, key):
        sys.exit("the API key must be 16-512 characters of A-Z a-z 0-9 . _ ~ + / = -"
                 " (e.g. openssl rand -base64 32)")
    with open(dest, "w") as out:
        out.write(KEY_RULE % key)


def key_header(raw: str, dest: str) -> None:
    """The header line "Authorization: Bearer <key>" (for curl -H @DEST), written 0600: the
    probes of the proxy with a key by the boot, which never pass through argv."""
    with open(raw, "rb") as f:
        key = f.read().strip().decode("ascii", "replace")
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"Authorization: Bearer {key}\n")


def md5(path: str) -> None:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    print(base64.b64encode(h.digest()).decode())


def generation(path: str) -> None:
    with open(path) as f:
        print(int(json.load(f)["generation"]))


