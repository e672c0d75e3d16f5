"""The import graph of tpuserve/ and stacks/: no cycles, no import running back up a
layer, no product file over 400 lines but pure arithmetic. Pure ast over the source files: no
module is imported, so the test is fast and sees imports inside functions too.

What counts:
- cycles: every import that runs (module level and inside functions); imports under
  `if TYPE_CHECKING:` never run and are the standard way to name a type without a runtime edge,
  so they do not make a cycle. A deferred import (the CLI keeps its start lean that way) still
  runs when its function does: a cycle through one fails at the first call order that meets the
  half-initialized module, so it is a cycle here.
- layers: every import, TYPE_CHECKING ones included (a type named from an upper layer still ties
  the lower one to it).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tpuserve", "stacks")
MAX_LINES = 400

# Lowest first. A module may import its own layer and those below; a module's layer is the
# longest prefix listed (a dotted module name, matching it or its submodules). Read from what
# the code does today (cbd6739):
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Constants and pure helpers everything shares; the planner's pure arithmetic, which the
    # settings validate with (settings/capacity.py); the Google API endpoints the settings
    # default to (settings/sections.py).
    ("facts", ("tpuserve.__init__", "tpuserve.facts", "tpuserve.paths", "tpuserve.bounded_call",
               # The accelerator table (each slice served, every fact with its source).
               "tpuserve.accelerators",
               "tpuserve.planner.geometry", "tpuserve.planner.arithmetic",
               "tpuserve.gcp.endpoints",
               # The names processes share, and the one-line error every layer raises.
               "tpuserve.contracts", "tpuserve.ops_error",
               # The registry of serving kinds (names, capacity flags): the planner's
               # arithmetic prices by it, so it sits this low.
               "tpuserve.kinds",
               # Where each accelerator is offered per provisioning model (reads the kinds).
               "tpuserve.zones")),
    # What a chip-hour costs where, with its source (the shipped snapshot, the refreshed
    # Catalog file): the settings price a deployment with it, so it sits below them.
    ("prices", ("tpuserve.prices",)),
    ("settings", ("tpuserve.settings",)),
    ("planner", ("tpuserve.planner",)),
    # Pure renderers of the boot script, proxy conf, bundle and queued-resource body.
    ("render", ("tpuserve.render",)),
    # The one Google API edge (it builds queued-resource bodies with render/).
    ("gcp", ("tpuserve.gcp",)),
    ("ops", ("tpuserve.ops",)),
    ("review", ("tpuserve.review",)),
    # `tpuserve tune`: candidates from the settings, measurements as ops/ reports them.
    ("tune", ("tpuserve.tune",)),
    ("cli", ("tpuserve.cli",)),
    # `python -m tpuserve[.X]`: what Terraform's steps, CI and users run; nothing imports them.
    ("entry points", ("tpuserve.__main__", "tpuserve.entry_point", "tpuserve.progress_lines",
                      "tpuserve.base_check",
                      "tpuserve.billing_guard", "tpuserve.fleet_check", "tpuserve.kubectl",
                      "tpuserve.queued_resource", "tpuserve.plan_gate",
                      "tpuserve.synth_summary")),
    # cdktf stacks stand on tpuserve; tpuserve never imports them.
    ("stacks", ("stacks",)),
    ("main", ("main",)),
)

# Upward imports of today, each to be removed (the Kubernetes API client moved down beside
# the Google API edge). The integrator empties this as they go; a listed edge
# that no longer exists fails the test, so the list cannot go stale.
KNOWN_UPWARD: frozenset[tuple[str, str]] = frozenset()

# Product files over MAX_LINES that are pure arithmetic or data: allowed for good.
PURE_DATA: frozenset[str] = frozenset({"tpuserve/planner/arithmetic.py"})
# Product files over MAX_LINES today, to be split; the integrator empties this as
# helpers split them. A listed file that is gone or no longer over fails the test.
TO_SPLIT: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    runs: bool  # False: under `if TYPE_CHECKING:`


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts)  # a package's __init__ keeps its name: tpuserve.settings.__init__


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.Module) -> Iterable[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement, and whether it runs (False under `if TYPE_CHECKING:`)."""
    stack: list[tuple[ast.AST, bool]] = [(tree, True)]
    while stack:
        node, runs = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, runs
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend((child, False) for child in node.body)
            stack.extend((child, runs) for child in node.orelse)
            continue
        stack.extend((child, runs) for child in ast.iter_child_nodes(node))


