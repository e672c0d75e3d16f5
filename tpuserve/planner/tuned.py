"""A tune run's measurement used by `plan` in place of the figures it would derive.

It applies where the deployment is the config `tpuserve tune` measured: the same (model,
accelerator), an image pinned to the digest its boots ran, and every searched flag at the
measured value (the overlay was applied). Then the measured cells' tok/s replace the table's
(the $/M of those cells follow from them at each list price) and the measured boot replaces
SPEC 4's cold or warm seconds; every other figure keeps its own source. A trace replay's cells
are clients levels, not context x clients cells: only its boot time is used.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuserve.planner.arithmetic import ThroughputCell, ThroughputTable
from tpuserve.settings.deployment import Deployment
from tpuserve.settings.learned_profiles import (
    SOURCE,
    Cell,
    LearnedProfile,
    Measured,
    for_deployment,
    newest,
    value_of,
)


@dataclass(frozen=True)
class Tuned:
    """The measurement `plan` uses, and where it was made."""

    profile: LearnedProfile
    measured: Measured

    @property
    def where(self) -> str:
        m = self.measured
        return (f"measured by {SOURCE} on {m.date}, node {m.node} (stack {m.stack}, candidate "
                f"{m.candidate!r}; {self.profile.path})")

    @property
    def cells(self) -> tuple[Cell, ...]:
        return () if self.measured.trace else self.measured.cells

    @property
    def boot_kind(self) -> str | None:
        """"cold" or "warm": which of the rebuild table's boots the measured one replaces."""
        return self.measured.cache if self.measured.cache in ("cold", "warm") else None

    def table(self, base: ThroughputTable) -> ThroughputTable:
        """BASE with the measured cells in place (and added where it has none)."""
        ours = {c.key: c for c in self.cells}
        cells = [c for c in base.cells if c.key not in ours]
        cells += [ThroughputCell(c.context, c.clients, c.tok_s) for c in ours.values()]
        return ThroughputTable(tuple(sorted(cells, key=lambda c: (c.context, c.clients))))

    def source(self) -> str:
        """`sources.tuned`: what was used, each figure with its repetitions and cv."""
        m = self.measured
        cells = "; ".join(
            f"{c.key} ({c.output_tokens} output tokens, {c.reps} reps"
            + ("" if c.tok_s_cv is None else f", cv {c.tok_s_cv:.1%}")
            + f"): {c.tok_s:,.1f} tok/s, TTFT p90 {c.ttft_p90_ms:.0f} ms"
            + ("" if c.tpot_p50_ms is None else f", TPOT p50 {c.tpot_p50_ms:.2f} ms")
            for c in self.cells)
        used = f"tok/s and $/M at {cells}" if cells else "no context x clients cell"
        boot = (f"{self.boot_kind} boot {m.boot_s:.0f} s (an in-place re-run of the boot script "
                "by the watcher, the image already on the node)" if self.boot_kind else
                "no boot time (its compile cache state unknown)")
        return f"{self.where}: {used}; {boot}"

    def as_json(self) -> dict[str, object]:
        m = self.measured
        return {"profile": str(self.profile.path), "date": m.date, "node": m.node,
                "stack": m.stack, "candidate": m.candidate, "image_digest":
                self.profile.image_digest, "workload": m.workload,
                "cells": [{"context": c.context, "clients": c.clients,
                           "output_tokens": c.output_tokens, "output_tokens_per_s": c.tok_s,
                           "ttft_p90_ms": c.ttft_p90_ms, "tpot_p50_ms": c.tpot_p50_ms,
                           "tok_s_cv": c.tok_s_cv, "reps": c.reps} for c in self.cells],
                "boot": None if self.boot_kind is None else {"kind": self.boot_kind,
                                                             "seconds": m.boot_s}}


def holds(d: Deployment, m: Measured) -> bool:
    """The deployment runs the measured config: every searched flag at its measured value (a
    measurement that names no flag proves no config)."""
    return bool(m.values) and all(value_of(d, k) == v for k, v in m.values.items())


def tuned_for(d: Deployment) -> tuple[Tuned | None, str | None]:
    """The newest measurement of this deployment's own config, and `sources.tuned`'s line
    (None: no profile of its digest; a line saying why none applies otherwise)."""
    profiles, _problems = for_deployment(d)  # the loader refused a broken file already
    held = newest([LearnedProfile(p.path, p.model, p.accelerator, p.image, p.image_digest,
                                  tuple(m for m in p.measured if holds(d, m)))
                   for p in profiles])
    if held is not None:
        t = Tuned(held[1], held[0])
        return t, t.source()
    latest = newest(profiles)
    if latest is None:
        return None, None
    m, p = latest
    differ = ", ".join(f"{k} = {v!r} (here {value_of(d, k)!r})" for k, v in m.values.items()
                       if value_of(d, k) != v)
    return None, (f"not used: the newest measurement of this image digest ({m.date}, node "
                  f"{m.node}, {p.path}) ran other flags: {differ or 'none recorded'}; apply "
                  "tune's overlay to use it")
