"""Each stack's own table is its kind's settings (settings/stack.py): a key another kind owns is
still accepted, with one warning naming it, and still refused the same way when its value is
bad; the top-level [fleet] table stays valid in every config."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tpuserve import kinds
from tpuserve.settings import ConfigError, from_raw, load_raw
from tpuserve.settings.stack import (
    FlexStackSettings,
    GkeStackSettings,
    GuardedVmStackSettings,
)

DEFAULT = load_raw(environ={})
Mutation = Callable[[dict[str, Any]], None]


def _loaded(mutate: Mutation) -> Any:
    raw = copy.deepcopy(DEFAULT)
    mutate(raw)
    return from_raw(raw)


def _ignored(mutate: Mutation) -> list[str]:
    return [w for w in _loaded(mutate).warnings if "ignored" in w]


def test_each_stack_holds_only_its_kinds_settings() -> None:
    found = from_raw(copy.deepcopy(DEFAULT)).deployments
    shapes = {n: type(d.stack) for n, d in found.items()}
    assert shapes == {"spot": GuardedVmStackSettings, "ondemand": GuardedVmStackSettings,
                      "flex": FlexStackSettings, "fleet": GkeStackSettings}
    assert not hasattr(found["flex"].stack, "max_run_hours")
    assert not hasattr(found["spot"].stack, "max_run_duration")
    assert not hasattr(found["fleet"].stack, "max_run_hours")
    assert found["flex"].stack.max_run_seconds == 4 * 3600
    # Only the fleet carries the [fleet] section (validated in every stack all the same).
    assert {n: d.fleet is not None for n, d in found.items()} == {
        "spot": False, "ondemand": False, "flex": False, "fleet": True}
    assert [d.kind for d in found.values()] == list(kinds.KINDS)


def test_the_default_config_warns_of_no_ignored_key() -> None:
    assert _ignored(lambda raw: None) == []


@pytest.mark.parametrize(("mutate", "warning"), [
    (lambda r: r["stacks"]["flex"].update(max_run_hours=8),
     ("[flex] stacks.flex.max_run_hours = 8: does nothing for provisioning_model = 'flex' (only "
     "the spot and ondemand stacks have it); ignored")),
    (lambda r: r["stacks"]["spot"].update(max_run_duration="4h"),
     ("[spot] stacks.spot.max_run_duration = '4h': does nothing for provisioning_model = 'spot' "
     "(only the flex stacks have it); ignored")),
    (lambda r: r["stacks"]["ondemand"].update(valid_until_duration="1h"),
     ("[ondemand] stacks.ondemand.valid_until_duration = '1h': does nothing for "
     "provisioning_model = 'ondemand' (only the flex stacks have it); ignored")),
    (lambda r: r["stacks"]["fleet"].update(max_run_hours=2),
     ("[fleet] stacks.fleet.max_run_hours = 2: does nothing for provisioning_model = 'fleet' "
     "(only the spot and ondemand stacks have it); ignored")),
    (lambda r: r["stacks"]["spot"].update(fleet={"min_replicas": 2}),
     ("[spot] stacks.spot.fleet: does nothing for provisioning_model = 'spot' (only the fleet "
     "stack reads [fleet]); ignored")),
])
def test_a_key_of_another_kind_is_accepted_with_a_warning(mutate: Mutation,
                                                            warning: str) -> None:
    assert _ignored(mutate) == [warning]


def test_the_kind_is_the_provisioning_model_not_the_stack_name() -> None:
    # [stacks.spot] may run flex-start, as it always could: its max_run_hours now says it is
    # ignored, and the stack is flex in every respect.
    loaded = _loaded(lambda r: r["stacks"]["spot"].update(provisioning_model="flex",
                                                           max_run_hours=8))
    d = loaded.deployments["spot"]
    assert d.kind is kinds.FLEX and isinstance(d.stack, FlexStackSettings)
    assert not d.has_billing_guard
    assert [w for w in loaded.warnings if w.startswith("[spot] stacks.spot.max_run_hours = 8:")]


@pytest.mark.parametrize(("mutate", "problem"), [
    # A key the kind ignores is refused exactly as before when its value is bad.
    (lambda r: r["stacks"]["flex"].update(max_run_hours=-1),
     "[flex] stack.max_run_hours = -1: Input should be greater than or equal to 0"),
    (lambda r: r["stacks"]["spot"].update(max_run_duration="8d"),
     ("[spot] stack.max_run_duration = '8d': must be more than 0 and at most 7d (flex-start "
     "capacity lasts at most 7 days)")),
    (lambda r: r["stacks"]["fleet"].update(max_run_hours="8"),
     ("[fleet] stack.max_run_hours = '8': Input should be a valid number (TOML has types: write "
     "the value without quotes, e.g. 8000 or true)")),
    (lambda r: r["stacks"]["spot"].update(fleet={"min_replicas": 0}),
     "[spot] fleet.min_replicas = 0: Input should be greater than or equal to 1"),
    (lambda r: r["stacks"]["spot"].update(provisioning_model="gpu"),
     ("[spot] stack.provisioning_model = 'gpu': Input should be 'spot', 'ondemand', 'flex' or "
     "'fleet'")),
])
def test_bad_values_fail_as_they_always_did(mutate: Mutation, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        _loaded(mutate)
    assert err.value.problems == [problem]


def test_the_top_level_fleet_table_is_valid_without_a_fleet_stack() -> None:
    def no_fleet(raw: dict[str, Any]) -> None:
        del raw["stacks"]["fleet"]
        raw.setdefault("fleet", {})["min_replicas"] = 2

    loaded = _loaded(no_fleet)
    assert set(loaded.deployments) == {"spot", "ondemand", "flex"}
    assert not [w for w in loaded.warnings if "ignored" in w]
