"""`tpuserve bench`: statistics from known timestamps, the streaming client's failure modes,
the sweep end to end on the fake server (JSON the planner reads, a valid PNG)."""

from __future__ import annotations

import asyncio
import json
import ssl
import statistics
from pathlib import Path

import pytest
from rich.console import Console

from tests.cli_support import API_KEY, assert_one_line_error, invoke, is_png
from tests.fakes.openai_server import FakeConfig, FakeOpenAIServer
from tpuserve.ops import bench_report, chat_stream, loadgen, prompts
from tpuserve.ops.bench_stats import CellStats, cv, percentile, rep_stats
from tpuserve.ops.chat_stream import RequestRecord, SseParser
from tpuserve.planner.arithmetic import load_throughput, usd_per_million_tokens

MODEL = "google/gemma-4-E2B-it"

# ---------------------------------------------------------------- statistics (pure)


def rec(start: float, first: float, last: float, tokens: int, end: float | None = None,
        error: str | None = None) -> RequestRecord:
    return RequestRecord(start=start, end=last if end is None else end, first_token=first,
                         last_token=last, output_tokens=tokens, prompt_tokens=128,
                         chunks=tokens, error=error)


def test_rep_stats_from_known_timestamps() -> None:
    records = [
        # start, first token, last token, tokens: TTFT 0.1 s, 9 gaps of 0.01 s
        rec(0.0, 0.1, 0.19, 10),
        rec(0.0, 0.2, 0.38, 10),  # TTFT 0.2 s, TPOT 20 ms
        rec(0.19, 0.49, 0.76, 10),  # TTFT 0.3 s, TPOT 30 ms
        rec(0.38, 0.78, 1.14, 10),  # TTFT 0.4 s, TPOT 40 ms
        RequestRecord(start=0.5, end=0.6, error="HTTP 500: boom"),
    ]
    s = rep_stats(records)
    assert s.requests == 5 and s.errors == 1 and s.first_error == "HTTP 500: boom"
    assert s.output_tokens == 40
    assert s.span_s == pytest.approx(1.14)
    assert s.output_tokens_per_s == pytest.approx(40 / 1.14)
    assert s.ttft_ms_median == pytest.approx(250)  # median of 100, 200, 300, 400
    assert s.ttft_ms_p90 == pytest.approx(370)  # 300 + 0.7 x 100
    assert s.tpot_ms_median == pytest.approx(25)  # median of 10, 20, 30, 40
    assert s.per_stream_tokens_per_s == pytest.approx(statistics.median([100, 50, 1000 / 30,
                                                                         25]))
    assert s.prompt_tokens_mean == 128


def test_a_single_token_answer_has_no_tpot() -> None:
    s = rep_stats([rec(0, 0.5, 0.5, 1)])
    assert s.ttft_ms_median == 500 and s.tpot_ms_median is None
    assert s.per_stream_tokens_per_s is None


def test_no_successful_request_is_an_error() -> None:
    with pytest.raises(ValueError, match="all 2 requests failed: HTTP 401"):
        rep_stats([RequestRecord(0, 1, error="HTTP 401: x")] * 2)


def test_cell_values_are_means_with_cv_across_repetitions() -> None:
    a = rep_stats([rec(0, 0.1, 1.0, 100)])  # 100 tok/s, TTFT 100 ms
    b = rep_stats([rec(0, 0.3, 0.8, 100)])  # 125 tok/s, TTFT 300 ms
    cell = CellStats(128, 1, (a, b))
    assert cell.output_tokens_per_s == pytest.approx(112.5)
    assert cell.output_tokens_per_s_cv == pytest.approx(statistics.stdev([100, 125]) / 112.5)
    assert cell.ttft_ms_median == pytest.approx(200)
    assert cell.ttft_ms_median_cv == pytest.approx(statistics.stdev([100, 300]) / 200)
    assert CellStats(128, 1, (a,)).output_tokens_per_s_cv is None


