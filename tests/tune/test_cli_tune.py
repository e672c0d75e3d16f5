"""`tpuserve tune STACK` end to end against the toy node: estimate and question, the overlay
(loadable after the user's file), report and chart, exit codes, resume, the fleet refused,
traces refused line by line, and --pr with a fake `gh` (pushing only to a local bare repo)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.cli_support import app, assert_one_line_error, invoke
from tests.tune.cli_setup import git_repo, toy_cli
from tpuserve.settings import load


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    return toy_cli(tmp_path, monkeypatch)


def _tune(setup: dict[str, Any], *args: str, env: dict[str, str] | None = None) -> Any:
    return invoke("tune", "flex", "--contexts", "1024", "--clients", "1,16", "--out",
                  str(setup["tmp"] / "out"), *args, env={**setup["env"], **(env or {})})


def test_a_run_writes_a_loadable_overlay_a_report_and_a_chart(setup: dict[str, Any]) -> None:
    overlay = setup["tmp"] / "overlay.toml"
    r = _tune(setup, "--yes", "--write", str(overlay))
    assert r.exit_code == 0, r.stderr
    assert "estimate: " in r.stderr and "boots" in r.stderr and "derived" in r.stderr
    assert "the node is on: terraform" in " ".join(r.stderr.split())
    text = overlay.read_text()
    doc = tomllib.loads(text)
    chosen = doc["stacks"]["flex"]["vllm"]
    assert "measured: $" in text and "[stacks.flex.vllm.env]" in text
    # The user adds it after their own file; the loader takes it.
    both = load(environ={"TPUSERVE_CONFIG": f"{setup['cfg']}:{overlay}"}).deployments["flex"]
    assert both.vllm.max_num_batched_tokens == chosen["max_num_batched_tokens"]
    workers = chosen["env"]["NUM_PRECOMPILE_WORKERS"]
    assert workers == both.vllm.env.NUM_PRECOMPILE_WORKERS
    assert both.vllm.gpu_memory_utilization == chosen["gpu_memory_utilization"]
    report = (setup["tmp"] / "out" / "tune-flex-report.md").read_text()
    assert report.count("| `b") == 8  # every candidate, one row each
    assert "## Pareto set" in report and "## Boot times" in report and "cold" in report
    assert "stage by stage (memory, programs, speculative, memory-up, context, boot)" in report
    assert "s of benchmark and the return boot" in report
    png = (setup["tmp"] / "out" / "tune-flex-pareto.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert (setup["tmp"] / ".tpuserve" / "tune-flex.json").is_file()  # beside the config
    assert setup["box"]["node"].current is None


@pytest.mark.parametrize(("answer", "code"), [("n\n", 130), ("no\n", 130), ("", 2)])
def test_it_asks_before_starting(setup: dict[str, Any], answer: str, code: int) -> None:
    """A "no" stops the run before anything ran (130, as an interruption, not 1: nothing
    failed); no answer at all (end of input, a script without --yes) is a usage error."""
    r = CliRunner().invoke(app, ["tune", "flex", "--out", str(setup["tmp"] / "out")],
                           env=setup["env"], input=answer)
    assert r.exit_code == code and "not started" in r.stderr
    assert_one_line_error(r, "not started", "--yes")
    assert setup["box"]["node"].log == []


def test_yes_at_the_question_starts(setup: dict[str, Any]) -> None:
    r = CliRunner().invoke(app, ["tune", "flex", "--contexts", "1024", "--clients", "1", "--out",
                                 str(setup["tmp"] / "out")], env=setup["env"], input="y\n")
    assert r.exit_code == 0, r.stderr
    assert setup["box"]["node"].log


def test_the_constraint_options_say_their_tune_key() -> None:
    r = invoke("tune", "--help")
    text = " ".join(r.stdout.replace("│", " ").split())
    for key in ("max_ttft_p90_ms", "max_tpot_p50_ms", "min_stream_tok_s"):
        assert f"[tune] {key}" in text, key
    assert "130 interrupted (also: the start question answered no" in text


def test_the_fleet_is_refused_in_one_line(setup: dict[str, Any]) -> None:
    r = invoke("tune", "fleet", "--yes", env=setup["env"])
    assert r.exit_code == 2
    assert_one_line_error(r, "GKE rolls the fleet", "spot, ondemand or flex")


def test_the_budget_stops_it_with_exit_3(setup: dict[str, Any]) -> None:
    r = _tune(setup, "--yes", "--budget-usd", "0.4")
    assert r.exit_code == 3, r.stderr
    assert "budget reached" in r.stderr and "--budget-usd 0.4" in r.stderr
    assert setup["box"]["node"].current is None


def test_interrupted_exits_130_and_the_same_command_resumes(setup: dict[str, Any]) -> None:
    node = setup["box"]["node"]
    node.interrupt_at_measure = 3
    r = _tune(setup, "--yes")
    assert r.exit_code == 130, r.stderr
    said = " ".join(r.stderr.split())
    saved = json.loads((setup["tmp"] / ".tpuserve" / "tune-flex.json").read_text())
    # Back on the last config fully tried, and it says which.
    assert saved["settled"] and saved["node_on"] == saved["last_good"] != "terraform"
    assert "resume" in said and f"the node is on: {saved['node_on']}" in said
    applied = len(node.log)
    r = _tune(setup, "--yes")
    assert r.exit_code == 0, r.stderr
    assert len(node.log) > applied
    # Other constraints: another search; refused until --fresh.
    r = _tune(setup, "--yes", "--max-ttft-p90-ms", "500")
    assert r.exit_code == 2 and "--fresh" in r.stderr


def test_a_trace_is_refused_line_by_line(setup: dict[str, Any]) -> None:
    trace = setup["tmp"] / "trace.jsonl"
    trace.write_text('{"prompt_tokens": 100, "output_tokens": 20}\n'
                     '{"prompt_tokens": "100", "output_tokens": 20}\n')
    r = _tune(setup, "--yes", "--trace", str(trace))
    assert r.exit_code == 2
    assert_one_line_error(r, "line 2", "prompt_tokens")
    trace.write_text('{"prompt_tokens": 100, "output_tokens": 20, "x": 1}\n')
    assert_one_line_error(_tune(setup, "--yes", "--trace", str(trace)), "line 1", "exactly")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return git_repo(tmp_path)


def test_pr_commits_on_a_branch_and_opens_it_with_gh(setup: dict[str, Any], repo: Path) -> None:
    bin_dir = setup["tmp"] / "bin"
    bin_dir.mkdir()
    calls = setup["tmp"] / "gh-calls"
    gh = bin_dir / "gh"
    gh.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> "{calls}"\n'
                  'echo https://github.invalid/o/r/pull/1\n')
    gh.chmod(0o755)
    overlay = repo / "config" / "tune-flex.toml"
    r = _tune(setup, "--yes", "--pr", "--write", str(overlay),
              env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert r.exit_code == 0, r.stderr
    args = calls.read_text().split("\n")
    assert args[:2] == ["pr", "create"] and "--head" in args
    branch = args[args.index("--head") + 1]
    assert branch.startswith("tune-flex-")
    assert "config/tune-flex.toml" in _git(repo, "show", "--name-only", branch)
    assert _git(repo, "branch", "--show-current").strip() == "main"  # switched back
    assert branch in _git(repo, "ls-remote", "--heads", "origin")  # the local bare repo only
    assert "pull request: https://github.invalid/o/r/pull/1" in r.stderr


def test_pr_without_gh_prints_the_commands(setup: dict[str, Any], repo: Path) -> None:
    bin_dir = setup["tmp"] / "nogh"
    bin_dir.mkdir()
    git = shutil.which("git")
    assert git is not None
    (bin_dir / "git").symlink_to(git)
    overlay = repo / "tune-flex.toml"
    r = _tune(setup, "--yes", "--pr", "--write", str(overlay), env={"PATH": str(bin_dir)})
    assert r.exit_code == 0, r.stderr
    assert "gh is not on PATH" in r.stderr and "gh pr create --head tune-flex-" in r.stderr
    assert _git(repo, "branch", "--list").strip() == "* main"  # nothing run
