"""The tune state file on load: every field's type and range checked, a broken file refused in
one line naming the file and the field (fail closed: a NaN spent_s would pass every budget
check, a string "no" would read as settled), and what it names checked against the search."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tpuserve.tune import state as state_file
from tpuserve.tune.node import BootRecord
from tpuserve.tune.state import Run, TuneState


def _saved(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    st = TuneState("flex", "fp", rung=1, at_rung=["a", "b"], pending=["b"],
                   runs={"a": [Run(0, 2, BootRecord(True, 300.0, compile_s=200.0,
                                                    cache_hit=False), measure_s=40.0)]},
                   node_on="a", last_good="a", spent_s=340.0, terraform_sha256="0" * 64)
    path = tmp_path / "state.json"
    state_file.save(st, path)
    doc = {**json.loads(path.read_text()), "price_usd_per_hour": 0.6,
           "price_source": "[pricing] flex x 1 chip(s)"}
    path.write_text(json.dumps(doc))
    return path, doc


def test_a_saved_state_reads_back_whole(tmp_path: Path) -> None:
    path, _doc = _saved(tmp_path)
    st = state_file.load(path)
    assert st is not None and st.spent_s == 340.0 and st.runs["a"][0].boot.boot_s == 300.0
    assert (st.usd_per_hour, st.price_source) == (0.6, "[pricing] flex x 1 chip(s)")


@pytest.mark.parametrize(("key", "value", "said"), [
    ("spent_s", float("nan"), "spent_s = NaN"),
    ("spent_s", float("inf"), "spent_s = Infinity"),
    ("spent_s", -1.0, "spent_s = -1.0"),
    ("spent_s", "0", 'spent_s = "0"'),
    ("settled", "no", 'settled = "no"'),
    ("done", 1, "done = 1"),
    ("rung", -1, "rung = -1"),
    ("rung", 1.5, "rung = 1.5"),
    ("pending", "abc", 'pending = "abc"'),
    ("at_rung", [1], "at_rung = [1]"),
    ("node_on", None, "node_on = null"),
    ("runs", [], "runs = []"),
    ("runs", {"a": [{}]}, "runs[] = {}"),
    ("price_usd_per_hour", 0, "price_usd_per_hour = 0"),
])
def test_a_bad_field_is_refused_naming_the_file_and_the_field(
        tmp_path: Path, key: str, value: Any, said: str) -> None:
    path, doc = _saved(tmp_path)
    path.write_text(json.dumps({**doc, key: value}))
    with pytest.raises(ValueError, match="not a tune state file") as err:
        state_file.load(path)
    assert str(path) in str(err.value) and said in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("field", "value", "said"), [
    ("boot_s", float("nan"), "runs[].boot.boot_s = NaN"),
    ("ok", "yes", 'runs[].boot.ok = "yes"'),
    ("phases", [["image"]], "runs[].boot.phases"),
])
def test_a_bad_run_is_refused(tmp_path: Path, field: str, value: Any, said: str) -> None:
    path, doc = _saved(tmp_path)
    doc["runs"]["a"][0]["boot"][field] = value
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="not a tune state file") as err:
        state_file.load(path)
    assert said in str(err.value)


@pytest.mark.parametrize("text", ["[]", "null", "3", "{", '{"version": true}'])
def test_a_file_that_is_not_a_table_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "state.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="not a tune state file") as err:
        state_file.load(path)
    assert str(path) in str(err.value)


def test_an_unreadable_path_is_refused_naming_it(tmp_path: Path) -> None:
    folder = tmp_path / "state.json"
    folder.mkdir()
    with pytest.raises(ValueError, match="not a readable tune state file") as err:
        state_file.load(folder)
    assert str(folder) in str(err.value)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="not a readable tune state file") as err:
        state_file.load(binary)
    assert str(binary) in str(err.value)
