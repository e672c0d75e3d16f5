"""The review package's shape: data flows one way between its modules, tpuserve.settings is
reached through config_facts alone, and the plan gate stays light enough for the job that
holds the plan credential."""

from __future__ import annotations

import ast
import subprocess
import sys

from tpuserve.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "tpuserve" / "review"
# Each module may import only those before it (the order of the package docstring).
ORDER = ("redact", "gate", "revision_facts", "config_facts", "model", "effects", "k8s_objects",
         "compare", "markdown", "revisions", "synthesis", "run")


def _imports(name: str) -> set[str]:
    """Absolute names of the modules `tpuserve/review/NAME.py` imports."""
    tree = ast.parse((PACKAGE / f"{name}.py").read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = "tpuserve.review." if node.level else ""
            out.add(base + (node.module or ""))
    return out


def test_every_module_is_listed_and_small() -> None:
    found = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert found == set(ORDER)
    for name in ORDER:
        assert len((PACKAGE / f"{name}.py").read_text().splitlines()) < 400, name


def test_data_flows_one_way() -> None:
    for i, name in enumerate(ORDER):
        inside = {m.removeprefix("tpuserve.review.") for m in _imports(name)
                  if m.startswith("tpuserve.review.")}
        assert inside <= set(ORDER[:i]), f"{name} imports {inside - set(ORDER[:i])}"


def test_only_config_facts_reaches_the_settings() -> None:
    reach = {name for name in ORDER
             if any(m == "tpuserve.settings" or m.startswith("tpuserve.settings.")
                    for m in _imports(name))}
    assert reach == {"config_facts"}


def test_the_gate_runs_by_its_old_name_without_the_reviewer() -> None:
    code = ("import sys, runpy\nsys.argv = ['x', '--help']\ntry:\n"
            "    runpy.run_module('tpuserve.plan_gate', run_name='__main__')\n"
            "except SystemExit as e:\n    print(e.code, file=sys.stderr)\n"
            "print('\\n'.join(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=REPO_ROOT)
    assert "usage: python -m tpuserve.plan_gate" in done.stdout
    assert done.stderr.strip() == "0"
    loaded = set(done.stdout.split())
    assert "tpuserve.review.gate" in loaded
    assert not {m for m in loaded if m.startswith(("tpuserve.settings", "tpuserve.planner",
                                                   "tpuserve.render", "tpuserve.review.run"))}