def edges_of(name: str, source: str, modules: Iterable[str]) -> list[Edge]:
    """The imports of module NAME (its SOURCE) that name one of MODULES."""
    known = set(modules)

    def canonical(dotted: str) -> str | None:
        if dotted in known:
            return dotted
        if f"{dotted}.__init__" in known:
            return f"{dotted}.__init__"
        return None

    package = name.split(".")[:-1]  # for pkg.__init__ too: the package itself
    out: list[Edge] = []
    for node, runs in _import_nodes(ast.parse(source)):
        targets: list[str | None] = []
        if isinstance(node, ast.Import):
            targets = [canonical(alias.name) for alias in node.names]
        else:
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                where = ".".join([*base, *([node.module] if node.module else [])])
            else:
                where = node.module or ""
            # `from pkg import sub` imports the submodule; `from pkg import name`, pkg itself.
            subs = [canonical(f"{where}.{alias.name}") for alias in node.names]
            targets = [s for s in subs if s]
            if len(targets) < len(node.names):
                targets.append(canonical(where))
        out.extend(Edge(name, t, node.lineno, runs) for t in targets if t and t != name)
    return out


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    found = {module_name(p, root): p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")}
    found["main"] = root / "main.py"
    return found


def graph(sources: Mapping[str, str]) -> list[Edge]:
    return [e for name, text in sources.items() for e in edges_of(name, text, sources)]


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer index)
    for index, (_name, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or module.startswith(prefix + ".")
            if matches and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def upward(edges: Iterable[Edge]) -> list[Edge]:
    out = []
    for e in edges:
        src, dst = layer_of(e.source), layer_of(e.target)
        if src is not None and dst is not None and dst > src:
            out.append(e)
    return out


def cycles(edges: Iterable[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative), over the
    imports that run."""
    succ: dict[str, list[str]] = {}
    for e in edges:
        if e.runs:
            succ.setdefault(e.source, []).append(e.target)
            succ.setdefault(e.target, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for start in sorted(succ):
        if start in index:
            continue
        work = [(start, iter(succ[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(succ[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


@functools.cache
def _project_edges() -> tuple[Edge, ...]:
    """Parsed once per run: every test below reads the same graph."""
    modules = project_modules()
    return tuple(graph({name: path.read_text() for name, path in modules.items()}))


def _lines(rel: str) -> int:
    return len((ROOT / rel).read_text().splitlines())


# ------------------------------------------------------------------------------ the project


def test_every_module_has_a_layer() -> None:
    # A module outside every layer would escape the layer check: a new package is placed here.
    missing = sorted(m for m in project_modules() if layer_of(m) is None)
    assert missing == [], f"add these modules to a layer of LAYERS: {missing}"


def test_no_import_cycles() -> None:
    assert cycles(_project_edges()) == []


def test_no_import_runs_back_up_a_layer() -> None:
    found = {(e.source, e.target): e for e in upward(_project_edges())}
    names = [name for name, _ in LAYERS]
    unexpected = [
        f"{e.source} (layer {names[layer_of(e.source)]}) line {e.line} imports {e.target} "
        f"(layer {names[layer_of(e.target)]})"
        for key, e in sorted(found.items()) if key not in KNOWN_UPWARD
    ]
    assert unexpected == []
    gone = sorted(KNOWN_UPWARD - found.keys())
    assert gone == [], f"no longer imported upward: remove from KNOWN_UPWARD: {gone}"


def test_tpuserve_never_imports_stacks() -> None:
    bad = [e for e in _project_edges()
           if e.source.startswith("tpuserve.") and e.target.split(".")[0] in ("stacks", "main")]
    assert bad == []


def _product_files() -> list[str]:
    """Every file of the product and its tooling that is not a test or a document: the
    packages' and the templates' Python, the templates (the boot script's bash parts, the
    fleet's manifests), the bench and the tools, `dev` and main.py. Upstream copies
    (templates/fleet/vendor/) are not ours to split."""
    files = [p for pkg in (*PACKAGES, "templates") for p in (ROOT / pkg).rglob("*.py")]
    files += list((ROOT / "templates").rglob("*.j2"))
    files += [p for d in ("bench", "tools") for p in (ROOT / d).iterdir() if p.is_file()]
    return sorted(str(p.relative_to(ROOT)) for p in [*files, ROOT / "main.py", ROOT / "dev"]
                  if "vendor" not in p.relative_to(ROOT).parts)


def test_the_size_check_sees_templates_tools_and_dev() -> None:
    files = _product_files()
    assert {"templates/boot/lib.sh.j2", "templates/fleet/service.yaml.j2", "bench/cli",
            "tools/snapshot_outputs.py", "dev", "main.py"} <= set(files)
    assert not [f for f in files if "vendor" in f or f.startswith("tests/")]


def test_no_product_file_over_400_lines() -> None:
    over = sorted(f for f in _product_files() if _lines(f) > MAX_LINES)
    unexpected = [f"{f}: {_lines(f)} lines" for f in over if f not in PURE_DATA | TO_SPLIT]
    assert unexpected == []


def test_the_size_allowlists_are_not_stale() -> None:
    assert not PURE_DATA & TO_SPLIT
    for rel in sorted(PURE_DATA | TO_SPLIT):
        assert (ROOT / rel).is_file(), f"{rel} is gone: remove it from its list"
        assert _lines(rel) > MAX_LINES, f"{rel} is {_lines(rel)} lines now: remove it"


# -------------------------------------------------------------- the checker finds what it must


def test_the_checker_sees_an_upward_import_inside_a_function() -> None:
    sources = {
        "tpuserve.settings.loader": "def f():\n    from tpuserve.cli import main\n",
        "tpuserve.cli.__init__": "from tpuserve.settings import loader\n",
    }
    (edge,) = upward(graph(sources))
    assert (edge.source, edge.target, edge.line) == (
        "tpuserve.settings.loader", "tpuserve.cli.__init__", 2)


def test_the_checker_finds_a_cycle_but_not_through_type_checking() -> None:
    a = "from tpuserve.render import b\n"
    b = "def f():\n    import tpuserve.render.a\n"
    assert cycles(graph({"tpuserve.render.a": a, "tpuserve.render.b": b})) == [
        ["tpuserve.render.a", "tpuserve.render.b"]]
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import tpuserve.render.a\n"
    edges = graph({"tpuserve.render.a": a, "tpuserve.render.b": typed})
    assert cycles(edges) == []
    assert [e.runs for e in edges if e.source == "tpuserve.render.b"] == [False]


def test_the_checker_resolves_relative_imports() -> None:
    sources = {
        "stacks.fleet": "from .cdk import App\nfrom . import literals\n",
        "stacks.cdk": "", "stacks.literals": "", "stacks.__init__": "",
        "tpuserve.ops.kube": "from ..gcp import kubectl\n", "tpuserve.gcp.kubectl": "",
    }
    assert sorted((e.source, e.target) for e in graph(sources)) == [
        ("stacks.fleet", "stacks.cdk"), ("stacks.fleet", "stacks.literals"),
        ("tpuserve.ops.kube", "tpuserve.gcp.kubectl")]