def test_percentile_and_cv() -> None:
    assert percentile([5], 90) == 5
    assert percentile([1, 2, 3, 4, 5], 50) == 3
    assert percentile([10, 20], 90) == pytest.approx(19)
    assert cv([1.0]) is None and cv([2.0, 2.0]) == 0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_tables_follow_the_spec_layout_and_flag_unstable_ttft() -> None:
    steady = rep_stats([rec(0, 0.1, 1.0, 100)])
    jumpy = rep_stats([rec(0, 0.9, 1.0, 100)])
    cells = [CellStats(128, 1, (steady, steady)), CellStats(128, 4, (steady, jumpy)),
             CellStats(1024, 1, (steady, steady))]
    console = Console(width=200, record=True)
    for t in bench_report.tables(cells, {"spot": 0.5779, "flex": 0.6, "ondemand": 1.2}):
        console.print(t)
    text = console.export_text()
    assert "context \\ clients" in text
    assert "1,024" in text and "-" in text  # the 1,024 x 4 cell was not run
    assert "500.0*" in text  # TTFT 100 vs 900 ms between repetitions
    assert "±0.0%" in text
    # SPEC 7's arithmetic through the planner's own function.
    assert f"{usd_per_million_tokens(0.5779, 100):.3f}" in text


# ---------------------------------------------------------------- SSE parsing


def test_sse_parser_handles_split_events_crlf_and_comments() -> None:
    p = SseParser()
    assert p.feed(b'data: {"a"') == []
    assert p.feed(b': 1}\n\n: keep-alive comment\n\ndata: [DO') == [b'{"a": 1}']
    assert p.feed(b"NE]\r\n\r\n") == [b"[DONE]"]
    assert p.feed(b"event: x\ndata: 1\ndata: 2\n\n") == [b"1\n2"]
    assert p.pending == b""


# A vLLM-shaped stream: role chunk, two tokens, finish, usage in the last chunk, [DONE],
# with a keep-alive comment and CRLF line ends in the middle.
STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n'
    b": keep-alive\r\n\r\n"
    b'data: {"choices":[{"index":0,"delta":{"content":"lo \\u00e9\xc3\xa9"}}]}\r\n\r\n'
    b'data: {"choices":[{"index":0,"delta":{"content":""},"finish_reason":"length"}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\n'
    b"data: [DONE]\n\n"
)


def _parse(pieces: list[bytes]) -> tuple[list[bytes], chat_stream._Tally]:
    parser, tally, events = SseParser(), chat_stream._Tally(), []
    for i, piece in enumerate(pieces):
        for payload in parser.feed(piece):
            events.append(payload)
            tally.event(payload, float(i))
    assert parser.pending == b""
    return events, tally


def test_sse_split_at_every_byte_gives_the_same_events() -> None:
    whole, tally = _parse([STREAM])
    assert len(whole) == 6 and whole[-1] == b"[DONE]"
    assert tally.done and tally.usage == {"prompt_tokens": 5, "completion_tokens": 3}
    assert tally.chunks == 3  # two text chunks and the finish chunk; the role chunk is not text
    for cut in range(1, len(STREAM)):
        assert _parse([STREAM[:cut], STREAM[cut:]])[0] == whole, cut
    assert _parse([STREAM[i:i + 1] for i in range(len(STREAM))])[0] == whole  # byte by byte


def test_sse_split_into_random_pieces_keeps_usage_and_times() -> None:
    import random

    rng = random.Random(16)
    whole, _ = _parse([STREAM])
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(STREAM)), rng.randint(1, 12)))
        pieces = [STREAM[a:b] for a, b in zip([0, *cuts], [*cuts, len(STREAM)], strict=True)]
        events, tally = _parse(pieces)
        assert events == whole
        assert tally.usage == {"prompt_tokens": 5, "completion_tokens": 3}
        # The first token is timed at the read that completed it, never earlier.
        end_of_first = STREAM.index(b"Hel") + len(b'Hel"}}]}\n\n')
        assert tally.first == next(i for i, c in enumerate([*cuts, len(STREAM)])
                                   if c >= end_of_first)


def test_error_event_mid_stream_is_a_stream_error() -> None:
    tally = chat_stream._Tally()
    tally.event(b'{"choices":[{"delta":{"content":"a"}}]}', 0.0)
    with pytest.raises(chat_stream.StreamError, match=r"server error in stream: .*overloaded"):
        tally.event(b'{"error":{"message":"engine overloaded","code":503}}', 1.0)


