"""What one revision yields before any comparison: its synthesized stacks and the facts the
current code derives from its config. Plain data; filled by synthesis and config_facts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tpuserve.planner.arithmetic import Plan


@dataclass(frozen=True)
class StackFacts:
    """What the current code derives from one revision's config for one stack."""

    name: str
    provisioning_model: str
    image: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cache_key: str
    cache_enabled: bool
    plan: Plan | None
    plan_error: str | None
    warnings: tuple[str, ...]
    # What the running server serves with (image, argv, env), hashed as the boot script
    # publishes it (guest attribute `config`); "" when not known.
    config_sha256: str = ""
    # Not the measured pair (Gemma 4 E2B on v5litepod-1): {figure or rule: where it is
    # derived from, with its margin}, and {flag: its measured rule labelled derived}; {} on
    # the measured pair (settings/derived_labels.py).
    derived: Mapping[str, str] = field(default_factory=dict)
    rule_labels: Mapping[str, str] = field(default_factory=dict)
    weights_label: str = "weights (measured)"


@dataclass(frozen=True)
class ConfigFacts:
    stacks: Mapping[str, StackFacts]
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class Synthesis:
    """One revision synthesized by its own code: {stack: cdk.tf.json}, or why it failed."""

    stacks: Mapping[str, Mapping[str, Any]]
    error: str | None = None


@dataclass(frozen=True)
class RevisionFacts:
    label: str  # as the user named it, or "working tree"
    commit: str | None  # full SHA; None for the working tree
    synthesis: Synthesis
    config: ConfigFacts

    @property
    def title(self) -> str:
        if self.commit is None:
            return self.label
        if self.commit.startswith(self.label):  # a SHA: shorten it
            return self.commit[:12]
        return f"{self.label} ({self.commit[:12]})"
