"""`tpuserve smoke`: the validation checks against the fake OpenAI-compatible server."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from tests.cli_support import (
    API_KEY,
    Env,
    assert_one_line_error,
    invoke,
    is_png,
    write_config,
)
from tests.fakes.hostile_server import HostileServer, finishes_within
from tests.fakes.openai_server import FakeConfig, FakeOpenAIServer


def _results(stdout: str) -> dict[str, str]:
    return {c["check"]: c["result"] for c in json.loads(stdout)["checks"]}


def _detail(stdout: str, name: str) -> str:
    return next(c["detail"] for c in json.loads(stdout)["checks"] if c["check"] == name)


def test_every_check_passes_against_a_good_server(cli_env: Env) -> None:
    url = cli_env.oai.base_url + "/v1/"  # a /v1 suffix is accepted and stripped
    result = invoke("smoke", "--endpoint", url, "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert set(_results(result.stdout).values()) == {"pass"}
    assert "get_weather" in _detail(result.stdout, "tool call")
    assert "by /tokenize" in _detail(result.stdout, "long prompt")
    paths = [(r.method, r.path, r.authorized) for r in cli_env.oai.requests]
    assert ("POST", "/v1/completions", True) not in paths  # SPEC 1: never raw completions
    assert ("GET", "/metrics", False) in paths and ("GET", "/v1/models", False) in paths
    chats = [r.body for r in cli_env.oai.requests if r.path == "/v1/chat/completions"]
    assert len(chats) == 4  # chat, tool call, image, long prompt
    image = next(b for b in chats if isinstance(b["messages"][0]["content"], list))
    url = image["messages"][0]["content"][1]["image_url"]["url"]
    assert is_png(base64.b64decode(url.split(",", 1)[1]))
    long = max(chats, key=lambda b: len(json.dumps(b)))
    assert long["max_tokens"] == 8


def test_smoke_a_stack_uses_its_node_and_config(cli_env: Env) -> None:
    cli_env.seed_ready("spot")
    result = invoke("smoke", "spot")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "9/9 passed or skipped" in result.stdout
    assert API_KEY not in result.stdout + result.stderr


def test_stack_with_proxy_needs_a_key(cli_env: Env) -> None:
    cli_env.seed_ready("flex")
    result = invoke("smoke", "flex", env={"OPENAI_API_KEY": ""})
    assert result.exit_code == 2
    assert_one_line_error(result, "no key was given",
                          "gcloud secrets versions access latest --secret=tpuserve-api-key")


def test_open_metrics_fails_the_auth_check(cli_env: Env) -> None:
    # vLLM without the proxy: --api-key guards /v1 only, /metrics stays open.
    cli_env.oai.config.open_paths = frozenset({"/metrics"})
    result = invoke("smoke", "--endpoint", cli_env.oai.base_url, "--json")
    assert result.exit_code == 1
    checks = _results(result.stdout)
    assert checks["no key on /metrics refused"] == "fail"
    assert checks["no key on /v1 refused"] == "pass"
    assert "it is open" in _detail(result.stdout, "no key on /metrics refused")


def test_wrong_key_fails_with_401(cli_env: Env) -> None:
    result = invoke("smoke", "--endpoint", cli_env.oai.base_url, "--api-key", "wrong",
                    "--model", "google/gemma-4-E2B-it", "--json")
    assert result.exit_code == 1
    checks = _results(result.stdout)
    assert checks["health"] == "pass"  # /health is never guarded
    assert checks["chat completion"] == "fail"
    assert "HTTP 401" in _detail(result.stdout, "chat completion")


def test_no_tool_call_is_a_failure(cli_env: Env) -> None:
    cli_env.oai.config.no_tool_call = True
    result = invoke("smoke", "--endpoint", cli_env.oai.base_url, "--json")
    assert result.exit_code == 1
    assert _results(result.stdout)["tool call"] == "fail"
    assert "no tool call" in _detail(result.stdout, "tool call")
    assert _results(result.stdout)["chat completion"] == "pass"


def test_malformed_answers_fail_as_one_line_each(cli_env: Env) -> None:
    cli_env.oai.config.malformed = True
    result = invoke("smoke", "--endpoint", cli_env.oai.base_url, "--json")
    assert result.exit_code == 1
    checks = _results(result.stdout)
    assert checks["tool call"] == "fail"
    assert "arguments are not JSON" in _detail(result.stdout, "tool call")
    assert checks["chat completion"] == "fail"
    assert "Traceback" not in result.stdout + result.stderr
    for c in json.loads(result.stdout)["checks"]:
        assert "\n" not in c["detail"]


def test_long_prompt_without_tokenize_uses_the_approximation(cli_env: Env) -> None:
    cli_env.oai.config.no_tokenize = True
    result = invoke("smoke", "--endpoint", cli_env.oai.base_url, "--json")
    assert result.exit_code == 0, result.stdout
    assert "by approximation" in _detail(result.stdout, "long prompt")


def test_no_expect_auth_skips_the_refusals() -> None:
    with FakeOpenAIServer(FakeConfig()) as url:  # no key at all
        result = invoke("smoke", "--endpoint", url, "--no-expect-auth", "--json",
                        env={"OPENAI_API_KEY": ""})
    assert result.exit_code == 0, result.stdout
    checks = _results(result.stdout)
    assert checks["no key on /v1 refused"] == checks["no key on /metrics refused"] == "skip"


def test_unreachable_server_fails_every_check_without_traceback() -> None:
    result = invoke("smoke", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--json",
                    "--timeout", "5")
    assert result.exit_code == 1
    checks = json.loads(result.stdout)["checks"]
    assert checks[0]["result"] == "fail" and "ConnectError" in checks[0]["detail"]
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize("bad", ["ftp://x", "not a url", "http://"])
def test_bad_endpoint_is_a_usage_error(bad: str) -> None:
    result = invoke("smoke", "--endpoint", bad)
    assert result.exit_code == 2
    assert_one_line_error(result, "--endpoint")


def test_smoke_catches_a_proxy_that_judges_the_normalised_path(cli_env: Env) -> None:
    good = invoke("smoke", "--endpoint", cli_env.oai.base_url, "--json")
    assert _results(good.stdout)["no key: encoded variants refused"] == "pass"
    cli_env.oai.config.leaky_health = True  # the old `location = /health` proxy
    result = invoke("smoke", "--endpoint", cli_env.oai.base_url, "--json")
    assert result.exit_code == 1
    assert _results(result.stdout)["no key: encoded variants refused"] == "fail"
    assert "the proxy lets it through" in _detail(result.stdout,
                                                  "no key: encoded variants refused")
    # The plain checks alone would not have noticed.
    assert _results(result.stdout)["no key on /metrics refused"] == "pass"


def test_the_overall_deadline_bounds_the_stacks_tpu_lookup(tmp_path: Path) -> None:
    """--deadline bounds the whole command, the node's lookup in the TPU API too (a
    hanging API held it 30 s per try, 120 s per call, whatever the deadline)."""
    config = write_config(tmp_path / "user.toml", 8000)
    with HostileServer("hang") as tpu_root:
        env = {"CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": tpu_root + "/",
               "CLOUDSDK_AUTH_ACCESS_TOKEN": "tok", "TPUSERVE_CONFIG": str(config),
               "TPUSERVE_TIME_SCALE": "0", "OPENAI_API_KEY": API_KEY}
        result = finishes_within(60, lambda: invoke(
            "smoke", "spot", "--deadline", "3", "--timeout", "60", env=env))
    assert result.exit_code == 1
    assert_one_line_error(result, "get node", "DEADLINE_EXCEEDED", "more time")