def test_itl_and_end_follow_vllm_bench_serve() -> None:
    tally = chat_stream._Tally()
    tally.event(b'{"choices":[{"delta":{"role":"assistant","content":""}}]}', 0.5)
    for t, text in ((1.0, "a"), (1.5, "b"), (2.5, "")):
        tally.event(b'{"choices":[{"delta":{"content":"%s"}}]}' % text.encode(), t)
    tally.event(b'{"choices":[],"usage":{"completion_tokens":3}}', 3.0)
    assert tally.first == 1.0 and tally.last == 2.5  # the usage chunk carries no token
    assert tally.itl == [0.5, 1.0]


def test_vllm_metrics_from_known_timestamps() -> None:
    records = [
        RequestRecord(start=0.0, end=1.0, first_token=0.1, last_token=0.5, output_tokens=5,
                      itl=(0.1, 0.1, 0.1, 0.1)),
        RequestRecord(start=0.0, end=2.0, first_token=0.3, last_token=1.9, output_tokens=5,
                      itl=(0.2, 0.2, 0.4, 0.8)),
    ]
    s = rep_stats(records)
    assert s.tpot_ms_median == pytest.approx((100 + 400) / 2)  # (E2EL - TTFT) / (n - 1)
    assert s.e2el_ms_median == pytest.approx((500 + 1900) / 2)
    assert s.itl_ms_median == pytest.approx(150)  # pooled: 100 x4, 200, 200, 400, 800
    assert s.itl_ms_p99 == pytest.approx(800 - 0.07 * 400)  # numpy's linear interpolation
    assert s.ttft_ms_p99 == pytest.approx(100 + 0.99 * 200)


# ---------------------------------------------------------------- the client vs the fake


def test_connections_are_opened_before_the_timed_window() -> None:
    server = FakeOpenAIServer(FakeConfig())
    with server as base:
        url = base + "/v1/chat/completions"
        body = loadgen.chat_body(MODEL, [{"role": "user", "content": "x"}], 3)

        async def go(cold: bool) -> tuple[int, int, list[RequestRecord]]:
            start = server.connections
            async with loadgen.LoadClient(cold=cold) as client:
                await client.warm(url, 4)
                warmed = server.connections - start
                records = await client.run(url, [body] * 8, {}, 4, max_tokens=3)
                records += await client.run(url, [body] * 4, {}, 4, max_tokens=3)
            return warmed, server.connections - start, records

        warmed, total, records = asyncio.run(go(cold=False))
        assert all(r.ok for r in records) and len(records) == 12
        assert warmed == total == 4  # the timed requests opened no connection
        warmed, total, records = asyncio.run(go(cold=True))
        assert all(r.ok for r in records)
        assert warmed == 0 and total == 12  # cold: one connection per request




def _one(cfg: FakeConfig, tokens: int = 5) -> RequestRecord:
    with FakeOpenAIServer(cfg) as base:
        body = loadgen.chat_body(MODEL, [{"role": "user", "content": "hi there"}], tokens)
        headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
        (record,) = asyncio.run(loadgen.run_requests(base + "/v1/chat/completions", [body],
                                                     headers, 1, timeout_s=10))
    return record


def test_stream_counts_tokens_from_usage() -> None:
    r = _one(FakeConfig(), tokens=7)
    # Chunks with choices from the first token on: 7 tokens and the finish chunk (vLLM's ITL
    # counts the same chunks).
    assert r.ok and r.output_tokens == 7 and r.chunks == 8 and len(r.itl) == 7
    assert r.prompt_tokens == 2 + 4 + 3  # the fake's tokenizer: words + overheads
    assert r.start <= r.first_token <= r.last_token <= r.end  # type: ignore[operator]


def test_known_server_delays_bound_the_measured_timings() -> None:
    r = _one(FakeConfig(ttft_s=0.03, itl_s=0.005), tokens=5)
    s = rep_stats([r])
    # Lower bounds only: the fake cannot answer sooner than it was told to. Per-token gaps
    # can shrink on a busy machine (chunks read in a burst), but the last token cannot come
    # before the first token plus four inter-token delays.
    assert s.ttft_ms_median >= 30
    assert s.tpot_ms_median is not None
    assert r.last_token is not None and (r.last_token - r.start) * 1e3 >= 30 + 4 * 5


