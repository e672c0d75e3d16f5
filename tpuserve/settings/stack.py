"""Each stack's own table, [stacks.NAME]: a discriminated union on the stack's kind.

The table is read in two steps. StackKeys validates every key any kind's table may hold, with
the rules and messages they always had, so a config that worked keeps working and a bad value
fails the same way in any stack. Then the kind's own settings (one class per shape of
tpuserve.kinds' `stack_keys`) keep what applies to the kind: only a flex stack has a run
duration, only a guarded VM a billing-guard limit. A key the user wrote that does not apply is
kept in `ignored`, which the loader turns into a synth warning naming it (never an error).
"""

# No `from __future__ import annotations` in a module of pydantic models: pydantic would
# evaluate every field's annotation from its string on each start (bench/cli).

from typing import Annotated

from pydantic import Field, ValidationInfo, field_validator

from tpuserve.facts import MAX_FLEX_RUN_SECONDS, MAX_GUARD_RUN_HOURS
from tpuserve.kinds import Kind, by_model
from tpuserve.settings import string_rules as rules
from tpuserve.settings.base import ProvisioningModel, StrictModel, parse_duration, spec_error
from tpuserve.settings.string_rules import check


class StackKeys(StrictModel):
    """Every key a [stacks.NAME] table may hold, whatever the stack's kind: each is validated
    (and refused) the same way in every stack; the kind's own settings keep the keys that
    apply to it (StackSettings below)."""

    provisioning_model: ProvisioningModel
    # false leaves the stack out: its table's own keys are still checked, but it is neither
    # validated with the rest of the config nor synthesized, planned or listed as configured
    # (say, `[stacks.flex] enabled = false` where the zone refuses flex-start). The base stays.
    enabled: bool = True
    # Billing guard for spot/ondemand: a Cloud Tasks task deletes the node this many hours
    # after its createTime (0: off); Cloud Tasks schedules at most 30 days ahead.
    max_run_hours: Annotated[float, Field(ge=0)] = 8
    # Flex-start only (SPEC 2): the node deletes itself after this long.
    max_run_duration: str = "4h"
    valid_until_duration: str | None = None

    @field_validator("max_run_hours")
    @classmethod
    def _guard_hours(cls, v: float) -> float:
        # The guard counts whole seconds: below one, int(hours * 3600) is 0, which means "off".
        if 0 < v * 3600 < 1:
            raise spec_error(
                "stack.max_run_hours", v, "must be 0 (guard off) or at least 1/3600 (one second)",
                "the billing guard counts whole seconds; a shorter limit would silently turn it "
                "off while the guard keeps its rights",
            )
        if v > MAX_GUARD_RUN_HOURS:
            raise spec_error(
                "stack.max_run_hours", v, f"must be at most {MAX_GUARD_RUN_HOURS} (30 days)",
                "the billing guard is a Cloud Tasks task, and Cloud Tasks schedules a task at "
                "most 30 days ahead",
            )
        return v

    @field_validator("max_run_duration", "valid_until_duration")
    @classmethod
    def _duration(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return v
        check(f"stack.{info.field_name}", v, rules.DURATION)
        seconds = parse_duration(v)
        if not 0 < seconds <= MAX_FLEX_RUN_SECONDS and info.field_name == "max_run_duration":
            raise spec_error(
                f"stack.{info.field_name}", v, "must be more than 0 and at most 7d",
                "flex-start capacity lasts at most 7 days",
            )
        if seconds == 0:  # valid_until_duration: how long the request may wait in the queue
            raise spec_error(
                f"stack.{info.field_name}", v, "must be more than 0 (or unset: no limit)",
                "a queued resource that may wait 0 s can never be provisioned",
            )
        return v


# The key every kind's table takes that the loader reads itself (settings/loader.py).
STACK_SWITCH = "enabled"


class StackSettings(StrictModel):
    """What every kind's stack settings hold: the kind, and the keys written that it ignores."""

    provisioning_model: ProvisioningModel
    ignored: tuple[str, ...] = ()  # keys of the table that do not apply to this kind

    @property
    def kind(self) -> Kind:
        return by_model(self.provisioning_model)


class GuardedVmStackSettings(StackSettings):
    """A TPU VM with a billing guard (spot, on-demand)."""

    max_run_hours: float


class FlexStackSettings(StackSettings):
    """A flex-start TPU VM: its run duration and how long its request may queue (SPEC 2)."""

    max_run_duration: str
    valid_until_duration: str | None

    @property
    def max_run_seconds(self) -> int:
        """max_run_duration in seconds (flex), parsed once here for every renderer."""
        return parse_duration(self.max_run_duration)

    @property
    def valid_until_seconds(self) -> int | None:
        return (None if self.valid_until_duration is None
                else parse_duration(self.valid_until_duration))


class GkeStackSettings(StackSettings):
    """The fleet: its settings are the [fleet] section."""


SHAPES: tuple[type[StackSettings], ...] = (GuardedVmStackSettings, FlexStackSettings,
                                           GkeStackSettings)


def settings_class(kind: Kind) -> type[StackSettings]:
    """The settings class whose own keys are the kind's stack_keys."""
    own = set(StackSettings.model_fields)
    return next(c for c in SHAPES if set(c.model_fields) - own == set(kind.stack_keys))


def of_kind(table: object) -> StackSettings:
    """A [stacks.NAME] table (already gathered by the loader) as its kind's settings."""
    if isinstance(table, StackSettings):
        return table
    flat = StackKeys.model_validate(table)
    kind = by_model(flat.provisioning_model)
    ignored = tuple(k for k in StackKeys.model_fields
                    if k in flat.model_fields_set and k not in kind.stack_keys
                    and k not in StackSettings.model_fields and k != STACK_SWITCH)
    return settings_class(kind)(provisioning_model=flat.provisioning_model, ignored=ignored,
                                **{k: getattr(flat, k) for k in kind.stack_keys})
