"""`tpuserve tune` refuses before anything boots (and before the start question): outputs it
could not write, --pr outside a git work tree, a resume at another price or from a broken
state file, candidates too short for the workload, and a second tune of the same stack while
the first holds its lock. Each refusal is one line naming the flag or file and why, exit 2."""

from __future__ import annotations

import fcntl
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.cli_support import app, assert_one_line_error, invoke
from tests.tune.cli_setup import TUNE, toy_cli


def _setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str = TUNE) -> dict[str, Any]:
    return toy_cli(tmp_path, monkeypatch, text)


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    return _setup(tmp_path, monkeypatch)


def _tune(setup: dict[str, Any], *args: str) -> Any:
    return invoke("tune", "flex", "--contexts", "1024", "--clients", "1,16", "--out",
                  str(setup["tmp"] / "out"), *args, env=setup["env"])


# -- outputs and --pr: checked before the paid search, not after it
def test_a_write_path_under_a_file_is_refused_before_any_boot(setup: dict[str, Any]) -> None:
    (setup["tmp"] / "afile").write_text("x")
    target = setup["tmp"] / "afile" / "o.toml"
    r = _tune(setup, "--yes", "--write", str(target))
    assert r.exit_code == 2, r.stderr
    assert_one_line_error(r, f"--write {target}", "is not a directory")
    assert setup["node"].log == [] and not setup["state"].parent.exists()


def test_a_write_path_that_is_a_directory_is_refused(setup: dict[str, Any]) -> None:
    (setup["tmp"] / "adir").mkdir()
    r = _tune(setup, "--yes", "--write", str(setup["tmp"] / "adir"))
    assert r.exit_code == 2, r.stderr
    assert_one_line_error(r, "--write", "adir: is a directory")
    assert setup["node"].log == []


def test_an_out_path_that_is_a_file_is_refused(setup: dict[str, Any]) -> None:
    (setup["tmp"] / "afile").write_text("x")
    r = invoke("tune", "flex", "--contexts", "1024", "--clients", "1", "--yes", "--out",
               str(setup["tmp"] / "afile"), env=setup["env"])
    assert r.exit_code == 2, r.stderr
    assert_one_line_error(r, "--out", "afile: exists and is not a directory")
    assert setup["node"].log == []


def test_the_checks_come_before_the_start_question(setup: dict[str, Any]) -> None:
    (setup["tmp"] / "afile").write_text("x")
    r = CliRunner().invoke(app, ["tune", "flex", "--out", str(setup["tmp"] / "afile")],
                           env=setup["env"], input="y\n")
    assert r.exit_code == 2 and "start?" not in r.stderr


def test_pr_outside_a_git_work_tree_is_refused_before_any_boot(setup: dict[str, Any]) -> None:
    r = _tune(setup, "--yes", "--pr")
    assert r.exit_code == 2, r.stderr
    assert_one_line_error(r, "--pr: --out ", "tune-flex-overlay.toml",
                          "not be inside a git work tree")
    assert setup["node"].log == []


# -- a resume is refused at another price, or from a broken state file
def _interrupted(setup: dict[str, Any]) -> int:
    setup["node"].interrupt_at_measure = 3
    assert _tune(setup, "--yes").exit_code == 130
    setup["node"].interrupt_at_measure = None
    return len(setup["node"].log)


def test_a_resume_at_another_price_is_refused(setup: dict[str, Any]) -> None:
    """The saved runs' $/M are at the old price: ranking them with new ones would choose on
    the price change, not on what was measured."""
    booted = _interrupted(setup)
    setup["cfg"].write_text(TUNE + "\n[pricing]\nflex = 1.2\n")
    r = _tune(setup, "--yes")
    assert r.exit_code == 2, r.stderr
    assert_one_line_error(r, str(setup["state"]), "price changed from $0.6/hour",
                          "to $1.2/hour", "--fresh")
    assert len(setup["node"].log) == booted
    assert _tune(setup, "--yes", "--fresh").exit_code == 0


@pytest.mark.parametrize(("key", "value", "said"), [
    ("spent_s", "NaN", "spent_s = NaN"),
    ("settled", '"no"', 'settled = "no"'),
    ("node_on", '"b1 s- l1"', "node_on names 'b1 s- l1'"),
])
def test_a_resume_from_a_broken_state_file_is_refused(setup: dict[str, Any], key: str,
                                                      value: str, said: str) -> None:
    booted = _interrupted(setup)
    doc = json.loads(setup["state"].read_text())
    doc[key] = "@"
    setup["state"].write_text(json.dumps(doc).replace('"@"', value))
    r = _tune(setup, "--yes")
    assert r.exit_code == 2, r.stderr
    assert_one_line_error(r, str(setup["state"]), said, "--fresh")
    assert len(setup["node"].log) == booted


# -- candidates refused before any boot: the workload, and the refusal named
def test_a_context_too_short_for_the_workload_is_refused_and_listed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _setup(tmp_path, monkeypatch,
               TUNE.replace("max_model_len = [32768]", "max_model_len = [512, 32768]"))
    r = _tune(s, "--yes")
    assert r.exit_code == 0, r.stderr
    report = (tmp_path / "out" / "tune-flex-report.md").read_text()
    assert "- `max_model_len = 512`: holds 512 tokens, fewer than the longest context" in report
    assert all(o.get("max_model_len") != 512 for _op, o in s["node"].log if o)


def test_no_candidate_long_enough_for_the_workload_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _setup(tmp_path, monkeypatch, TUNE.replace("[32768]", "[512]"))
    r = _tune(s, "--yes")
    assert r.exit_code == 2, r.stderr
    assert_one_line_error(r, "every candidate is refused", "max_model_len = 512",
                          "1024 + 256 output tokens (1280)")
    assert s["node"].log == []


@pytest.mark.parametrize(("table", "named", "rule"), [
    ("gpu_memory_utilization = [0.99]", "gpu_memory_utilization = 0.99", "0.95 died"),
    ("max_num_batched_tokens = [1024]", "max_num_batched_tokens = 1024", ">= 2496"),
])
def test_every_candidate_refused_names_the_given_values_refusal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: str, named: str,
        rule: str) -> None:
    s = _setup(tmp_path, monkeypatch, f"[tune]\n{table}\n")
    r = _tune(s, "--yes")
    assert r.exit_code == 2, r.stderr
    assert_one_line_error(r, "every candidate is refused", f"({named}: ", rule)
    assert "max_model_len above" not in r.stderr


# -- one tune per stack at a time
def test_a_second_tune_of_the_stack_is_refused_while_the_first_holds_the_lock(
        setup: dict[str, Any]) -> None:
    lock = setup["state"].with_name("tune-flex.json.lock")
    lock.parent.mkdir()
    with lock.open("a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # the other tune's
        r = _tune(setup, "--yes")
        assert r.exit_code == 2, r.stderr
        assert_one_line_error(r, str(lock), "another `tpuserve tune` holds this lock")
        assert setup["node"].log == [] and not setup["state"].exists()
    r = _tune(setup, "--yes")
    assert r.exit_code == 0, r.stderr


def test_a_trace_too_long_for_every_candidate_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _setup(tmp_path, monkeypatch, TUNE.replace("[32768]", "[512]"))
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"prompt_tokens": 100, "output_tokens": 20}\n'
                     '{"prompt_tokens": 1000, "output_tokens": 20}\n')
    r = _tune(s, "--yes", "--trace", str(trace))
    assert r.exit_code == 2, r.stderr
    assert_one_line_error(r, "max_model_len = 512",
                          "the trace's longest request, 1000 + 20 tokens (1020)")
    assert s["node"].log == []
