"""Key rotation's drift: the key refresher (STATE_DIR/refresh_key.sh) carries every
function of the boot (declare -f) but only a listed set of its variables, and runs under
set -u. A global added to lib.sh and read by a function the refresher may call, but missing
from install_refresher's list, kills the refresher on a path a rotation test may not take
(it happened once: GA_LOST, read only on a guest-attribute write). This reads the refresher a
real boot wrote and checks, statically, every function reachable from refresh_key: each
upper-case variable it reads (a $NAME or a bare name in arithmetic) is defined in the
refresher's header, local to the function, or set by the function itself."""

from __future__ import annotations

import re

from tests.render.boot.support import Cloud

# bash's own variables (and the environment a root systemd unit always has)
BASH_VARS = {
    "BASH", "BASHPID", "BASH_REMATCH", "BASH_SOURCE", "BASH_LINENO", "EPOCHREALTIME",
    "EPOCHSECONDS", "EUID", "FUNCNAME", "HOSTNAME", "IFS", "LINENO", "OPTARG", "OPTIND",
    "PIPESTATUS", "PPID", "PWD", "RANDOM", "REPLY", "SECONDS", "UID", "PATH", "HOME",
}
_FUNC = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*) \(\) \n\{ \n(.*?)\n\}$", re.M | re.S)
# $NAME / ${NAME / ${#NAME / ${!NAME, not ${NAME:-...} / ${NAME-...} (a default: safe under -u)
_REF = re.compile(r"\$\{?[#!]?([A-Z][A-Z0-9_]*)(?![A-Za-z0-9_])(?!:?[-=+?])")
_ARITH = re.compile(r"\(\((.*?)\)\)", re.S)
_NAME = re.compile(r"(?<![$\w])([A-Z][A-Z0-9_]*)(?![\w(])")
_ASSIGN = re.compile(r"(?:^|[\s;(])(?:local |declare [-\w]* |export |readonly )?"
                     r"([A-Z][A-Z0-9_]*)\+?=", re.M)
_LOCAL = re.compile(r"\blocal (?:-\w+ )*([^;\n]*)")


def functions(script: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in _FUNC.finditer(script)}


def reachable(funcs: dict[str, str], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        f = todo.pop()
        if f in seen or f not in funcs:
            continue
        seen.add(f)
        todo.extend(w for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", funcs[f]) if w in funcs)
    return seen


def reads(body: str) -> set[str]:
    names = set(_REF.findall(body))
    for expr in _ARITH.findall(body):
        names |= set(_NAME.findall(expr))
    return names


def defined_in(body: str) -> set[str]:
    names = set(_ASSIGN.findall(body))
    for decl in _LOCAL.findall(body):
        names |= set(re.findall(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)", decl))
    return names


def unbound_reads(refresher: str) -> dict[str, set[str]]:
    """Per reachable function, the globals it reads that the refresher never defines."""
    funcs = functions(refresher)
    header = refresher[: _FUNC.search(refresher).start()]
    top = set(_ASSIGN.findall(header)) | set(re.findall(r"^declare -\S+ ([A-Z_0-9]+)=", header,
                                                        re.M))
    missing = {}
    for f in reachable(funcs, "refresh_key"):
        gap = reads(funcs[f]) - top - defined_in(funcs[f]) - BASH_VARS
        if gap:
            missing[f] = gap
    return missing


def test_the_checker_sees_a_missing_global() -> None:
    # The class it guards: ga read GA_LOST (arithmetic) and the header did not set it.
    refresher = (
        "set -euo pipefail\nGA_OFF=0\ndeclare -- STACK=\"s\"\n"
        "ga () \n{ \n    local key=$1;\n    (( GA_OFF )) && return 0;\n"
        "    (( GA_LOST >= 3 )) || log \"$key ${FOO:-x}\"\n}\n"
        "log () \n{ \n    printf '%s %s\\n' \"$STACK\" \"$PHASE\"\n}\n"
        "unused () \n{ \n    echo \"$NOT_REACHED\"\n}\n"
        "refresh_key () \n{ \n    ga secret x\n}\n"
    )
    assert unbound_reads(refresher) == {"ga": {"GA_LOST"}, "log": {"PHASE"}}


def test_every_global_a_refresher_function_reads_is_defined_in_the_refresher(
    cloud: Cloud,
) -> None:
    node = cloud.node()
    node.run()
    refresher = (node.root / "var/lib/tpuserve/refresh_key.sh").read_text()
    assert "refresh_key" in functions(refresher)
    assert {"ga", "api_retry", "reload_proxy", "log"} <= reachable(functions(refresher),
                                                                    "refresh_key")
    assert unbound_reads(refresher) == {}
