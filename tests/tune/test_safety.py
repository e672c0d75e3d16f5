"""Whatever happens the node is never left on a half-tried config: a failed boot, a crash,
Ctrl-C (in a boot or a measurement), any exception, a node that went away; and a resume after
an interruption continues where it stopped."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.tune.conftest import WORKLOAD, MakeTuner, boot_order
from tests.tune.toy_node import ToyNode, expected_best
from tpuserve.tune import state as state_file
from tpuserve.tune.node import BootRecord, NodeGone
from tpuserve.tune.runner import DONE, FAILED, INTERRUPTED, NODE_GONE, Tuner
from tpuserve.tune.score import Constraints
from tpuserve.tune.state import TERRAFORM


def _at_measure(node: ToyNode, n: int, act: Callable[[], None]) -> None:
    """NODE's N-th measurement does ACT first (raise, or send the process a signal)."""
    real = node.measure
    calls = {"n": 0}

    def measure(workload: Any, reps: int) -> Any:
        calls["n"] += 1
        if calls["n"] == n:
            act()
        return real(workload, reps)

    node.measure = measure  # type: ignore[method-assign]


def _on(node: ToyNode, tuner: Tuner, cid: str) -> bool:
    """The node runs CID (a candidate id or TERRAFORM), and CID was fully tried."""
    if cid == TERRAFORM:
        return node.current is None
    ok = any(r.error is None and r.score is not None for r in tuner.state.runs[cid])
    return ok and node.current == tuner.candidates[cid].overlay()


def test_a_failed_boot_is_recorded_and_the_node_returns_to_the_last_good(
        make_tuner: MakeTuner) -> None:
    tuner, node, _ = make_tuner(1)  # seed 1: 0.94 hits the memory wall
    out = tuner.run()
    assert out.status == DONE
    failed = {cid: rs for cid, rs in tuner.state.runs.items() if rs[-1].error}
    assert failed and all(c.endswith("m0.94") for c in failed)
    assert all(rs[-1].error == "RuntimeProgramAllocationFailure" for rs in failed.values())
    # Right after each failed boot: the last config that booted again (or Terraform's script).
    last_good: tuple[str, Any] = ("restore", None)
    for i, (op, overlay) in enumerate(node.log):
        if op == "apply" and overlay["gpu_memory_utilization"] == 0.94:
            assert node.log[i + 1] == last_good
        else:
            last_good = (op, overlay)


def test_a_crash_while_measured_is_recorded(make_tuner: MakeTuner) -> None:
    first, second = boot_order(make_tuner, 2)[:2]
    tuner, node, _sp = make_tuner(2)
    node.crash = {second}
    out = tuner.run()
    assert out.status == DONE
    assert "status 139" in (tuner.state.runs[second][0].error or "")
    i = next(i for i, (op, o) in enumerate(node.log)
             if op == "apply" and o == tuner.candidates[second].overlay())
    assert node.log[i + 1] == ("apply", tuner.candidates[first].overlay())  # the last good


@pytest.mark.parametrize("where", ["measure", "apply"])
def test_ctrl_c_returns_to_the_last_good_and_a_resume_finishes(
        make_tuner: MakeTuner, tmp_path: Path, where: str) -> None:
    order = boot_order(make_tuner, 2)  # seed 2: every candidate boots
    tuner, node, sp = make_tuner(2)
    if where == "measure":
        node.interrupt_at_measure = 5
    else:
        node.interrupt_in_apply_of = order[5]
    out = tuner.run()
    assert out.status == INTERRUPTED
    last_good = order[3] if where == "measure" else order[4]
    assert out.node_on == last_good and _on(node, tuner, last_good)
    saved = state_file.load(tmp_path / "state.json")
    assert saved is not None and saved.node_on == last_good and saved.settled
    done_before = set(saved.runs)
    # Resume on the same node from the file: it finishes with the uninterrupted optimum.
    tuner2, node2, _ = make_tuner(2, state=saved, node=node)
    out2 = tuner2.run()
    assert out2.status == DONE
    assert out2.best == expected_best(node, sp.candidates, WORKLOAD, Constraints())
    for cid in done_before:  # what was measured before is not measured again at its rung
        rungs = [r.rung for r in tuner2.state.runs[cid]]
        assert len(rungs) == len(set(rungs)), (cid, rungs)
        assert rungs[0] == saved.runs[cid][0].rung
    assert node2.current is None


def test_resume_after_a_lost_connection_mid_candidate_returns_first(
        make_tuner: MakeTuner, tmp_path: Path) -> None:
    order = boot_order(make_tuner, 2)
    tuner, node, _sp = make_tuner(2)
    node.interrupt_at_measure = 3
    tuner.run()
    saved = state_file.load(tmp_path / "state.json")
    assert saved is not None
    # As if the process died during the next candidate's boot: the file says half-tried.
    saved.node_on, saved.settled = order[3], False
    node.current = tuner.candidates[order[3]].overlay()
    tuner2, _, _ = make_tuner(2, state=saved, node=node)
    n = len(node.log)
    assert tuner2.run().status == DONE
    assert node.log[n] == ("apply", tuner.candidates[order[1]].overlay())  # the last good


def test_any_exception_returns_to_the_last_good_and_propagates(make_tuner: MakeTuner) -> None:
    second = boot_order(make_tuner, 1)[1]
    tuner, node, _sp = make_tuner(1)

    def bug() -> None:
        raise RuntimeError("the benchmark's own bug")

    _at_measure(node, 3, bug)
    said: list[str] = []
    tuner.log = said.append
    with pytest.raises(RuntimeError):
        tuner.run()
    assert _on(node, tuner, second)
    assert said[-1] == f"the tuner failed; the node is on: {second}"


