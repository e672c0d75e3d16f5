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
