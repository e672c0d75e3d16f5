"""The contracts between processes are stated once, in tpuserve/contracts.py: no other source
file spells an entry point's environment variable, a Terraform id that review and the summary
read, an entry point's module or the fleet's shared constants; the stacks take none of them from
the Google API layer, and that layer imports nothing above it."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuserve import contracts
from tpuserve.paths import REPO_ROOT

CONTRACTS = REPO_ROOT / "tpuserve" / "contracts.py"


def sources(root: Path = REPO_ROOT) -> list[Path]:
    """The product's Python (not tests, not templates: those render from the contract)."""
    return sorted([*(root / "tpuserve").rglob("*.py"), *(root / "stacks").glob("*.py"),
                   root / "main.py"])


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def strings(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every string literal of PATH but its docstrings (f-strings: their
    literal parts)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.lineno, node.value


# The settings' override layers are the user's interface, named in messages and help as the
# settings are: their reads use the constants; prose may name them.
USER_FACING = {contracts.CONFIG_ENV, contracts.PROJECT_ENV, contracts.ZONE_ENV}


def env_names() -> list[str]:
    return sorted(v for k, v in vars(contracts).items() if k.endswith("_ENV")
                  and isinstance(v, str) and v not in USER_FACING)


LOGICAL_IDS = (contracts.TPU_NODE_ID, contracts.BILLING_GUARD_ID, contracts.QUEUED_RESOURCE_ID,
               contracts.NODE_METADATA_ID, contracts.K8S_BUNDLE_ID, contracts.TEARDOWN_GUARD_ID)
NAMES = (contracts.TPU_NODE_TYPE, contracts.NODE_POOL_TYPE, contracts.DATA_RESOURCE,
         contracts.USD_PER_HOUR_OUTPUT, contracts.DORMANT_OUTPUT, *LOGICAL_IDS)


def id_uses(path: Path) -> Iterator[tuple[int, str]]:
    """Where PATH names a Terraform type or logical id of the contract as a literal: a
    construct's id (a call's second argument), an override_logical_id, a key looked up or
    tested (`x["k8s_bundle"]`, `"teardown_guard" in x`, `x.get("google_tpu_v2_vm")`)."""
    tree = ast.parse(path.read_text(), filename=str(path))

    def literal(node: ast.AST) -> str | None:
        return node.value if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                              and node.value in NAMES) else None

    for node in ast.walk(tree):
        found: list[str | None] = []
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if name in ("override_logical_id", "get") and node.args:
                found.append(literal(node.args[0]))
            if len(node.args) >= 2:
                found.append(literal(node.args[1]))
        elif isinstance(node, ast.Subscript):
            found.append(literal(node.slice))
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn))
                                                   for op in node.ops):
            found.append(literal(node.left))
        yield from ((node.lineno, value) for value in found if value)


def spelled() -> dict[str, re.Pattern[str]]:
    """Each contract value and how a literal spelling of it is recognized."""
    words = {name: re.compile(rf"(?<![A-Za-z0-9_]){name}(?![A-Za-z0-9_])")
             for name in env_names()}
    for entry in contracts.ENTRY_POINTS:
        words[entry.module] = re.compile(rf"(?:^|-m ){re.escape(entry.module)}(?![a-z_.])")
    for value in (contracts.MIN_MASTER_VERSION,
                  *contracts.HEALTH_CHECK_RANGES):
        words[value] = re.compile(re.escape(value))
    for name in (contracts.EPP_DEPLOYMENT, contracts.ADAPTER_NAMESPACE,
                 contracts.ADAPTER_DEPLOYMENT,  # the bundle's names other programs read
                 contracts.MANAGED_BY_LABEL):  # the label the base's destroy guard reads
        words[name] = re.compile(rf"^{re.escape(name)}$")
    for logical_id in LOGICAL_IDS:  # an address in a string: terraform_data.k8s_bundle
        words[f"{contracts.DATA_RESOURCE}.{logical_id}"] = re.compile(
            rf"{contracts.DATA_RESOURCE}\.{logical_id}\b")
    return words


# Literals that only look like a contract's: the provider package's Python module of the same
# name (stacks/cdk.py tells the lean import from the full one by it).
NOT_CONTRACTS = {("stacks/cdk.py", "google_tpu_v2_vm")}


def respellings(root: Path = REPO_ROOT) -> list[str]:
    words = spelled()
    found = []
    for path in sources(root):
        if path == root / "tpuserve" / "contracts.py":
            continue
        for line, text in strings(path):
            found += [f"{path.relative_to(root)}:{line}: {value!r} in {text[:70]!r}"
                      for value, pattern in words.items() if pattern.search(text)]
        found += [f"{path.relative_to(root)}:{line}: {value!r} in {value!r}"
                  for line, value in id_uses(path)
                  if (str(path.relative_to(root)), value) not in NOT_CONTRACTS]
    return found


def test_no_contract_is_spelled_outside_the_contracts() -> None:
    assert respellings() == []


