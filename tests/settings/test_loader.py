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


def test_warnings_name_their_stack_and_shared_ones_come_last() -> None:
    warnings = load({}).warnings
    assert warnings, "the default config warns that stacks share the network"
    per_stack = [w for w in warnings if w.startswith("[")]
    shared = [w for w in warnings if not w.startswith("[")]
    assert warnings == per_stack + shared
    assert any("each create the network" in w for w in shared)
