"""THE loader: one path from TOML to validated, capacity-checked deployments and warnings, the
same for synth, the CLI and the review."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.cli_support import invoke
from tpuserve.paths import CONFIG_DIR
from tpuserve.settings import ConfigError, load

GEOMETRY = CONFIG_DIR / "models" / "gemma-4-E2B-it.json"


def _user_config(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "mine.toml"
    path.write_text(text)
    return {"TPUSERVE_CONFIG": str(path)}


def test_a_capacity_rule_refuses_in_the_cli_as_in_synth(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # A 1 MiB KV pool: the settings' validators pass, the planner's
    # capacity rule does not. Synth refused this before; `tpuserve status` used to accept it.
    env = _user_config(tmp_path, '[vllm]\nkv_cache_memory_bytes = 1048576\n')
    with pytest.raises(ConfigError) as exc:
        load(env)
    [problem] = exc.value.problems
    assert "vllm.max_model_len = 32768: one request needs 32,768 KV tokens" in problem
    monkeypatch.setenv("TPUSERVE_CONFIG", env["TPUSERVE_CONFIG"])
    for args in (("status", "spot", "--json"), ("endpoint", "spot")):
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert "one request needs 32,768 KV tokens" in result.output


def test_a_relative_geometry_in_a_users_file_is_read_beside_that_file(tmp_path: Path) -> None:
    mine = tmp_path / "geometry"
    mine.mkdir()
    shutil.copy(GEOMETRY, mine / "tiny.json")
    env = _user_config(tmp_path, '[capacity]\nmodel_geometry = "geometry/tiny.json"\n')
    d = load(env).deployments["spot"]
    assert d.capacity.geometry_path == (mine / "tiny.json").resolve()
    # Not found beside the user's file: the message names the file it looked for, there.
    env = _user_config(tmp_path, '[capacity]\nmodel_geometry = "geometry/absent.json"\n')
    with pytest.raises(ConfigError) as exc:
        load(env)
    assert str(mine / "absent.json") in str(exc.value)


def test_a_relative_geometry_in_a_stack_table_is_anchored_too(tmp_path: Path) -> None:
    (tmp_path / "g.json").write_text(json.dumps(json.loads(GEOMETRY.read_text())))
    env = _user_config(tmp_path, '[stacks.flex.capacity]\nmodel_geometry = "g.json"\n')
    loaded = load(env).deployments
    assert loaded["flex"].capacity.geometry_path == (tmp_path / "g.json").resolve()
    assert loaded["spot"].capacity.geometry_path == GEOMETRY.resolve()  # the default's config/


def test_the_default_config_loads_quietly_with_its_base() -> None:
    loaded = load({})
    # The stacks used to warn that each created the deployment's network: the base holds it.
    # The fleet warns of its placeholder image digest and its Gateway without a domain; spot
    # and the fleet's spot pool, that spot v5e costs less in another region (tpuserve/prices).
    assert [w.split(" ", 2)[:2] for w in loaded.warnings] == [
        ["[spot]", "pricing.spot:"], ["[fleet]", "vllm.image"], ["[fleet]", "fleet.domain"],
        ["[fleet]", "pricing.spot:"]]
    assert loaded.base is not None and loaded.base.deployment == "tpuserve"
    assert {d.base for d in loaded.deployments.values()} == {loaded.base}


def test_warnings_name_their_stack(tmp_path: Path) -> None:
    env = _user_config(tmp_path, '[vllm]\nkv_cache_dtype = "fp8"\n')
    warnings = load(env).warnings
    assert [w.split("]")[0] for w in warnings if "kv_cache_dtype" in w] == [
        "[spot", "[ondemand", "[flex", "[fleet"]


@pytest.mark.parametrize(("table", "setting"), [
    ('[stacks.flex.gcp]\nzone = "us-central1-a"', "region of gcp.zone = 'us-central1'"),
    ('[stacks.flex.gcp]\ndeployment = "other"', "gcp.deployment = 'other'"),
    ('[stacks.flex.gcp]\nproject = "another-project"', "gcp.project = 'another-project'"),
    ('[stacks.flex.gcp]\nnetwork = "my-vpc"', "gcp.network = 'my-vpc'"),
    ('[stacks.flex.cache]\nretention_days = 3', "cache.retention_days = 3"),
    ('[stacks.flex.state]\ngcs_bucket = "my-tfstate"', "state.gcs_bucket = 'my-tfstate'"),
])
def test_a_stack_that_moves_off_its_base_is_refused(tmp_path: Path, table: str,
                                                     setting: str) -> None:
    env = _user_config(tmp_path, table + "\n")
    with pytest.raises(ConfigError) as exc:
        load(env)
    [msg] = exc.value.problems
    assert msg.startswith(f"[flex] {setting}: must be the base's ")
    assert "the `base` stack holds" in msg and "TPUSERVE_CONFIG" in msg


def test_another_zone_of_the_bases_region_is_fine(tmp_path: Path) -> None:
    env = _user_config(tmp_path, '[stacks.spot.gcp]\nzone = "us-west4-b"\n')
    loaded = load(env)
    assert loaded.deployments["spot"].gcp.zone == "us-west4-b"
    assert loaded.deployments["spot"].base == loaded.base


def test_a_whole_config_moved_to_another_region_and_deployment_is_its_own_base(
        tmp_path: Path) -> None:
    env = _user_config(tmp_path, '[gcp]\nzone = "us-central1-a"\ndeployment = "dev"\n')
    base = load(env).base
    assert (base.region, base.deployment, base.cache_bucket) == (
        "us-central1", "dev", "tpuserve-placeholder-dev-xla-cache")
    assert base.local_state("flex") == "terraform.dev.flex.tfstate"