@pytest.mark.parametrize(("cfg", "error"), [
    (FakeConfig(close_after=3), "server closed the stream after 3 chunks without [DONE]"),
    (FakeConfig(malformed=True), "malformed SSE event (not JSON)"),
    (FakeConfig(omit_usage=True), "no usage in the last chunk"),
    (FakeConfig(api_key="k"), "HTTP 401"),
])
def test_stream_failures_are_recorded_not_raised(cfg: FakeConfig, error: str) -> None:
    if cfg.api_key:
        cfg.api_key, key = "expected", "k"  # the client sends another key
        with FakeOpenAIServer(cfg) as base:
            body = loadgen.chat_body(MODEL, [{"role": "user", "content": "x"}], 3)
            (r,) = asyncio.run(loadgen.run_requests(
                base + "/v1/chat/completions", [body], {"Authorization": f"Bearer {key}"}, 1))
    else:
        r = _one(cfg)
    assert not r.ok and error in (r.error or "")


def test_connection_refused_is_recorded() -> None:
    body = loadgen.chat_body(MODEL, [{"role": "user", "content": "x"}], 3)
    (r,) = asyncio.run(loadgen.run_requests("http://127.0.0.1:9/v1/chat/completions", [body],
                                            {}, 1, timeout_s=5))
    assert r.error and "cannot connect" in r.error


# ---------------------------------------------------------------- prompt lengths


def test_calibration_hits_the_exact_count_with_tokenize() -> None:
    def count(msgs: prompts.Messages) -> int:
        return len(msgs[0]["content"].split()) + 7  # 7 template tokens

    for target in (64, 1000, 8192):
        words, counted = prompts.calibrate(target, count)
        assert counted == target
        assert count(prompts.messages(words, 12345)) == target  # any request number


def test_calibration_stays_under_when_words_are_two_tokens() -> None:
    def count(msgs: prompts.Messages) -> int:
        return 2 * len(msgs[0]["content"].split()) + 5

    _words, counted = prompts.calibrate(1000, count)
    assert counted is not None and 990 <= counted <= 1000


def test_without_tokenize_the_documented_approximation() -> None:
    words, counted = prompts.calibrate(1024, lambda _m: None)
    assert counted is None and words == 1024 - prompts.APPROX_OVERHEAD


def test_prompts_differ_per_request_from_the_first_token() -> None:
    a, b = (prompts.messages(50, n)[0]["content"] for n in (1, 2))
    assert a.split()[0] != b.split()[0] and len(a.split()) == len(b.split()) == 51


# ---------------------------------------------------------------- the command


def _bench(base: str, out: Path, *extra: str, key: str = API_KEY):
    return invoke("bench", "--endpoint", base, "--contexts", "64,256", "--clients", "1,4",
                  "--repetitions", "2", "--output-tokens", "8", "--requests-per-client", "2",
                  "--out", str(out), "--json", *extra, env={"OPENAI_API_KEY": key})


def test_bench_end_to_end(tmp_path: Path) -> None:
    cfg = FakeConfig(api_key=API_KEY, max_model_len=4096)
    server = FakeOpenAIServer(cfg)
    with server as base:
        result = _bench(base, tmp_path)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["prompt_length_method"] == "tokenize"
    cells = {(c["context"], c["clients"]): c for c in doc["cells"]}
    assert set(cells) == {(64, 1), (64, 4), (256, 1), (256, 4)}
    for (context, clients), c in cells.items():
        assert c["prompt_tokens_mean"] == context  # exact lengths through /tokenize
        assert c["requests"] == 2 * clients * 2 and c["errors"] == 0
        assert len(c["reps"]) == 2 and all(r["output_tokens"] == clients * 2 * 8
                                           for r in c["reps"])
        assert c["output_tokens_per_s"] > 0 and c["ttft_ms_median"] >= 0
        assert set(c["usd_per_million_output_tokens"]) == {"spot", "flex", "ondemand"}
        assert c["usd_per_million_output_tokens"]["spot"] == pytest.approx(
            usd_per_million_tokens(0.5779, c["output_tokens_per_s"]), rel=1e-3)
    # The planner reads what bench writes.
    table = load_throughput(doc["json_path"])
    assert table.contexts == (64, 256) and table.client_counts == (1, 4)
    chart = Path(doc["chart_path"]).read_bytes()
    assert is_png(chart)
    assert int.from_bytes(chart[16:20], "big") > 500  # IHDR width: a real figure
    # Each request had its own prompt (prefix caching must not flatter TTFT); warm-ups too.
    chats = [r.body for r in server.requests if r.path == "/v1/chat/completions"]
    firsts = [b["messages"][0]["content"].split()[0] for b in chats]
    # per cell one warm-up + 2 repetitions x clients x 2 requests: 5 + 17 + 5 + 17
    assert len(set(firsts)) == len(firsts) == 44
    assert all(b["stream_options"] == {"include_usage": True} and b["ignore_eos"]
               for b in chats)
    # One session for the whole run: its 4 connections (the most clients of a cell) served
    # every cell; the calls before the sweep used one more.
    assert server.connections == 1 + 4


