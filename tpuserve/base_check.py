"""`python -m tpuserve.base_check preflight|teardown`: the checks Terraform runs around a
deployment's base stack (a serving stack's plan-time preflight, the base's destroy guard).

The name is written into deployed stacks' Terraform, so it stays. This is the process: the
command, stdin (preflight's query), the environment (teardown's TPUSERVE_BASE_*, from
tpuserve.contracts), what is printed, the run's one deadline and the exit codes; what is asked
of Google's APIs, and what an answer proves, is tpuserve.gcp.base_check's (its docstring says
both commands' protocol in full).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import IO

from tpuserve import contracts, entry_point
from tpuserve.bounded_call import client_deadline
from tpuserve.contracts import BASE_DEPLOYMENT_ENV as ENV_DEPLOYMENT
from tpuserve.contracts import BASE_FORCE_ENV as ENV_FORCE
from tpuserve.contracts import BASE_PROJECT_ENV as ENV_PROJECT
from tpuserve.contracts import BASE_REGION_ENV as ENV_REGION
from tpuserve.gcp.api import GoogleApi
from tpuserve.gcp.base_check import (
    UsageError,
    census,
    check_base,
    check_common,
    make_apis,
    parse_query,
    preflight_message,
)
from tpuserve.gcp.errors import ApiError

PROG = contracts.BASE_CHECK.prog

# One run's bound, every call and retry beneath it included (the edge caps one try at 30 s and
# one call's retries at 120 s; teardown lists two kinds in each zone of a region, and GKE).
DEADLINE_S = {"preflight": 300.0, "teardown": 600.0}


def preflight(stdin: IO[str], stdout: IO[str], stderr: IO[str],
              apis: Mapping[str, GoogleApi]) -> int:
    try:
        text = stdin.read()
    except UnicodeDecodeError as exc:
        raise UsageError(f"preflight: stdin is not UTF-8 text ({exc.reason})") from None
    query = parse_query(text)
    result = check_base(query, apis)
    message = preflight_message(query, result)
    if message is not None:
        print(f"tpuserve: {message}", file=stderr)
        return 1
    json.dump({"base": "ok", "checked": str(result.checked)}, stdout)
    stdout.write("\n")
    return 0


def teardown(environ: Mapping[str, str], stdout: IO[str], stderr: IO[str],
             apis: Mapping[str, GoogleApi]) -> int:
    project, deployment, region = (environ.get(k, "").strip()
                                   for k in (ENV_PROJECT, ENV_DEPLOYMENT, ENV_REGION))
    unset = [k for k, v in ((ENV_PROJECT, project), (ENV_DEPLOYMENT, deployment),
                            (ENV_REGION, region)) if not v]
    if unset:
        raise UsageError(f"teardown: {', '.join(unset)} unset (the base stack's destroy "
                         "provisioner sets them)")
    check_common(project, deployment, region, "teardown")
    force_raw = environ.get(ENV_FORCE, "").strip()
    if force_raw not in ("", "0", "1"):
        raise UsageError(f"teardown: {ENV_FORCE} = {force_raw!r}: 1 destroys the base even "
                         "with serving stacks up, 0 or unset does not")
    force = force_raw == "1"
    where = f"deployment '{deployment}' in project '{project}' ({region})"
    seen = census(apis, project, region, deployment)
    found = seen.found
    prefix = "tpuserve: warning: " if force else "tpuserve: "
    for survivor in found:
        print(f"{prefix}{survivor.line()}", file=stderr)
    if seen.unproven:
        why = "; ".join(map(str, seen.unproven))
        if force:
            print(f"tpuserve: warning: could not list the serving stacks of {where} to the "
                  f"end ({why}); {ENV_FORCE}=1: destroying the base anyway", file=stderr)
            return 0
        up = (f"{len(found)} resource(s) of its serving stacks are up, and nothing proves "
              "that no other" if found else "nothing proves that no")
        print(f"tpuserve: teardown: {why}; the base of {where} was NOT destroyed: {up} serving "
              f"stack is up (set {ENV_FORCE}=1 to destroy it anyway)", file=stderr)
        return 1
    if not found:
        off = (f" ({' and '.join(seen.off)} {'is' if len(seen.off) == 1 else 'are'} not "
               f"enabled in project '{project}')" if seen.off else "")
        print(f"tpuserve: no serving stack of deployment '{deployment}' in {region}{off}: the "
              "base may go", file=stdout)
        return 0
    n = len(found)
    resources = (f"{n} TPU resource{'s' if n != 1 else ''}"
                 if all(s.kind != "GKE cluster" for s in found)
                 else f"{n} resource{'s' if n != 1 else ''}")
    if force:
        print(f"{prefix}{ENV_FORCE}=1: destroying the base of {where} anyway; the {resources} "
              "above lose their network, service accounts and secrets (and keep billing until "
              "destroyed)", file=stderr)
        return 0
    print(f"tpuserve: the base of {where} was NOT destroyed: {resources} of its serving "
          f"stacks {'is' if n == 1 else 'are'} still up; destroy them first (commands above), "
          f"or set {ENV_FORCE}=1 to destroy the base anyway", file=stderr)
    return 1


USAGE = f"""usage: {PROG} preflight|teardown

  preflight  Terraform external data source: stdin {{"project", "deployment", "region",
             "base_command", "secrets", "buckets", "service_accounts"}} (strings; the lists
             comma-separated); stdout {{"base": "ok", "checked": "<n>"}}
  teardown   the base's destroy guard: ${ENV_PROJECT}, ${ENV_DEPLOYMENT}, ${ENV_REGION}
             (${ENV_FORCE}=1: warn instead of refusing)

Exit: 0 ok; 1 base missing / serving stacks up / an answer that proves nothing / API error
(one line on stderr); 2 bad input."""


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
        if len(args) != 1 or args[0] not in contracts.BASE_CHECK.commands:
            raise UsageError(f"expected one command, preflight or teardown (got "
                             f"{' '.join(args) or 'none'}); see {PROG} --help")
        clients = apis if apis is not None else make_apis(env)
        seconds = DEADLINE_S[args[0]]
        hint = (f"{PROG} {args[0]} ends every call within {seconds:g} s in all (its overall "
                "deadline): try again once the API answers")
        with contextlib.ExitStack() as bounds:
            for api in {id(a): a for a in clients.values()}.values():
                bounds.enter_context(client_deadline(api, seconds, hint=hint))
            if args[0] == "preflight":
                return preflight(stdin or sys.stdin, out, err, clients)
            return teardown(env, out, err, clients)

    # Terraform shows stderr: one line, never a traceback.
    return entry_point.run(body, err, usage=(UsageError,), failed=(ApiError,),
                           prefix=f"{args[0]}: " if args else "",
                           unexpected=args[0] if args else PROG)

if __name__ == "__main__":
    sys.exit(main())
