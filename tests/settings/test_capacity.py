"""The planner's checks as synth applies them to a Deployment."""

from __future__ import annotations

from typing import Any

import pytest

from tests.settings.test_config import ok, raw_with
from tpuserve.settings import ConfigError, load
from tpuserve.settings.capacity import plan_for
from tpuserve.settings.loader import all_warnings


def problems(**sections: dict[str, Any]) -> list[str]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("tpuserve.settings.loader.load_raw", lambda *_a, **_k: raw_with(**sections))
        with pytest.raises(ConfigError) as exc:
            load()
    return exc.value.problems


def test_default_plan_matches_the_engine(deployments) -> None:
    plan = plan_for(deployments["flex"])
    assert plan.kv_bytes_per_token == 18_432
    assert plan.block_size == 64  # SPEC 4: 32768 -> block 64
    assert plan.num_blocks == pytest.approx(5_021, abs=5)  # engine: 5,021 blocks
    assert plan.expected is not None and plan.expected.fits


def test_measured_kv_bytes_reproduce_the_engine_exactly() -> None:
    d = ok(vllm={"kv_cache_memory_bytes": 5_923_602_432})["spot"]
    plan = plan_for(d)
    assert (plan.num_blocks, plan.block_size, plan.kv_block_tokens) == (5_021, 64, 321_344)


def test_max_model_len_one_request_cannot_hold_is_refused() -> None:
    [msg] = problems(vllm={"max_model_len": 524_288})
    assert "vllm.max_model_len = 524288" in msg and "pool holds" in msg


def test_weights_larger_than_the_cap_are_refused() -> None:
    [msg] = problems(capacity={"weights_gib": 15.0})
    assert "does not even hold" in msg


def test_expected_load_past_the_kv_wall_warns() -> None:
    d = ok(capacity={"expected_clients": 64, "expected_context": 8192})["spot"]
    [warning, cheaper] = all_warnings(d)  # and spot v5e costs less in another region
    assert cheaper.startswith("pricing.spot: v5litepod-1 spot costs")
    assert "524,288" in warning and "KV wall" in warning and "11.7 s" in warning
    # SPEC 6's RAG recommendation (16 clients at 8K) stays under the wall.
    assert [w for w in all_warnings(ok(capacity={"expected_clients": 16,
                                                 "expected_context": 8192})["spot"])
            if not w.startswith("pricing.spot:")] == []


def test_expected_clients_and_context_go_together() -> None:
    [msg] = problems(capacity={"expected_clients": 4, "expected_context": None})
    assert "go together" in msg


def test_missing_geometry_file_is_a_clear_error() -> None:
    [msg] = problems(capacity={"model_geometry": "models/nope.json"})
    assert "capacity.model_geometry = 'models/nope.json'" in msg
