"""TPUSERVE_CONFIG names one TOML file or several separated by ':', merged in order over the
embedded default (later ones win); each relative path inside a file is relative to that file;
an empty element or a file that cannot be read is one line naming TPUSERVE_CONFIG and the
path."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tpuserve.paths import CONFIG_DIR
from tpuserve.settings import ConfigError, load, load_raw
from tpuserve.settings.string_rules import shown

GEOMETRY = CONFIG_DIR / "models" / "gemma-4-E2B-it.json"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def env_of(*paths: Path | str) -> dict[str, str]:
    return {"TPUSERVE_CONFIG": ":".join(str(p) for p in paths)}


def test_later_files_win_key_by_key(tmp_path: Path) -> None:
    mine = write(tmp_path / "mine.toml", '[vllm]\nmax_model_len = 16384\nmax_num_seqs = 128\n'
                                         '[stacks.spot.vllm]\nmax_model_len = 8192\n')
    overlay = write(tmp_path / "overlay.toml", "[stacks.spot.vllm]\nmax_model_len = 4096\n")
    raw = load_raw(environ=env_of(mine, overlay))
    assert raw["vllm"]["max_model_len"] == 16384 and raw["vllm"]["max_num_seqs"] == 128
    assert raw["stacks"]["spot"]["vllm"]["max_model_len"] == 4096  # the overlay's
    assert raw["stacks"]["spot"]["provisioning_model"] == "spot"  # the default's, kept
    # The other order: the first file's stack table wins over the overlay's.
    assert load_raw(environ=env_of(overlay, mine))["stacks"]["spot"]["vllm"][
        "max_model_len"] == 8192
    d = load(env_of(mine, overlay)).deployments
    assert (d["spot"].vllm.max_model_len, d["ondemand"].vllm.max_model_len) == (4096, 16384)


def test_one_file_is_as_before(tmp_path: Path) -> None:
    mine = write(tmp_path / "mine.toml", "[vllm]\nmax_model_len = 16384\n")
    assert load_raw(environ=env_of(mine)) == load_raw(environ={"TPUSERVE_CONFIG": str(mine)})
    assert load_raw(environ=env_of(mine))["vllm"]["max_model_len"] == 16384


def test_each_relative_path_is_relative_to_the_file_that_names_it(tmp_path: Path) -> None:
    shutil.copy(GEOMETRY, write(tmp_path / "a" / "models" / "g.json", "").parent / "g.json")
    shutil.copy(GEOMETRY, write(tmp_path / "b" / "g.json", ""))
    first = write(tmp_path / "a" / "mine.toml", '[capacity]\nmodel_geometry = "models/g.json"\n')
    # The overlay names its own file for one stack; the first file's stays for the rest.
    overlay = write(tmp_path / "b" / "overlay.toml",
                    '[stacks.spot.capacity]\nmodel_geometry = "g.json"\n')
    raw = load_raw(environ=env_of(first, overlay))
    root = tmp_path.resolve()
    assert raw["capacity"]["model_geometry"] == str(root / "a" / "models" / "g.json")
    assert raw["stacks"]["spot"]["capacity"]["model_geometry"] == str(root / "b" / "g.json")
    d = load(env_of(first, overlay)).deployments
    assert d["spot"].capacity.geometry_path == root / "b" / "g.json"
    assert d["flex"].capacity.geometry_path == root / "a" / "models" / "g.json"


@pytest.mark.parametrize("value", ["{a}::{b}", ":{a}", "{a}:", "{a}:{b}:"])
def test_an_empty_element_is_one_line(tmp_path: Path, value: str) -> None:
    a = write(tmp_path / "a.toml", "")
    b = write(tmp_path / "b.toml", "")
    text = value.format(a=a, b=b)
    with pytest.raises(ConfigError) as exc:
        load_raw(environ={"TPUSERVE_CONFIG": text})
    [msg] = exc.value.problems
    assert msg.startswith("TPUSERVE_CONFIG = ") and "\n" not in msg
    assert " is empty; TPUSERVE_CONFIG is a list of TOML files separated by ':'" in msg
    n = text.split(":").index("") + 1
    assert f": file {n} of {len(text.split(':'))} is empty" in msg


def test_a_missing_or_bad_file_in_the_list_is_one_line_naming_it(tmp_path: Path) -> None:
    a = write(tmp_path / "a.toml", "")
    bad = write(tmp_path / "bad.toml", "[vllm\n")
    for path, needle in ((tmp_path / "missing.toml", "cannot be read"),
                         (bad, "not valid TOML")):
        with pytest.raises(ConfigError) as exc:
            load_raw(environ=env_of(a, path))
        [msg] = exc.value.problems
        assert msg.startswith("TPUSERVE_CONFIG = ") and "\n" not in msg
        # The file is named on its own (the whole value may be shown cut).
        assert f"file 2 of 2 = {shown(str(path))}: {needle}" in msg
