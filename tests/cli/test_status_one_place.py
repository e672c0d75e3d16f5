"""The status modules keep each fact in one place: the kind is chosen only by
tpuserve.ops.status_kinds.status_kind, the dashboard link only by tpuserve.render.dashboard,
and no status module grows past 400 lines."""

from __future__ import annotations

import pytest

from tpuserve.paths import REPO_ROOT

STATUS_MODULES = ["tpuserve/ops/stack_status.py", "tpuserve/ops/fleet_status.py",
                  "tpuserve/ops/status_model.py", "tpuserve/ops/status_read.py",
                  "tpuserve/cli/status.py", "tpuserve/ops/fleet_pods.py",
                  "tpuserve/ops/fleet_gateway.py", "tpuserve/ops/fleet_autoscaler.py",
                  "tpuserve/ops/fleet_wait.py"]


def test_the_kind_is_chosen_only_in_status_kinds() -> None:
    for path in STATUS_MODULES:
        text = (REPO_ROOT / path).read_text()
        for test in ("is_flex", "is_fleet", "provisioning_model ==", '== "flex"',
                     '== "fleet"', '== "spot"', '== "ondemand"'):
            assert test not in text, f"{path}: {test} (ask tpuserve.ops.status_kinds)"
    assert "def status_kind(" in (REPO_ROOT / "tpuserve/ops/status_kinds.py").read_text()


def test_the_dashboard_link_is_built_in_one_place() -> None:
    for path in [*(REPO_ROOT / "tpuserve").rglob("*.py"), *(REPO_ROOT / "stacks").rglob("*.py")]:
        rel = path.relative_to(REPO_ROOT).as_posix()
        text = path.read_text()
        if rel != "tpuserve/render/dashboard.py":
            assert "dashboards/custom" not in text, rel
            assert "dashboard_url(d.gcp.project" not in text, rel
            assert "dashboard_url(self.d.gcp.project" not in text, rel


@pytest.mark.parametrize("path", [*STATUS_MODULES, "tpuserve/ops/status_kinds.py",
                                  "tpuserve/ops/kube_fields.py"])
def test_status_modules_stay_small(path: str) -> None:
    assert len((REPO_ROOT / path).read_text().splitlines()) < 400, path
