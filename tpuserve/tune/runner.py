"""The tuning loop: one candidate at a time, the state saved after each, the budget checked
before each, and the node never left on a half-tried config.

A candidate that fails to boot or crashes is recorded with its error and the node goes back to
the last good config (the last one fully tried, or Terraform's script). An interruption
(Ctrl-C, any exception) does the same before the tuner exits, with a second Ctrl-C deferred
until the node is back; a node that went away (a flex run's end) is left to its provider and
the state kept for a resume on the next node. At the end the node returns to Terraform's
script, or stays on the best config with keep_best.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

from tpuserve.tune import plan
from tpuserve.tune.candidates import Candidate
from tpuserve.tune.estimate import COLD_BOOT_S
from tpuserve.tune.estimate import estimate as estimate  # the command's estimate
from tpuserve.tune.node import BootRecord, CandidateFailed, NodeGone, TuneNode
from tpuserve.tune.score import Constraints, score
from tpuserve.tune.state import TERRAFORM, Run, TuneState
from tpuserve.tune.workload import Workload

DONE, BUDGET, INTERRUPTED, FAILED, NODE_GONE = "done", "budget", "interrupted", "failed", \
    "node-gone"


@dataclass(frozen=True)
class Budget:
    """--budget-usd and --budget-hours, checked before every candidate with the boot that puts
    Terraform's script back at the end reserved, so the whole run, return included, stays
    within them."""

    usd: float | None = None
    hours: float | None = None
    first_boot_s: float = COLD_BOOT_S  # before any run: SPEC 4's cold boot (measured)
    first_rep_s: float = 0.0  # before any run: one repetition's benchmark (derived)

    def return_s(self, state: TuneState) -> float:
        """The end's return boot, reserved: the longest warm boot seen, at least SPEC 4's cold
        one. The return is a restart of Terraform's script, which booted before the search, so
        its programs are in the compile cache: a candidate's long cold compile (a program set
        of its own) says nothing of it."""
        return max([self.first_boot_s, *(r.boot.boot_s for rs in state.runs.values()
                                          for r in rs if r.boot.ok and r.boot.cache_hit)])

    def next_s(self, state: TuneState, reps: int) -> float:
        """The next candidate: the mean boot so far and the measured seconds per repetition
        times its repetitions (before any run: the first boot and the derived benchmark)."""
        runs = [r for rs in state.runs.values() for r in rs]
        boot = sum(r.boot.boot_s for r in runs) / len(runs) if runs else self.first_boot_s
        measured = [r for r in runs if r.error is None and r.reps > 0]
        per_rep = (sum(r.measure_s for r in measured) / sum(r.reps for r in measured)
                   if measured else self.first_rep_s)
        return boot + per_rep * reps

    def over(self, state: TuneState, usd_per_hour: float, extra_s: float,
             what: str = "the next candidate") -> str | None:
        """Why EXTRA_S more node time, then the return boot, would pass the budget, or None."""
        back = self.return_s(state)
        hours = (state.spent_s + extra_s + back) / 3600
        tail = f" with the return to Terraform's script ({back:.0f} s)"
        if self.hours is not None and hours > self.hours:
            return (f"{what} would take the node time to {hours:.2f} h{tail}, past "
                    f"--budget-hours {self.hours:g} (spent {state.spent_s / 3600:.2f} h)")
        if self.usd is not None and hours * usd_per_hour > self.usd:
            return (f"{what} would take the cost to ${hours * usd_per_hour:.2f}{tail}, "
                    f"past --budget-usd {self.usd:g} (spent "
                    f"${state.spent_s / 3600 * usd_per_hour:.2f})")
        return None

    def stop_reason(self, state: TuneState, usd_per_hour: float, reps: int = 0) -> str | None:
        """Why the next candidate (REPS repetitions) would pass the budget, or None."""
        return self.over(state, usd_per_hour, self.next_s(state, reps))


@dataclass(frozen=True)
class Outcome:
    status: str  # DONE, BUDGET, INTERRUPTED, FAILED, NODE_GONE
    best: str | None
    node_on: str  # the config the node is on at the end: TERRAFORM or a candidate id
    message: str


class NotRestored(Exception):
    """The node could not be put back on a known-good config."""


# What ends the tuner as Ctrl-C does: a closed terminal or SSH session (SIGHUP) and a polite
# kill (SIGTERM) put the node back too, instead of leaving it on a half-tried config.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextmanager
def _handled(signals: tuple[signal.Signals, ...], handler: Callable[..., object],
             ) -> Iterator[None]:
    """HANDLER for SIGNALS while the block runs, the old handlers back after it (only the main
    thread can set them; elsewhere the block runs as is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, was in old.items():
            signal.signal(sig, was)


def _stops_as_ctrl_c() -> AbstractContextManager[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt for the run's length, as SIGINT does."""
    return _handled(STOP_SIGNALS[1:], _interrupt)


@contextmanager
def _deferred_sigint() -> Iterator[None]:
    """A Ctrl-C (or SIGTERM, SIGHUP) while the node is being put back waits until it is back."""
    caught: list[int] = []
    with _handled(STOP_SIGNALS, lambda signum, frame: caught.append(signum)):
        yield
    if caught:
        raise KeyboardInterrupt


class Tuner:
    def __init__(self, node: TuneNode, candidates: Mapping[str, Candidate], state: TuneState,
                 *, save: Callable[[TuneState], None], usd_per_hour: float,
                 limits: Constraints, workload: Workload, base_reps: int = 2,
                 budget: Budget | None = None, keep_best: bool = False,
                 log: Callable[[str], None] = lambda _: None) -> None:
        self.node, self.candidates, self.state = node, candidates, state
        self._save, self.usd_per_hour, self.limits = save, usd_per_hour, limits
        self.workload, self.base_reps = workload, base_reps
        self.budget, self.keep_best, self.log = budget or Budget(), keep_best, log
        self.order = list(candidates.values())  # the plan's order (tune/plan.py)

    def save(self) -> None:
        self._save(self.state)

    def run(self) -> Outcome:
        with _stops_as_ctrl_c():
            return self._run()

    def _run(self) -> Outcome:
        s = self.state
        plan.start(s, self.order)
        try:
            if not s.settled:  # a resume after an interruption mid-candidate
                self.log(f"the node may be on the half-tried {s.node_on}: returning it to "
                         f"{s.last_good}")
                self._return_to_last_good()
            if plan.stale(s, self.order):
                return Outcome(FAILED, None, self._end(),
                               "the state file holds a rung this search plan did not write (an "
                               "older tuner's?); pass --fresh to start over")
            while not s.done:
                if not s.pending:
                    plan.advance(s, self.order)
                    self.save()
                    continue
                cid = s.pending[0]
                reps = plan.reps(s, self.order, self.base_reps)
                if (why := self.budget.stop_reason(s, self.usd_per_hour, reps)) is not None:
                    end = self._end()
                    return Outcome(BUDGET, plan.best(s), end, f"budget reached: {why}")
                self._try(cid)  # pops CID from pending once its run is recorded
                self.save()
            end = self._end()
            best = plan.best(s)
            if best is None:
                return Outcome(FAILED, None, end, "no candidate met the constraints "
                               f"({self.limits.words()}) with a measurement")
            return Outcome(DONE, best, end, f"done: best {best}")
        except KeyboardInterrupt:
            return Outcome(INTERRUPTED, plan.best(s), self._back_or_say(),
                           "interrupted: the state is saved; run the same command to resume")
        except NodeGone as exc:
            s.settled, s.node_on = True, TERRAFORM  # a new node boots Terraform's script
            self.save()
            return Outcome(NODE_GONE, plan.best(s), "none (the node is gone)",
                           f"the node went away ({exc}): the state is saved; on the next node "
                           "the same command resumes, its compile cache warm")
        except NotRestored as exc:
            self.save()
            return Outcome(FAILED, plan.best(s), s.node_on, str(exc))
        except Exception:
            self.log(f"the tuner failed; the node is on: {self._back_or_say()}")
            raise

    def _back_or_say(self) -> str:
        try:
            with _deferred_sigint():
                self._return_to_last_good()
        except NotRestored as exc:
            self.log(str(exc))
        except NodeGone as exc:  # gone while being put back: a new node boots Terraform's
            self.log(f"the node went away ({exc})")
            self.state.settled, self.state.node_on = True, TERRAFORM
        except KeyboardInterrupt:
            pass
        self.save()
        return self.state.node_on

    def _try(self, cid: str) -> None:
        """Boot and measure CID, the head of pending; it leaves pending when its run (good or
        failed) is recorded, so an interruption before that retries it on resume."""
        s, c = self.state, self.candidates[cid]
        assert s.pending[:1] == [cid], (cid, s.pending[:1])
        reps = plan.reps(s, self.order, self.base_reps)
        self.log(f"rung {s.rung}: {cid} ({reps} reps)")
        s.node_on, s.settled = cid, False
        self.save()  # a crash from here on is known on resume
        boot: BootRecord | None = None
        try:
            boot = self.node.apply(c.overlay())
            s.spent_s += boot.boot_s
            if not boot.ok:
                raise CandidateFailed(boot.error or "did not reach readiness", boot)
            m = self.node.measure(self.workload, reps)
            s.spent_s += m.duration_s
        except CandidateFailed as exc:
            rec = exc.boot or boot or BootRecord(False, 0.0, error=exc.reason)
            s.runs.setdefault(cid, []).append(Run(s.rung, reps, rec, error=exc.reason))
            if s.last_good != TERRAFORM and self.budget.over(
                    s, self.usd_per_hour, self.budget.return_s(s), "a boot back to "
                    f"{s.last_good}") is not None:
                s.last_good = TERRAFORM  # the budget affords one boot: the end's
            self.log(f"{cid} failed: {exc.reason}; returning the node to {s.last_good}")
            s.pending.pop(0)  # tried: a Ctrl-C while the node goes back does not retry it
            self.save()
            self._return_to_last_good()
            return
        run = Run(s.rung, reps, boot, score(m.cells, self.usd_per_hour, self.limits),
                  measure_s=m.duration_s)
        s.runs.setdefault(cid, []).append(run)
        s.pending.pop(0)
        s.settled, s.last_good = True, cid
        assert run.score is not None
        self.log(f"{cid}: ${run.score.usd_per_m:.4f}/M, {run.score.tok_s:.1f} tok/s, boot "
                 f"{boot.boot_s:.0f} s" + (f"; breaks {', '.join(run.score.violations)}"
                                           if run.score.violations else ""))

    def _put(self, target: str) -> None:
        """Boot TARGET (a candidate or Terraform's script); a Ctrl-C meanwhile waits."""
        with _deferred_sigint():
            try:
                rec = (self.node.restore() if target == TERRAFORM
                       else self.node.apply(self.candidates[target].overlay()))
            except CandidateFailed as exc:
                rec = exc.boot or BootRecord(False, 0.0, error=exc.reason)
            self.state.spent_s += rec.boot_s
            if not rec.ok:
                raise NotRestored(
                    f"the node did not boot {target} ({rec.error}); it is on a config that "
                    f"failed: run `npx cdktf deploy {self.state.stack}` to put Terraform's "
                    "script back")
            self.state.node_on, self.state.settled = target, True

    def _return_to_last_good(self) -> None:
        """Back to the last config fully tried; Terraform's script if that fails to boot."""
        s = self.state
        if s.settled and s.node_on == s.last_good:
            return
        try:
            self._put(s.last_good)
        except NotRestored as exc:
            if s.last_good == TERRAFORM:
                raise
            self.log(f"{exc}; trying Terraform's script")
            s.last_good = TERRAFORM
            self._put(TERRAFORM)
        self.save()

    def _end(self) -> str:
        """Terraform's script back on the node, or the best config with keep_best."""
        s = self.state
        target = plan.best(s) if self.keep_best else None
        target = target or TERRAFORM
        # Set before the boot: a Ctrl-C deferred through it then puts the node back here, not
        # on the candidate tried last.
        s.last_good = target
        if not (s.settled and s.node_on == target):
            self._put(target)
        self.save()
        return target

