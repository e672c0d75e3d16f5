"""`python -m tpuserve.fleet_check preflight`: the fleet stack's plan-time check of quota, GKE
versions and enabled APIs.

The name is written into the fleet stack's Terraform, so it stays. This is the process: stdin
(the data source's query, tpuserve.gcp.fleet_query), TPUSERVE_FLEET_FORCE, what is printed, the
whole check's one deadline and the exit codes; what is asked of Google's APIs, and what an
answer proves, is tpuserve.gcp.fleet_check's (its docstring says the protocol in full).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO

from tpuserve import contracts, entry_point
from tpuserve.contracts import FLEET_FORCE_ENV as ENV_FORCE
from tpuserve.gcp.api import GoogleApi
from tpuserve.gcp.errors import ApiError
from tpuserve.gcp.fleet_check import check
from tpuserve.gcp.fleet_check import make_apis as api_clients
from tpuserve.gcp.fleet_query import REQUIRED_KEYS, UsageError, parse_query

PROG = contracts.FLEET_CHECK.prog
# The whole check's bound: every call and retry beneath it ends by then.
DEADLINE_S = 90.0


def preflight(stdin: IO[str], stdout: IO[str], stderr: IO[str], apis: Mapping[str, GoogleApi],
              environ: Mapping[str, str]) -> int:
    force_raw = environ.get(ENV_FORCE, "").strip()
    if force_raw not in ("", "0", "1"):
        raise UsageError(f"preflight: {ENV_FORCE} = {force_raw!r}: 1 plans with an absent "
                         "quota metric (a warning), 0 or unset refuses")
    try:
        text = stdin.read()
    except UnicodeDecodeError as exc:
        raise UsageError(f"preflight: stdin is not UTF-8 text ({exc.reason})") from None
    q = parse_query(text)
    findings = check(q, apis, force=force_raw == "1")
    for line in findings.warnings:
        print(f"tpuserve: warning: {line}", file=stderr)
    for line in findings.failures:
        print(f"tpuserve: {line}", file=stderr)
    if findings.failures:
        return 1
    json.dump({"fleet": "ok", "warnings": str(len(findings.warnings)),
               "warning_text": "; ".join(findings.warnings)}, stdout)
    stdout.write("\n")
    return 0


USAGE = f"""usage: {PROG} preflight

  preflight  Terraform external data source: stdin {{{', '.join(f'"{k}"' for k in REQUIRED_KEYS)}}}
             (strings); stdout {{"fleet": "ok", "warnings": "<n>", "warning_text": "..."}}
             (${ENV_FORCE}=1: an absent quota metric warns instead of refusing)

Exit: 0 ok; 1 a check refused (one line each on stderr); 2 bad input."""


def make_apis(environ: Mapping[str, str]) -> dict[str, GoogleApi]:
    """One edge client per service, all inside one deadline."""
    try:
        apis = api_clients(environ)
    except ValueError as exc:  # a malformed endpoint override or TPUSERVE_TIME_SCALE
        raise UsageError(str(exc)) from None
    end = time.monotonic() + DEADLINE_S  # wall time: TPUSERVE_TIME_SCALE scales only pauses
    for api in apis.values():
        api.deadline = end
        api.deadline_hint = (f"{PROG} preflight ends every call within {DEADLINE_S:g} s in all "
                             "(its overall deadline): try again once the API answers")
    return apis


def main(
    argv: Sequence[str] | None = None, *, environ: Mapping[str, str] | None = None,
    stdin: IO[str] | None = None, stdout: IO[str] | None = None, stderr: IO[str] | None = None,
    apis: Mapping[str, GoogleApi] | None = None,
) -> int:
    env = os.environ if environ is None else environ
    args = list(sys.argv[1:] if argv is None else argv)
    out, err = stdout or sys.stdout, stderr or sys.stderr
    if args in (["-h"], ["--help"]):
        print(USAGE, file=out)
        return 0
    def body() -> int:
        if args != ["preflight"]:
            raise UsageError(f"expected one command, preflight (got {' '.join(args) or 'none'}"
                             f"); see {PROG} --help")
        clients = apis if apis is not None else make_apis(env)
        return preflight(stdin or sys.stdin, out, err, clients, env)

    # Terraform shows stderr: one line, never a traceback.
    return entry_point.run(body, err, usage=(UsageError,), failed=(ApiError,),
                           prefix="preflight: ", unexpected="preflight")

if __name__ == "__main__":
    sys.exit(main())
