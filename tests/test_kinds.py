"""The kind registry (tpuserve/kinds) is the one place a serving kind is told apart: every list
of kinds derives from it, and no module outside it compares a kind's name."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
import typing
from pathlib import Path

import pytest

from tpuserve import kinds
from tpuserve.paths import REPO_ROOT

KIND_LITERALS = frozenset(k.provisioning_model for k in kinds.KINDS) | frozenset(
    k.name for k in kinds.KINDS)


def _sources() -> list[Path]:
    files = [REPO_ROOT / "main.py", *sorted((REPO_ROOT / "stacks").rglob("*.py")),
             *sorted((REPO_ROOT / "tpuserve").rglob("*.py"))]
    return [p for p in files if (REPO_ROOT / "tpuserve" / "kinds") not in p.parents]


def _kind_literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in KIND_LITERALS


def _names_the_model(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "provisioning_model"


def kind_comparisons(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comparison that tells a kind apart by its name: == / != against a
    kind's name, `in` a literal tuple/set/list of them, or any comparison of a
    `.provisioning_model`. A key test (`"fleet" in table`) or a dict key is no comparison."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        hit = any(_names_the_model(o) for o in operands)
        for op, left, right in zip(node.ops, operands, operands[1:], strict=False):
            if isinstance(op, ast.Eq | ast.NotEq | ast.Is | ast.IsNot):
                hit |= _kind_literal(left) or _kind_literal(right)
            elif isinstance(op, ast.In | ast.NotIn) and isinstance(
                    right, ast.Tuple | ast.Set | ast.List):
                hit |= any(_kind_literal(e) for e in right.elts)
        if hit:
            found.append((node.lineno, ast.unparse(node)))
    return found


def kind_lists(source: str) -> list[tuple[int, str]]:
    """(line, text) of every literal tuple, list or set, and every dict's keys, that name two
    or more kinds: a list of kinds kept apart from the registry (a loop over it, a table keyed
    by it, a `match` over its names) is what a new kind would miss."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            elts: list[ast.expr | None] = list(node.elts)
        elif isinstance(node, ast.Dict):
            elts = list(node.keys)
        elif isinstance(node, ast.Match):
            elts = [c.pattern.value for c in node.cases if isinstance(c.pattern, ast.MatchValue)]
        else:
            continue
        if len({e.value for e in elts if e is not None and _kind_literal(e)}) >= 2:
            found.append((node.lineno, ast.unparse(node)[:100]))
    return found


# Data keyed by the kinds' own keys, allowed where each row is a fact of its own source (a
# measured price, Google's quota metric) or a setting's default; the test below holds each to
# the registry, so a new kind fails it until its row is added.
DATA_KEYED_BY_KIND = {
    "tpuserve/facts.py": "PRICES_USD_PER_CHIP_HOUR: SPEC 2's price per price key",
    "tpuserve/gcp/fleet_query.py": "QUOTA_METRICS: GKE's quota metric per node-pool model",
    "tpuserve/settings/fleet.py": "fleet.provisioning's default: a list of pool models",
}


def test_no_list_of_kinds_outside_the_registry() -> None:
    offenders = [f"{p.relative_to(REPO_ROOT)}:{line}: {text}" for p in _sources()
                 if p.relative_to(REPO_ROOT).as_posix() not in DATA_KEYED_BY_KIND
                 for line, text in kind_lists(p.read_text(encoding="utf-8"))]
    assert not offenders, "derive the list from tpuserve/kinds:\n" + "\n".join(offenders)


def test_the_data_keyed_by_kind_covers_the_registry() -> None:
    from tpuserve.facts import PRICES_USD_PER_CHIP_HOUR
    from tpuserve.gcp.fleet_query import QUOTA_METRICS
    from tpuserve.settings.fleet import FleetSettings

    assert set(kinds.PRICE_KEYS) <= set(PRICES_USD_PER_CHIP_HOUR)
    assert all(set(row) == set(kinds.POOL_MODELS) for row in QUOTA_METRICS.values())
    assert set(FleetSettings().provisioning) <= set(kinds.POOL_MODELS)
    for path in DATA_KEYED_BY_KIND:  # each still holds such a table: the list cannot go stale
        assert kind_lists((REPO_ROOT / path).read_text(encoding="utf-8")), path


@pytest.mark.parametrize("code", [
    'for m in ("spot", "flex", "ondemand"): pass',
    'x = {"flex": "tpu-flex", "spot": "tpu-spot"}',
    'match m:\n    case "spot": pass\n    case "flex": pass',
    'x = ["fleet", "ondemand"]',
])
def test_the_scan_finds_a_list_of_kinds(code: str) -> None:
    assert kind_lists(code)


@pytest.mark.parametrize("code", [
    'x = ("spot", 1)',
    'x = {"spot": True}',
    'x = ("system", "tpu")',
])
def test_the_list_scan_lets_one_kind_by_name_be(code: str) -> None:
    assert not kind_lists(code)


def test_no_kind_is_compared_by_name_outside_the_registry() -> None:
    offenders = [f"{p.relative_to(REPO_ROOT)}:{line}: {text}" for p in _sources()
                 for line, text in kind_comparisons(p.read_text(encoding="utf-8"))]
    assert not offenders, "compare a kind's flags (tpuserve/kinds), not its name:\n" + "\n".join(
        offenders)


