"""Every measured rule with a good and a bad value, and what its message says."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tpuserve.settings import ConfigError, from_raw, load_raw
from tpuserve.settings.base import parse_duration
from tpuserve.settings.loader import validate
from tpuserve.settings.string_rules import shown
from tpuserve.settings.warnings import deployment_warnings

BASE = load_raw(environ={})


def raw_with(**sections: dict[str, Any]) -> dict[str, Any]:
    raw = copy.deepcopy(BASE)
    for section, values in sections.items():
        if section.startswith("stack_"):
            raw["stacks"][section.removeprefix("stack_")].update(values)
        else:
            raw.setdefault(section, {}).update(values)
    return raw


def problems(**sections: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        from_raw(raw_with(**sections))
    return exc.value.problems


def ok(**sections: dict[str, Any]):
    return from_raw(raw_with(**sections)).deployments


def test_defaults_carry_the_spec_values(deployments) -> None:
    d = deployments["spot"]
    assert set(deployments) == {"spot", "ondemand", "flex", "fleet"}
    assert (d.gcp.zone, d.tpu.accelerator_type, d.tpu.runtime_version) == (
        "us-west4-a", "v5litepod-1", "v2-alpha-tpuv5-lite")
    v = d.vllm
    assert (v.model, v.image, v.port) == ("google/gemma-4-E2B-it", "vllm/vllm-tpu:nightly", 8000)
    assert (v.max_model_len, v.max_num_batched_tokens, v.gpu_memory_utilization) == (
        32768, 4096, 0.92)
    assert v.limit_mm_per_prompt == {"image": 4, "audio": 1}
    assert v.block_size is None and v.max_num_seqs is None
    # The fleet alone warns: its placeholder digest and its Gateway without a domain.
    assert all(deployment_warnings(d) == [] for name, d in deployments.items()
               if name != "fleet")


def test_accelerator_spelled_as_the_api_wants() -> None:
    [msg] = problems(tpu={"accelerator_type": "v5e-1"})
    assert "tpu.accelerator_type = 'v5e-1'" in msg and "v5litepod-1" in msg
    assert "[spot, ondemand, flex, fleet]" in msg  # a shared setting is reported once
    [msg] = problems(tpu={"accelerator_type": "v4-8"})
    assert "v5litepod" in msg
    assert ok(tpu={"accelerator_type": "v5litepod-4"})["spot"].tpu.chips == 4


@pytest.mark.parametrize("value", [0.95, 0.99])
def test_gpu_memory_utilization_fatal(value: float) -> None:
    [msg] = problems(vllm={"gpu_memory_utilization": value,
                           "allow_untested_gpu_memory_utilization": True})
    assert f"= {value}" in msg and "<= 0.92" in msg
    assert "691 s" in msg and "RuntimeProgramAllocationFailure" in msg


@pytest.mark.parametrize("value", [0.93, 0.94])
def test_gpu_memory_utilization_untested_needs_opt_in(value: float) -> None:
    [msg] = problems(vllm={"gpu_memory_utilization": value})
    assert "allow_untested_gpu_memory_utilization" in msg and "untested" in msg
    d = ok(vllm={"gpu_memory_utilization": value,
                 "allow_untested_gpu_memory_utilization": True})["spot"]
    assert any("untested above 0.92" in w for w in deployment_warnings(d))


def test_gpu_memory_utilization_good() -> None:
    assert ok(vllm={"gpu_memory_utilization": 0.9})["flex"].vllm.gpu_memory_utilization == 0.9


@pytest.mark.parametrize("dtype", ["auto", "bfloat16"])
def test_kv_cache_dtype_accepted(dtype: str) -> None:
    d = ok(vllm={"kv_cache_dtype": dtype})["spot"]
    assert deployment_warnings(d) == []


@pytest.mark.parametrize("dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_kv_cache_dtype_fp8_warns(dtype: str) -> None:
    [warning] = deployment_warnings(ok(vllm={"kv_cache_dtype": dtype})["spot"])
    assert "1.000x" in warning and "2%" in warning


def test_kv_cache_dtype_int8_not_in_enum() -> None:
    [msg] = problems(vllm={"kv_cache_dtype": "int8"})
    assert "invalid choice: 'int8'" in msg


@pytest.mark.parametrize(
    "dtype", ["int8_per_token_head", "turboquant_k8v4", "nvfp4", "fp8_inc", "fp8_ds_mla"]
)
def test_kv_cache_dtype_kills_the_server(dtype: str) -> None:
    [msg] = problems(vllm={"kv_cache_dtype": dtype})
    assert "kills the server at boot" in msg and repr(dtype) in msg


@pytest.mark.parametrize("dtype", ["float16", "int4_per_token_head", "bf16", "q4"])
def test_kv_cache_dtype_untested_or_unknown(dtype: str) -> None:
    [msg] = problems(vllm={"kv_cache_dtype": dtype})
    assert repr(dtype) in msg and "use auto" in msg


def test_max_num_batched_tokens_multimodal_floor() -> None:
    [msg] = problems(vllm={"max_num_batched_tokens": 2048})
    assert "max_tokens_per_mm_item (2496) is larger than max_num_batched_tokens (2048)" in msg
    assert ">= 2496" in msg
    # Text-only: the floor goes away, and 2048 is a power of two (no warning).
    d = ok(vllm={"max_num_batched_tokens": 2048, "disable_chunked_mm_input": False})["spot"]
    assert deployment_warnings(d) == []
    d = ok(vllm={"max_num_batched_tokens": 2048,
                 "limit_mm_per_prompt": {"image": 0, "audio": 0}})["spot"]
    assert d.vllm.max_num_batched_tokens == 2048


def test_max_num_batched_tokens_not_power_of_two_warns() -> None:
    [warning] = deployment_warnings(ok(vllm={"max_num_batched_tokens": 2496})["spot"])
    assert "4096 bucket" in warning and "-24.7%" in warning


def test_block_size_rejected_at_any_value() -> None:
    for value in (16, 64):
        [msg] = problems(vllm={"block_size": value})
        assert "never set it" in msg and "8.32 ms" in msg


def test_tensor_parallel_size() -> None:
    [msg] = problems(vllm={"tensor_parallel_size": 4})
    assert "<= the 1 chip(s) of v5litepod-1" in msg
    d = ok(tpu={"accelerator_type": "v5litepod-4"}, vllm={"tensor_parallel_size": 4})["spot"]
    warnings = deployment_warnings(d)
    assert any("KV memory is paid 4x" in w for w in warnings)


@pytest.mark.parametrize(
    "image",
    ["sha256:" + "a" * 64, "a" * 64],
)
def test_image_bare_config_blob_id_rejected(image: str) -> None:
    [msg] = problems(vllm={"image": image})
    assert "config-blob id" in msg and "unexpected media type" in msg


@pytest.mark.parametrize(
    "image",
    ["vllm/vllm-tpu:nightly", "vllm/vllm-tpu@sha256:" + "b" * 64,
     "us-docker.pkg.dev/p/r/vllm-tpu:v0.26.1"],
)
def test_image_tag_or_digest_accepted(image: str) -> None:
    assert ok(vllm={"image": image})["spot"].vllm.image == image


def test_image_garbage_rejected() -> None:
    [msg] = problems(vllm={"image": "Not An Image"})
    assert "must be an image reference" in msg


def test_wrong_types_and_ranges_all_reported_at_once() -> None:
    msgs = problems(
        vllm={"port": "eighty", "max_model_len": -1, "gpu_memory_utilization": 2,
              "enable_prefix_caching": "maybe", "typo_setting": 1},
        gcp={"project": "Bad_Project"},
    )
    text = "\n".join(msgs)
    for needle in ("vllm.port = 'eighty'", "vllm.max_model_len = -1",
                   "vllm.gpu_memory_utilization = 2", "vllm.enable_prefix_caching = 'maybe'",
                   "vllm.typo_setting", "gcp.project = 'Bad_Project'"):
        assert needle in text
    assert len(msgs) == 6


def test_dtype_only_bfloat16() -> None:
    [msg] = problems(vllm={"dtype": "float16"})
    assert "bf16 only" in msg


def test_per_stack_override_and_unknown_stack() -> None:
    raw = raw_with(stack_spot={"vllm": {"max_model_len": 16384}})
    ds = from_raw(raw).deployments
    assert ds["spot"].vllm.max_model_len == 16384 and ds["flex"].vllm.max_model_len == 32768
    raw["stacks"]["gpu"] = {"provisioning_model": "spot"}
    with pytest.raises(ConfigError, match="unknown stack"):
        from_raw(raw)


def test_environment_overrides(tmp_path: Path) -> None:
    user = tmp_path / "mine.toml"
    user.write_text('[vllm]\nmax_model_len = 8192\n[stacks.flex]\nmax_run_duration = "2h"\n')
    raw = load_raw(environ={"TPUSERVE_PROJECT": "my-real-project",
                            "TPUSERVE_ZONE": "us-central1-a", "TPUSERVE_CONFIG": str(user)})
    ds = from_raw(raw).deployments
    assert ds["spot"].gcp.project == "my-real-project"
    assert ds["spot"].gcp.zone == "us-central1-a" and ds["spot"].gcp.region == "us-central1"
    assert ds["ondemand"].vllm.max_model_len == 8192
    assert ds["flex"].stack.max_run_duration == "2h"


def test_cidr_ranges_validated() -> None:
    [msg] = problems(access={"api_source_ranges": ["10.0.0.0/33"]})
    assert "not a CIDR" in msg
    assert ok(access={"api_source_ranges": ["203.0.113.0/24"]})["spot"].access.api_source_ranges


def test_billing_guard_off_warns_with_monthly_cost() -> None:
    d = ok(stack_spot={"max_run_hours": 0})["spot"]
    [warning] = deployment_warnings(d)
    assert "$422 a month" in warning and "billing guard is off" in warning


def test_proxy_off_with_open_port_warns() -> None:
    d = ok(access={"api_key_proxy": False, "api_source_ranges": ["0.0.0.0/0"]})["spot"]
    assert any("/metrics" in w for w in deployment_warnings(d))


def test_durations() -> None:
    assert parse_duration("4h") == 14400
    assert parse_duration("1h30m") == 5400
    assert parse_duration("7d") == 604800
    with pytest.raises(ValueError):
        parse_duration("four hours")
    [msg] = problems(stack_flex={"max_run_duration": "8d"})
    assert "at most 7d" in msg


# -------------------------------------------------------------------------- strict types
@pytest.mark.parametrize(("section", "key", "value"), [
    ("vllm", "port", "8000"), ("vllm", "port", 8000.0), ("vllm", "port", True),
    ("vllm", "enable_prefix_caching", "off"), ("vllm", "enable_prefix_caching", 0),
    ("vllm", "max_model_len", 32768.5), ("vllm", "gpu_memory_utilization", "0.9"),
    ("cache", "enabled", "yes"), ("access", "api_key_proxy", "true"),
    ("cache", "retention_days", "30"), ("pricing", "spot", "0.5"),
    ("access", "api_source_ranges", "10.0.0.0/8"), ("gcp", "project", 12345),
])
def test_toml_types_are_strict(section: str, key: str, value: object) -> None:
    [msg] = problems(**{section: {key: value}})
    assert f"{section}.{key} = {value!r}: Input should be a valid " in msg, msg
    if key != "api_source_ranges":  # a list is a list: no spelling hint needed
        assert "(TOML has types: " in msg, msg


def test_env_variables_are_strict_too() -> None:
    [msg] = problems(vllm={"env": {"NUM_PRECOMPILE_WORKERS": True}})
    assert "vllm.env.NUM_PRECOMPILE_WORKERS = True" in msg and "integer" in msg


@pytest.mark.parametrize("where", ["top", "stack_spot"])
@pytest.mark.parametrize("key", ["name", "stack"])
def test_keys_the_loader_sets_are_refused(where: str, key: str) -> None:
    raw = copy.deepcopy(BASE)
    table = raw if where == "top" else raw["stacks"]["spot"]
    table[key] = "evil" if key == "name" else {"max_run_hours": 1}
    with pytest.raises(ConfigError) as exc:
        from_raw(raw)
    [msg] = exc.value.problems
    assert msg.startswith(key if where == "top" else f"stacks.spot.{key}")
    assert "set by the loader itself" in msg


@pytest.mark.parametrize("stacks", ["spot", 5, ["spot"], {"spot": "x"}, {"spot": 3}])
def test_a_malformed_stacks_table_is_a_message(stacks: object) -> None:
    raw = copy.deepcopy(BASE)
    raw["stacks"] = stacks
    with pytest.raises(ConfigError) as exc:
        from_raw(raw)
    [msg] = exc.value.problems
    assert "must be a table" in msg and repr(stacks if not isinstance(stacks, dict) else "x"
                                             if stacks["spot"] == "x" else 3) in msg


@pytest.mark.parametrize("price", [float("inf"), float("nan"), 0, -1, 100.5, 1e308])
def test_prices_are_finite_and_bounded(price: float) -> None:
    [msg] = problems(pricing={"ondemand": price})
    assert msg.startswith("[spot, ondemand, flex, fleet] pricing.ondemand = ")
    assert "finite $/chip-hour above 0 and at most 100" in msg and "SPEC 2" in msg
    assert ok(pricing={"ondemand": 100})["spot"].pricing.ondemand == 100


def test_max_run_hours_below_one_second_is_refused() -> None:
    [msg] = problems(stack_spot={"max_run_hours": 0.5 / 3600})
    assert "stack.max_run_hours = 0.000138" in msg and "at least 1/3600" in msg
    assert "silently turn it off" in msg
    assert ok(stack_spot={"max_run_hours": 1 / 3600})["spot"].stack.max_run_hours > 0
    assert ok(stack_spot={"max_run_hours": 0})["spot"].stack.max_run_hours == 0


# ---------------------------------------------------------------- allow-list patterns
GOOD_AND_BAD: dict[str, tuple[list[str], list[str]]] = {
    "gcp.project": (["my-project-123"], ["My_Project", "ab", "proj-", "p" * 31]),
    "gcp.zone": (["us-central1-a", "asia-east1-c"], ["us-west4", "US-WEST4-A", "a b"]),
    "gcp.network": (["default", "my-vpc", "projects/my-project/global/networks/vpc-1"],
                    ["Default", "-vpc", "vpc-", "a" * 64, "projects/x/global/networks/v"]),
    "tpu.runtime_version": (["v2-alpha-tpuv5-lite", "tpu-ubuntu2204-base"],
                            ["-v2", "v2 alpha", "V2", "v2..x"]),
    "vllm.model": (["google/gemma-4-E2B-it", "Qwen/Qwen3-0.6B", "org_1/name.v2"],
                   ["gemma", "-org/name", "org/-name", "org/na--me", "org/na..me", "a/b/c",
                    "org/" + "n" * 97]),
    "vllm.image": (["nginx", "nginx:1.27.3-alpine", "localhost:5000/a/b:tag",
                    "registry.example.com:443/team/vllm-tpu@sha256:" + "c" * 64,
                    "vllm/vllm-tpu:nightly@sha256:" + "d" * 64, "a__b/c--d:T_1.x"],
                   ["Nginx", "nginx:", "nginx:-tag", "nginx@sha256:abc", "/nginx", "a//b",
                    "nginx:" + "t" * 129, "-nginx"]),
    "access.proxy_image": (["nginx:1.27.3-alpine", "mirror.gcr.io/library/nginx:1.27"],
                           ["nginx:1.27.3-alpine\nEOF", "nginx latest"]),
    "vllm.tool_call_parser": (["hermes", "llama3_json", "granite-20b-fc"],
                              ["-x", "Hermes", "a b", "p" * 65]),
    "vllm.reasoning_parser": (["deepseek_r1", "qwen3"], ["--help", "qwen3;id"]),
    "vllm.shm_size": (["10gb", "512m", "1g"], ["0gb", "10 gb", "10tb", "-1g", "1234567g"]),
    "state.gcs_prefix": (["tpuserve", "team/a_b/c.d"],
                         ["-x", ".hidden", "a//b", "/abs", "a b", "p" * 201]),
    "capacity.model_geometry": (["models/x.json", "/abs/path with space/m.json"],
                                ["models/x.yaml", "a\n.json"]),
}


@pytest.mark.parametrize("setting", list(GOOD_AND_BAD))
def test_string_settings_match_their_allow_list(setting: str) -> None:
    section, key = setting.split(".")
    good, bad = GOOD_AND_BAD[setting]
    for value in good:  # the settings' own validators (a capacity rule may still read the file)
        deployments, found = validate(raw_with(**{section: {key: value}}))
        assert found == []
        assert getattr(getattr(deployments["spot"], section), key) == value
    for value in bad:
        [msg] = problems(**{section: {key: value}})
        assert f"{setting} = {shown(value)}: must be " in msg, msg


def test_state_bucket_rules() -> None:
    assert ok(state={"gcs_bucket": "my-tf.state_bucket"})["spot"].state.gcs_bucket
    for bad in ("ab", "goog-state", "192.168.0.1", "Bucket", "a" * 64, "-x", "a..b"):
        [msg] = problems(state={"gcs_bucket": bad})
        assert f"state.gcs_bucket = {bad!r}" in msg, msg


def test_durations_are_exact_words() -> None:
    for bad in ("4h\n", " 4h", "4 h", "-4h", "4h;id"):
        [msg] = problems(stack_flex={"max_run_duration": bad})
        assert f"stack.max_run_duration = {bad!r}" in msg, msg


def test_cidrs_in_canonical_form() -> None:
    [msg] = problems(access={"ssh_source_ranges": ["10.0.0.0/8\n"]})
    assert ("[spot, ondemand, flex, fleet] access.ssh_source_ranges = ['10.0.0.0/8\\n']: "
            "not a CIDR") in msg
    [msg] = problems(access={"ssh_source_ranges": ["2001:DB8::/32"]})
    assert "canonical form (write 2001:db8::/32)" in msg


def test_a_long_value_is_shown_cut() -> None:
    [msg] = problems(vllm={"model": "x" * 200_000})
    assert "(200000 characters)" in msg and len(msg) < 1000


def test_unreadable_and_malformed_files_are_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[vllm\n")
    for path, needle in ((bad, "not valid TOML"), (tmp_path / "missing.toml", "cannot be read"),
                         (tmp_path, "cannot be read")):
        with pytest.raises(ConfigError) as exc:
            load_raw(environ={"TPUSERVE_CONFIG": str(path)})
        [msg] = exc.value.problems
        # The value is shown cut to 80 characters (xdist's tmp paths are longer).
        assert msg.startswith(f"TPUSERVE_CONFIG = {str(path)[:40]!r}"[:-1]) and needle in msg


def test_tls_is_on_by_default_and_off_warns_when_the_port_is_open() -> None:
    d = ok()["spot"]
    assert d.access.tls == "self-signed" and d.access.tls_on and deployment_warnings(d) == []
    [msg] = problems(access={"tls": "on"})
    assert "access.tls = 'on'" in msg and "'self-signed' or 'off'" in msg
    closed = ok(access={"tls": "off"})["spot"]
    assert not closed.access.tls_on and deployment_warnings(closed) == []  # port 8000 closed
    for access in ({"tls": "off", "api_source_ranges": ["203.0.113.0/24"]},
                   {"api_key_proxy": False, "api_source_ranges": ["203.0.113.0/24"]}):
        d = ok(access=access)["spot"]
        assert not d.access.tls_on
        assert any("in clear text" in w for w in deployment_warnings(d)), access
