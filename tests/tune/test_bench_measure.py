"""The real node's measurement is the project's benchmark, against the fake OpenAI-compatible
server: bench's cells and repetitions come back; a refused request fails the candidate."""

from __future__ import annotations

import pytest

from tests.cli_support import API_KEY
from tests.fakes.openai_server import FakeOpenAIServer
from tpuserve.ops.server import ServerTarget
from tpuserve.tune.bench_measure import bench_measure
from tpuserve.tune.node import CandidateFailed
from tpuserve.tune.workload import Workload


def test_the_benchmark_measures_every_cell(fake_oai: FakeOpenAIServer) -> None:
    target = ServerTarget(f"http://127.0.0.1:{fake_oai.port}", API_KEY)
    m = bench_measure(lambda: target, 4096)(Workload((64,), (1, 2), 8), 2)
    assert [(c.context, c.clients, len(c.reps)) for c in m.cells] == [(64, 1, 2), (64, 2, 2)]
    assert all(c.output_tokens_per_s > 0 for c in m.cells) and m.errors == 0


def test_a_refused_benchmark_fails_the_candidate(fake_oai: FakeOpenAIServer) -> None:
    target = ServerTarget(f"http://127.0.0.1:{fake_oai.port}", "sk-wrong")
    with pytest.raises(CandidateFailed, match="benchmark failed"):
        bench_measure(lambda: target, 4096)(Workload((64,), (1,), 8), 1)


TRACE = ((40, 8), (100, 4), (40, 2))


def test_a_trace_is_replayed_request_by_request(fake_oai: FakeOpenAIServer) -> None:
    from tests.fakes.openai_server import prompt_tokens

    target = ServerTarget(f"http://127.0.0.1:{fake_oai.port}", API_KEY)
    workload = Workload(clients=(1, 2), trace=TRACE, trace_path="t.jsonl")
    m = bench_measure(lambda: target, 4096)(workload, 2)
    # One cell per clients level, labelled with the trace's mean prompt length.
    assert [(c.context, c.clients, len(c.reps)) for c in m.cells] == [(60, 1, 2), (60, 2, 2)]
    assert m.errors == 0 and all(c.output_tokens_per_s > 0 for c in m.cells)
    chats = [r.body for r in fake_oai.requests
             if r.path == "/v1/chat/completions" and r.body is not None]
    # Every request of the trace, each replay: its output tokens asked for exactly, its
    # prompt the trace's length as the server counts it (calibrated by /tokenize).
    assert sorted((prompt_tokens(b["messages"]), b["max_tokens"]) for b in chats) == sorted(
        TRACE * 4)
    assert all(b["ignore_eos"] for b in chats)


def test_a_failed_trace_replay_fails_the_candidate(fake_oai: FakeOpenAIServer) -> None:
    target = ServerTarget(f"http://127.0.0.1:{fake_oai.port}", "sk-wrong")
    with pytest.raises(CandidateFailed, match="trace replay failed"):
        bench_measure(lambda: target, 4096)(
            Workload(clients=(1,), trace=TRACE, trace_path="t.jsonl"), 1)


def test_many_prompt_lengths_cost_a_bounded_calibration() -> None:
    from tpuserve.ops import prompts
    from tpuserve.tune import trace_replay

    calls: list[int] = []

    def count(messages: list[dict[str, object]]) -> int:
        calls.append(1)
        return len(str(messages[0]["content"]).split()) + 20  # nonce word + template

    lengths = list(range(100, 1100, 7))  # 143 distinct lengths
    words, method = trace_replay.prompt_words(lengths, count)
    assert method == "tokenize" and set(words) == set(lengths)
    assert len(calls) <= trace_replay.ANCHORS * prompts.CALIBRATION_STEPS
    # The counter is linear: interpolation between anchors is exact.
    assert all(words[n] + 21 == n for n in lengths)


@pytest.mark.parametrize("trace", [False, True])
def test_the_prompts_are_calibrated_once_per_model_not_per_candidate(
        fake_oai: FakeOpenAIServer, trace: bool) -> None:
    """/tokenize answers for the model's tokenizer, which no candidate changes: the second
    candidate's measurement starts without it (preflight is the tuner's overhead)."""
    target = ServerTarget(f"http://127.0.0.1:{fake_oai.port}", API_KEY)
    workload = Workload(clients=(1,), trace=TRACE, trace_path="t.jsonl") if trace \
        else Workload((64, 128), (1,), 8)
    measure = bench_measure(lambda: target, 4096)

    def tokenize_calls() -> int:
        return sum(1 for r in fake_oai.requests if r.path == "/tokenize")

    first = measure(workload, 1)
    after_first = tokenize_calls()
    second = measure(workload, 1)
    assert after_first > 0 and tokenize_calls() == after_first
    assert [c.context for c in first.cells] == [c.context for c in second.cells]
    assert second.errors == 0