def test_a_node_that_went_away_keeps_the_state_for_the_next(
        make_tuner: MakeTuner, tmp_path: Path) -> None:
    tuner, node, _sp = make_tuner(2)
    node.gone_at_measure = 4
    out = tuner.run()
    assert out.status == NODE_GONE and "resumes" in out.message
    saved = state_file.load(tmp_path / "state.json")
    assert saved is not None and saved.node_on == TERRAFORM and len(saved.runs) == 3
    tuner2, node2, _ = make_tuner(2, state=saved)  # the next node: Terraform's script
    assert tuner2.run().status == DONE
    assert node2.current is None


def test_a_last_good_that_no_longer_boots_falls_back_to_terraform(
        make_tuner: MakeTuner) -> None:
    tuner, node, _sp = make_tuner(1)
    boots = {"n": 0}
    real = node.apply

    def flaky(overlay: Any) -> BootRecord:
        boots["n"] += 1
        if boots["n"] == 3:  # the third candidate fails, then its return to #2 fails too
            real(overlay)
            return BootRecord(False, 10.0, error="boot failed")
        if boots["n"] == 4:
            real(overlay)
            return BootRecord(False, 10.0, error="boot failed again")
        return real(overlay)

    node.apply = flaky  # type: ignore[method-assign]
    assert tuner.run().status == DONE
    assert node.log[4] == ("restore", None)  # c3 failed, its return to c2 too: Terraform


def test_when_even_terraforms_script_fails_it_says_what_to_run(make_tuner: MakeTuner) -> None:
    tuner, node, _ = make_tuner(1)
    node.interrupt_at_measure = 1
    node.restore = lambda: BootRecord(False, 5.0, error="watcher: failed")  # type: ignore
    out = tuner.run()
    assert out.status == INTERRUPTED
    tuner2, _, _ = make_tuner(1, state=tuner.state, node=node)
    out2 = tuner2.run()
    assert out2.status == FAILED and "npx cdktf deploy flex" in out2.message


def test_a_node_that_goes_away_while_being_put_back_after_ctrl_c_is_said_once(
        make_tuner: MakeTuner, tmp_path: Path) -> None:
    # Ctrl-C mid-benchmark, then the flex run ends while the last good config boots: the
    # interruption is reported (not a second error), and the state says a new node boots
    # Terraform's script, so a resume does not try to "return" a node that is not there.
    tuner, node, _ = make_tuner(2)
    node.interrupt_at_measure = 3

    def gone(overlay: Any) -> BootRecord:
        raise NodeGone("the flex run ended")

    real_apply = node.apply
    node.apply = lambda overlay: gone(overlay) if node.measures >= 3 else real_apply(overlay)
    node.restore = lambda: gone(None)
    out = tuner.run()
    assert out.status == INTERRUPTED and out.node_on == TERRAFORM
    saved = state_file.load(tmp_path / "state.json")
    assert saved is not None and saved.settled and saved.node_on == TERRAFORM


def test_a_ctrl_c_during_the_final_return_leaves_the_node_on_terraforms_script(
        make_tuner: MakeTuner) -> None:
    """SIGINT while Terraform's script boots at the end waits for that boot, then the run ends
    interrupted with the node there: never booted back onto the candidate tried last."""
    tuner, node, _ = make_tuner(2)
    real = node.restore
    fired: list[bool] = []

    def restore() -> BootRecord:
        if not fired:
            fired.append(True)
            os.kill(os.getpid(), signal.SIGINT)
        return real()

    node.restore = restore  # type: ignore[method-assign]
    out = tuner.run()
    assert fired and out.status == INTERRUPTED
    assert node.log[-1] == ("restore", None) and node.current is None
    assert out.node_on == TERRAFORM and tuner.state.node_on == TERRAFORM


def test_a_ctrl_c_while_a_failed_candidate_is_put_back_does_not_boot_it_again(
        make_tuner: MakeTuner, tmp_path: Path) -> None:
    """Seed 1's wall at 0.94: SIGINT while the node goes back after the first failure; the
    resume does not boot the failed candidate a second time."""
    tuner, node, _ = make_tuner(1)
    real = node.apply
    seen: dict[str, bool] = {"failed": False, "fired": False}

    def apply(overlay: Any) -> BootRecord:
        rec = real(overlay)
        if seen["failed"] and not seen["fired"]:  # the boot back to the last good one
            seen["fired"] = True
            os.kill(os.getpid(), signal.SIGINT)
        seen["failed"] = seen["failed"] or not rec.ok
        return rec

    node.apply = apply  # type: ignore[method-assign]
    assert tuner.run().status == INTERRUPTED and seen["fired"]
    saved = state_file.load(tmp_path / "state.json")
    assert saved is not None
    [failed] = [cid for cid, rs in saved.runs.items() if rs[-1].error]
    assert failed not in saved.pending
    node.apply = real  # type: ignore[method-assign]
    tuner2, _, _ = make_tuner(1, state=saved, node=node)
    assert tuner2.run().status == DONE
    assert len(tuner2.state.runs[failed]) == 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_put_the_node_back_as_ctrl_c_does(
        make_tuner: MakeTuner, sig: signal.Signals) -> None:
    """A closed SSH session (SIGHUP) or a kill (SIGTERM) mid-benchmark: the run ends
    interrupted, the node on the last good config, as after Ctrl-C."""
    order = boot_order(make_tuner, 2)
    tuner, node, _ = make_tuner(2)
    _at_measure(node, 3, lambda: os.kill(os.getpid(), sig))
    before = signal.getsignal(sig)
    out = tuner.run()
    assert out.status == INTERRUPTED and out.node_on == order[1]
    assert _on(node, tuner, order[1])
    assert signal.getsignal(sig) == before  # the run's handler is gone with the run