def test_the_scan_sees_a_respelling(tmp_path: Path) -> None:
    """The scan is not blind: each kind of name, written as the old code wrote it, is found."""
    (tmp_path / "tpuserve").mkdir()
    (tmp_path / "stacks").mkdir()
    (tmp_path / "main.py").write_text('TEARDOWN_ENV = "TPUSERVE_TEARDOWN"\n')
    (tmp_path / "stacks" / "x.py").write_text(
        '"""TPUSERVE_QR_BODY_GZ in a docstring is prose."""\n'
        'CLIENT = python_module("tpuserve.kubectl")\n'
        'res.override_logical_id("k8s_bundle")\n'
        'RANGES = ("35.191.0.0/16", "130.211.0.0/22")\n')
    (tmp_path / "tpuserve" / "y.py").write_text(
        'K8S = "terraform_data.k8s_bundle"\n'
        'ENV = "TPUSERVE_QR_BODY_GZ"\n'
        'm = f"set {x} or TPUSERVE_FLEET_FORCE=1"\n')
    found = "\n".join(respellings(tmp_path))
    for value in ("TPUSERVE_TEARDOWN", "tpuserve.kubectl", "'k8s_bundle' in 'k8s_bundle'",
                  "35.191.0.0/16", "130.211.0.0/22", "terraform_data.k8s_bundle",
                  "TPUSERVE_QR_BODY_GZ", "TPUSERVE_FLEET_FORCE"):
        assert value in found, value
    assert "x.py:1" not in found


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            out.add(node.module or "")
    return out


def test_the_stacks_read_no_name_from_the_google_api_layer() -> None:
    reach = {p.name: sorted(m for m in _imports(p) if m.startswith("tpuserve.gcp"))
             for p in (REPO_ROOT / "stacks").glob("*.py")}
    assert {k: v for k, v in reach.items() if v} == {}


def test_the_google_api_layer_imports_nothing_above_it() -> None:
    """tpuserve.gcp (with the Kubernetes client beside it) reaches down only: never the
    operations, the CLI, the review, the planner or an entry module."""
    above = ("tpuserve.ops", "tpuserve.cli", "tpuserve.review", "tpuserve.planner",
             *(e.module for e in contracts.ENTRY_POINTS))
    reach = {}
    for path in (REPO_ROOT / "tpuserve" / "gcp").rglob("*.py"):
        bad = sorted(m for m in _imports(path)
                     if any(m == a or m.startswith(a + ".") for a in above))
        if bad:
            reach[str(path.relative_to(REPO_ROOT))] = bad
    assert reach == {}


def test_the_google_api_layer_and_the_entry_modules_stay_small() -> None:
    paths = [*(REPO_ROOT / "tpuserve" / "gcp").rglob("*.py"),
             *(REPO_ROOT / "tpuserve" / f"{e.module.split('.')[1]}.py"
               for e in contracts.ENTRY_POINTS)]
    big = {str(p.relative_to(REPO_ROOT)): n for p in paths
           if (n := len(p.read_text().splitlines())) > 400}
    assert big == {}


@pytest.mark.parametrize("entry", [e for e in contracts.ENTRY_POINTS if e.commands],
                         ids=lambda e: e.module)
def test_each_entry_point_runs_by_its_name_and_says_its_commands(entry) -> None:
    """`python -m MODULE --help` answers, naming itself as the contract does and every
    command the stacks run."""
    done = subprocess.run([sys.executable, "-m", entry.module, "--help"], capture_output=True,
                          text=True, cwd=REPO_ROOT, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert f"usage: {entry.prog}" in done.stdout
    for command in entry.commands:
        assert command in done.stdout


def test_every_entry_module_is_there() -> None:
    """Deployed stacks and the workflow name these modules: each file exists by that name."""
    for entry in contracts.ENTRY_POINTS:
        assert (REPO_ROOT / Path(*entry.module.split("."))).with_suffix(".py").is_file()


class _Bad(Exception):
    pass


class _Failed(Exception):
    pass


@pytest.mark.parametrize(("raised", "code", "line"), [
    (_Bad("no such flag"), 2, "tpuserve: no such flag\n"),
    (_Failed("the API said 403"), 1, "tpuserve: arm: the API said 403; it was left in place\n"),
    (KeyboardInterrupt(), 130, "tpuserve: interrupted\n"),
    (RuntimeError("boom\n  at line 3"), 1,
     "tpuserve: preflight: unexpected RuntimeError: boom at line 3\n"),
])
def test_the_entry_skeleton_maps_each_failure_to_one_line_and_its_exit_code(
        raised: BaseException, code: int, line: str) -> None:
    import io

    from tpuserve import entry_point

    if isinstance(raised, _Failed):
        raised.add_note("it was left in place")

    def body() -> int:
        raise raised

    err = io.StringIO()
    assert entry_point.run(body, err, usage=(_Bad,), failed=(_Failed,), prefix="arm: ",
                           unexpected="preflight") == code
    assert err.getvalue() == line


def test_the_entry_skeleton_lets_through_what_a_program_does_not_map() -> None:
    import io

    from tpuserve import entry_point

    def body() -> int:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        entry_point.run(body, io.StringIO(), interrupt=False)
    with pytest.raises(ZeroDivisionError):
        entry_point.run(lambda: 1 // 0, io.StringIO())
    assert entry_point.run(lambda: 0, io.StringIO()) == 0
