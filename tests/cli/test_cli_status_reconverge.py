"""`tpuserve status --json`'s `reconverge` key: the node watcher's last word as one
definite state, {state, script_sha256, why, at}, per stack (tpuserve/ops/reconverge.py)."""

from __future__ import annotations

import json

import pytest

from tests.cli_support import BOOT_READY, Env, invoke
from tpuserve.ops.reconverge import parse_reconverge

SHA = "ab" * 32
AT = "2030-01-02T09:00:00.000Z"


@pytest.mark.parametrize(("words", "expected"), [
    ("watching etag=0123", ("watching", None, None)),
    (f"changed sha256={SHA} etag=0123", ("changed", SHA, None)),
    (f"retrying sha256={SHA} attempt=2/4 in=30s docker run tpuserve-proxy failed",
     ("retrying", SHA, "attempt=2/4 in=30s docker run tpuserve-proxy failed")),
    (f"applied sha256={SHA}", ("applied", SHA, None)),
    (f"failed sha256={SHA} vLLM not healthy after 2400 s", ("failed", SHA,
                                                            "vLLM not healthy after 2400 s")),
    ("failed sha256=none metadata: startup-script over 262144 bytes: not run",
     ("failed", None, "metadata: startup-script over 262144 bytes: not run")),
    ("failed image pull: manifest unknown", ("failed", None, "image pull: manifest unknown")),
    # Nothing else is taken for a state: an older watcher's applied without a sha256, odd words.
    ("applied (exit 0; the script wrote no result)",
     ("unknown", None, "applied (exit 0; the script wrote no result)")),
    # applied is final and trusted: anything but the exact form proves nothing.
    (f"applied sha256={SHA} but the proxy failed", ("unknown", None,
                                                    f"applied sha256={SHA} but the proxy failed")),
    ("applied sha256=none", ("unknown", None, "applied sha256=none")),
    ("done", ("unknown", None, "done")),
])
def test_every_word_the_watcher_writes_is_one_definite_state(
    words: str, expected: tuple[str, str | None, str | None],
) -> None:
    r = parse_reconverge({"reconverge": f"{AT} {words}"})
    assert r is not None
    assert (r.state, r.script_sha256, r.why) == expected
    assert r.at == "2030-01-02T09:00:00Z"


def test_a_value_without_its_time_is_unknown_and_none_is_none() -> None:
    assert parse_reconverge({}) is None
    r = parse_reconverge({"reconverge": f"applied sha256={SHA}"})
    assert r is not None and r.state == "unknown"


def test_status_json_has_the_reconverge_state_per_stack(cli_env: Env) -> None:
    cli_env.seed_ready("ondemand", attrs={
        **BOOT_READY, "config": "2030-01-01T10:01:05.000Z argv_sha256=0123456789abcdef",
        "reconverge": f"{AT} failed sha256={SHA} docker run tpuserve-proxy failed"})
    result = invoke("status", "ondemand", "--json")
    (s,) = json.loads(result.stdout)["stacks"]
    assert s["reconverge"] == {"state": "failed", "script_sha256": SHA,
                               "why": "docker run tpuserve-proxy failed",
                               "at": "2030-01-02T09:00:00Z"}
    assert result.exit_code == 1  # a failed re-run is a problem of the stack


def test_status_json_reconverge_is_null_when_the_watcher_wrote_nothing(cli_env: Env) -> None:
    cli_env.seed_ready("spot", attrs=BOOT_READY)
    (s,) = json.loads(invoke("status", "spot", "--json").stdout)["stacks"]
    assert s["reconverge"] is None


@pytest.mark.parametrize(("words", "state", "sha", "why"), [
    ("watching etag=7", "watching", None, None),
    (f"changed sha256={SHA} etag=7", "changed", SHA, None),
    (f"retrying sha256={SHA} attempt=1/3 in=30s vLLM not healthy", "retrying", SHA,
     "attempt=1/3 in=30s vLLM not healthy"),
    (f"applied sha256={SHA}", "applied", SHA, None),
    (f"failed sha256={SHA} vLLM not healthy", "failed", SHA, "vLLM not healthy"),
    (f"applied sha256={SHA.upper()}", "unknown", None, f"applied sha256={SHA.upper()}"),
    ("<html>", "unknown", None, "<html>"),
])
def test_status_json_reconverge_for_each_state(
    cli_env: Env, words: str, state: str, sha: str | None, why: str | None,
) -> None:
    cli_env.seed_ready("spot", attrs={**BOOT_READY, "reconverge": f"{AT} {words}"})
    result = invoke("status", "spot", "--json")
    (s,) = json.loads(result.stdout)["stacks"]
    assert s["reconverge"] == {"state": state, "script_sha256": sha, "why": why,
                               "at": "2030-01-02T09:00:00Z"}
    # Only a definite failure is a problem of the stack.
    assert (result.exit_code == 1) == (state == "failed"), result.stderr