@pytest.mark.parametrize("code", [
    'if d.stack.provisioning_model == "flex": pass',
    'x = d.stack.provisioning_model != other',
    'x = model in ("spot", "ondemand")',
    'x = "fleet" == name',
    'x = m not in {"flex"}',
])
def test_the_scan_finds_a_kind_compared_by_name(code: str) -> None:
    assert kind_comparisons(code)


@pytest.mark.parametrize("code", [
    'x = "fleet" in table',           # a key of a table
    'x = {"spot": True}',             # a dict key
    'x = d.kind.on_gke',
    'x = name == "system"',
])
def test_the_scan_leaves_keys_and_other_strings(code: str) -> None:
    assert not kind_comparisons(code)


def test_the_lists_of_kinds_derive_from_the_registry() -> None:
    from tpuserve.settings import STACK_NAMES
    from tpuserve.settings.base import ProvisioningModel
    from tpuserve.settings.fleet import PoolModel
    from tpuserve.settings.sections import PricingSettings

    assert STACK_NAMES == tuple(k.name for k in kinds.KINDS) == ("spot", "ondemand", "flex",
                                                                 "fleet")
    assert typing.get_args(ProvisioningModel) == kinds.PROVISIONING_MODELS
    assert typing.get_args(PoolModel) == kinds.POOL_MODELS == ("flex", "spot", "ondemand")
    # Every priced kind has its [pricing] key, and [pricing] prices nothing else.
    # (and catalog_file: the refreshed Catalog file tpuserve/prices reads)
    assert set(PricingSettings.model_fields) - {"catalog_file"} == set(kinds.PRICE_KEYS)


def test_every_kind_has_its_stack_class_and_settings() -> None:
    from tpuserve.settings.stack import StackKeys, settings_class

    for kind in kinds.KINDS:
        module, _, name = kind.stack_class.partition(":")
        path = REPO_ROOT / (module.replace(".", "/") + ".py")
        assert module.startswith("stacks.") and re.search(
            rf"^class {name}\b", path.read_text(encoding="utf-8"), re.M), kind.stack_class
        assert set(kind.stack_keys) <= set(StackKeys.model_fields)
        assert set(settings_class(kind).model_fields) >= set(kind.stack_keys)


def test_dev_usage_lists_the_deployable_kinds_in_order() -> None:
    usage = re.search(r"^#   \./dev deploy STACK .*\(([^)]*)\)$",
                      (REPO_ROOT / "dev").read_text(encoding="utf-8"), re.M)
    assert usage is not None
    assert tuple(usage.group(1).split(" | ")) == kinds.STACK_NAMES


def test_the_default_config_names_each_kind_in_the_registrys_order() -> None:
    raw = tomllib.loads((REPO_ROOT / "config" / "default.toml").read_text(encoding="utf-8"))
    assert tuple(raw["stacks"]) == kinds.STACK_NAMES
    assert all(raw["stacks"][k.name]["provisioning_model"] == k.provisioning_model
               for k in kinds.KINDS)


def test_the_registry_imports_only_the_contracts() -> None:
    # tpuserve.contracts is standard library only: the names its summary lines read.
    code = ("import sys\nbefore = set(sys.modules)\nimport tpuserve.kinds\n"
            "print('\\n'.join(sorted(set(sys.modules) - before)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=REPO_ROOT)
    loaded = set(done.stdout.split())
    assert {m for m in loaded if m.startswith("tpuserve")} <= {
        "tpuserve", "tpuserve.contracts", "tpuserve.kinds", "tpuserve.kinds.synth_lines"}
    assert not {m for m in loaded if m.split(".")[0] in ("pydantic", "typer", "httpx")}


def test_ops_dispatch_on_the_kinds_capacity() -> None:
    from tpuserve.ops import recovery
    from tpuserve.ops.waiter import PHASE_QR, phases_of
    from tpuserve.settings import load

    found = {n: d for n, d in load(environ={}).deployments.items() if not d.kind.on_gke}
    assert {n: PHASE_QR in phases_of(d) for n, d in found.items()} == {
        "spot": False, "ondemand": False, "flex": True}
    assert {n: recovery._capacity(d) for n, d in found.items()} == {
        "spot": recovery.NODE, "ondemand": recovery.NODE, "flex": recovery.QUEUED_RESOURCE}
    assert {n: d.has_billing_guard for n, d in found.items()} == {
        "spot": True, "ondemand": True, "flex": False}


def test_every_ops_table_maps_every_shape_of_capacity() -> None:
    # A kind names its capacity; ops keys its behaviour by it in one table per concern, each
    # of which must know every shape the registry has (the fleet's recovery and wait: GKE's).
    from tpuserve.ops import recovery, status_kinds, waiter

    assert set(kinds.CAPACITIES) == {kinds.TPU_VM, kinds.QUEUED_RESOURCE, kinds.GKE}
    assert set(status_kinds.BY_CAPACITY) == set(kinds.CAPACITIES)
    assert set(recovery.BY_CAPACITY) == set(waiter.PHASES) == set(kinds.CAPACITIES) - {kinds.GKE}
    assert [k.capacity for k in kinds.KINDS] == [kinds.TPU_VM, kinds.TPU_VM,
                                                 kinds.QUEUED_RESOURCE, kinds.GKE]