def test_bench_tables_without_json(tmp_path: Path) -> None:
    with FakeOpenAIServer(FakeConfig(api_key=API_KEY)) as base:
        result = invoke("bench", "--endpoint", base, "--contexts", "32", "--clients", "2",
                        "--repetitions", "1", "--output-tokens", "4", "--out", str(tmp_path),
                        "--no-chart", env={"OPENAI_API_KEY": API_KEY})
    assert result.exit_code == 0, result.stderr
    assert "Aggregate output tokens/s" in result.stdout
    assert "Cost per million output tokens" in result.stdout
    assert [p.suffix for p in tmp_path.iterdir()] == [".json"]


def test_bench_without_key_fails_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    with FakeOpenAIServer(FakeConfig(api_key=API_KEY)) as base:
        result = _bench(base, tmp_path, key="")
    assert_one_line_error(result, "HTTP 401", "OPENAI_API_KEY")
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []


def test_server_closing_mid_stream_fails_the_bench(tmp_path: Path) -> None:
    with FakeOpenAIServer(FakeConfig(api_key=API_KEY, close_after=2)) as base:
        result = _bench(base, tmp_path)
    assert_one_line_error(result, "server closed the stream after 2 chunks",
                          "nothing was written")
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []


def test_context_past_max_model_len_is_a_usage_error(tmp_path: Path) -> None:
    with FakeOpenAIServer(FakeConfig(api_key=API_KEY, max_model_len=512)) as base:
        result = _bench(base, tmp_path, "--contexts", "600")
    assert result.exit_code == 2
    assert_one_line_error(result, "--contexts = 600", "max_model_len 512")


@pytest.mark.parametrize("bad", ["", "1,x", "0,4"])
def test_bad_client_list(bad: str, tmp_path: Path) -> None:
    result = invoke("bench", "--endpoint", "http://127.0.0.1:9", "--clients", bad)
    assert result.exit_code == 2
    assert_one_line_error(result, "--clients")


def _self_signed(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context, a client context that trusts exactly that certificate)."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    (tmp_path / "cert.pem").write_bytes(pem)
    (tmp_path / "key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    client = ssl.create_default_context(cadata=pem.decode())
    return server, client


def test_the_load_generator_streams_over_tls_with_the_given_context(tmp_path: Path) -> None:
    server_ctx, client_ctx = _self_signed(tmp_path)
    server = FakeOpenAIServer(FakeConfig(), tls=server_ctx)
    with server as base:
        assert base.startswith("https://")
        url = base + "/v1/chat/completions"
        body = loadgen.chat_body(MODEL, [{"role": "user", "content": "x"}], 4)
        pinned = asyncio.run(loadgen.run_requests(url, [body] * 2, {}, 2, ssl=client_ctx))
        default = asyncio.run(loadgen.run_requests(url, [body], {}, 1, timeout_s=5))
    assert all(r.ok and r.output_tokens == 4 for r in pinned)
    # Without the pinned context the system's trust store refuses the self-signed server.
    (refused,) = default
    assert refused.error and "TLS certificate of https://" in refused.error
    assert "certificate verify failed" in refused.error
