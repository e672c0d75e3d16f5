"""`smoke` and `bench` against hostile servers: a trickle, an endless
answer, an absurd max_model_len each end in one-line failures, never a hang or MemoryError.
The assertions are on the messages, not on timings."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.cli_support import API_KEY, assert_one_line_error, invoke
from tests.fakes.hostile_server import HostileServer, finishes_within
from tests.fakes.openai_server import FakeConfig, FakeOpenAIServer
from tpuserve.ops.bounded_http import (
    Deadline,
    DeadlinePassed,
    RequestTimedOut,
    ResponseTooLarge,
    bounded_client,
)


def _checks(stdout: str) -> dict[str, dict[str, str]]:
    return {c["check"]: c for c in json.loads(stdout)["checks"]}


def test_smoke_against_a_trickle_ends_at_its_deadline() -> None:
    with HostileServer("trickle", interval_s=0.3, models_too=True) as base:
        result = invoke("smoke", "--endpoint", base, "--model", "m", "--deadline", "1",
                        "--timeout", "60", "--json", env={"OPENAI_API_KEY": API_KEY})
    assert result.exit_code == 1
    assert "Traceback" not in result.stdout + result.stderr
    checks = _checks(result.stdout)
    assert checks["health"]["result"] == "fail"
    assert "overall deadline of 1 s passed" in checks["health"]["detail"]
    # Every later check is a one-line failure naming the deadline, not a wait (the long
    # prompt may be skipped first: no max_model_len was learnt).
    assert all(c["result"] == "fail" and "deadline" in c["detail"] and "\n" not in c["detail"]
               for c in checks.values() if c["result"] != "skip")
    assert [c["check"] for c in checks.values() if c["result"] == "skip"] in ([],
                                                                              ["long prompt"])


def test_smoke_against_an_endless_answer_hits_the_byte_cap() -> None:
    with HostileServer("endless", models_too=True) as base:
        result = invoke("smoke", "--endpoint", base, "--model", "m", "--deadline", "60",
                        "--json", env={"OPENAI_API_KEY": API_KEY})
    assert result.exit_code == 1
    checks = _checks(result.stdout)
    assert "ResponseTooLarge" in checks["models"]["detail"]
    assert "exceeded 33,554,432 bytes" in checks["models"]["detail"]
    assert "Traceback" not in result.stdout + result.stderr


def test_smoke_refuses_an_absurd_max_model_len() -> None:
    with FakeOpenAIServer(FakeConfig(api_key=API_KEY, max_model_len=10**12)) as base:
        result = invoke("smoke", "--endpoint", base, "--json", env={"OPENAI_API_KEY": API_KEY})
    assert result.exit_code == 1
    checks = _checks(result.stdout)
    assert checks["models"]["result"] == "fail"
    assert "max_model_len = 1000000000000: not a context length" in checks["models"]["detail"]
    assert checks["long prompt"]["result"] == "skip"  # never built from the claim
    assert checks["chat completion"]["result"] == "pass"


def test_bench_against_an_endless_stream_fails_in_one_line(tmp_path: Path) -> None:
    with HostileServer("endless") as base:
        result = invoke("bench", "--endpoint", base, "--contexts", "16", "--clients", "2",
                        "--repetitions", "1", "--output-tokens", "8", "--out", str(tmp_path),
                        env={"OPENAI_API_KEY": API_KEY})
    assert_one_line_error(result, "warm-up request", "stream exceeded", "does not stop")
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []


def test_bench_against_a_trickling_stream_ends_at_the_request_deadline(tmp_path: Path) -> None:
    with HostileServer("trickle", interval_s=0.2) as base:
        result = invoke("bench", "--endpoint", base, "--contexts", "16", "--clients", "2",
                        "--repetitions", "1", "--output-tokens", "8", "--out", str(tmp_path),
                        "--timeout", "60", "--request-deadline", "1",
                        env={"OPENAI_API_KEY": API_KEY})
    assert_one_line_error(result, "warm-up request", "timed out", "1 s per request")


def test_bench_run_deadline_bounds_the_whole_sweep(tmp_path: Path) -> None:
    with HostileServer("trickle", interval_s=0.2) as base:
        result = invoke("bench", "--endpoint", base, "--contexts", "16", "--clients", "2",
                        "--repetitions", "1", "--output-tokens", "8", "--out", str(tmp_path),
                        "--timeout", "60", "--deadline", "2",
                        env={"OPENAI_API_KEY": API_KEY})
    # 2 s: the calls before the sweep (a few ms here) share the deadline and must not use it up.
    assert_one_line_error(result, "did not finish within --deadline 2 s", "nothing was written")


def test_bench_preflight_against_a_silent_server_is_one_line(tmp_path: Path) -> None:
    with HostileServer("trickle", interval_s=0.2, models_too=True) as base:
        result = invoke("bench", "--endpoint", base, "--contexts", "16", "--clients", "2",
                        "--out", str(tmp_path), "--deadline", "1",
                        env={"OPENAI_API_KEY": API_KEY})
    assert_one_line_error(result, "list models", "overall deadline of 1 s passed")


def test_bounded_client_refuses_an_unasked_encoding() -> None:
    import gzip

    payload = gzip.compress(b"0" * 10_000_000)  # 10 MB once decoded, ~10 KB on the wire

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["accept-encoding"] == "identity"
        return httpx.Response(200, content=payload, headers={"content-encoding": "gzip"})

    from tpuserve.ops.bounded_http import BoundedTransport, UnaskedEncoding

    client = httpx.Client(transport=BoundedTransport(httpx.MockTransport(handler),
                                                     deadline=Deadline(None), max_bytes=1000))
    with pytest.raises(UnaskedEncoding, match="Content-Encoding 'gzip'"):
        client.get("http://x/")


def test_bounded_client_caps_bytes_and_deadline() -> None:
    with HostileServer("endless", models_too=True) as base, \
            bounded_client(30, max_bytes=1 << 20) as http, pytest.raises(ResponseTooLarge):
        http.get(base + "/v1/models")
    with HostileServer("trickle", interval_s=0.2, models_too=True) as base, \
            bounded_client(30, Deadline(1.0)) as http, pytest.raises(DeadlinePassed):
        http.get(base + "/v1/models")


def test_a_silent_stream_is_cut_by_the_idle_watchdog(tmp_path: Path) -> None:
    with HostileServer("silent") as base:
        result = invoke("bench", "--endpoint", base, "--contexts", "16", "--clients", "2",
                        "--repetitions", "1", "--output-tokens", "8", "--out", str(tmp_path),
                        "--timeout", "1", env={"OPENAI_API_KEY": API_KEY})
    assert_one_line_error(result, "warm-up request", "1 s without a chunk")


def test_smoke_against_trickled_headers_ends_at_its_deadline() -> None:
    """A read timeout bounds each read; headers trickled one byte at a time never trip it."""
    with HostileServer("headers", interval_s=0.2, models_too=True) as base:
        result = invoke("smoke", "--endpoint", base, "--model", "m", "--deadline", "1",
                        "--timeout", "60", "--json", env={"OPENAI_API_KEY": API_KEY})
    assert result.exit_code == 1
    assert "Traceback" not in result.stdout + result.stderr
    checks = _checks(result.stdout)
    assert "overall deadline of 1 s passed" in checks["health"]["detail"]
    assert all(c["result"] == "fail" and "deadline" in c["detail"]
               for c in checks.values() if c["result"] != "skip")


def test_bench_against_trickled_headers_is_one_line(tmp_path: Path) -> None:
    with HostileServer("headers", interval_s=0.2, models_too=True) as base:
        result = invoke("bench", "--endpoint", base, "--contexts", "16", "--clients", "2",
                        "--out", str(tmp_path), "--deadline", "1", "--timeout", "60",
                        env={"OPENAI_API_KEY": API_KEY})
    assert_one_line_error(result, "list models", "overall deadline of 1 s passed")


def test_smoke_timeout_bounds_each_whole_request_against_a_trickle() -> None:
    """`--timeout` is seconds per request, but it was applied per read, so a /health
    trickled one byte every 0.2 s held its check until the overall deadline (900 s by
    default). Each request now ends within --timeout, connect to last byte."""
    with HostileServer("trickle", interval_s=0.2, models_too=True) as base:
        result = finishes_within(100, lambda: invoke(
            "smoke", "--endpoint", base, "--timeout", "5", "--deadline", "120",
            "--no-expect-auth", "--json"))
    assert result.exit_code == 1
    checks = _checks(result.stdout)
    for name in ("health", "models"):  # no model learnt: the chat checks are skipped
        assert checks[name]["result"] == "fail"
        assert "did not finish answering within 5 s" in checks[name]["detail"], checks[name]
        assert "overall deadline" not in checks[name]["detail"]


def test_a_request_timeout_never_outlives_the_overall_deadline() -> None:
    with HostileServer("trickle", interval_s=0.2, models_too=True) as base, \
            bounded_client(60, Deadline(1.0)) as http, pytest.raises(DeadlinePassed):
        finishes_within(30, lambda: http.get(base + "/health"))
    with HostileServer("headers", interval_s=0.2) as base, \
            bounded_client(1.0, Deadline(60)) as http, \
            pytest.raises(RequestTimedOut, match="within 1 s"):
        finishes_within(30, lambda: http.get(base + "/health"))
