"""`tpuserve plan --model-config FILE` against hostile geometry files.

Each row edits the shipped Gemma 4 E2B config.json (or replaces the whole file) and expects
exit code 2 with one `tpuserve: error:` line naming the field, the value and the rule: never
a traceback, a ZeroDivisionError, an OverflowError, a MemoryError, or a plan built on `true`
read as 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_cli_plan import invoke
from tpuserve.paths import REPO_ROOT
from tpuserve.planner.arithmetic import load_geometry
from tpuserve.planner.geometry import MAX_FILE_BYTES

E2B = REPO_ROOT / "config" / "models" / "gemma-4-E2B-it.json"
LAYERS = json.loads(E2B.read_text())["text_config"]["layer_types"]

# (id, text_config edits, what the one error line must contain)
EDITS: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("layers-true", {"num_hidden_layers": True},
     ("text_config.num_hidden_layers = true", "must be an integer")),
    ("layers-float", {"num_hidden_layers": 35.0},
     ("text_config.num_hidden_layers = 35.0", "must be an integer")),
    ("layers-string", {"num_hidden_layers": "35"},
     ("text_config.num_hidden_layers = '35'", "must be an integer")),
    ("layers-zero", {"num_hidden_layers": 0},
     ("text_config.num_hidden_layers = 0", "must be in [1, ")),
    ("layers-huge", {"num_hidden_layers": 10**30},
     ("text_config.num_hidden_layers = 1000000000000000000000000000000", "must be in [1, ")),
    ("layers-null", {"num_hidden_layers": None},
     ("text_config.num_hidden_layers = null", "must be an integer")),
    ("layers-missing", {"num_hidden_layers": ...}, ("text_config.num_hidden_layers is required",)),
    ("heads-negative", {"num_attention_heads": -8},
     ("text_config.num_attention_heads = -8", "must be in [1, ")),
    ("kv-heads-zero", {"num_key_value_heads": 0},
     ("text_config.num_key_value_heads = 0", "must be in [1, ")),
    ("kv-heads-not-dividing", {"num_key_value_heads": 3},
     ("num_key_value_heads = 3", "must divide num_attention_heads (8)")),
    ("global-kv-heads-not-dividing", {"num_global_key_value_heads": 5},
     ("num_global_key_value_heads = 5", "must divide")),
    ("head-dim-inf", {"head_dim": 1e308}, ("text_config.head_dim = 1e+308", "must be an integer")),
    ("head-dim-nan", {"head_dim": float("nan")}, ("text_config.head_dim = NaN", "integer")),
    ("hidden-2-64", {"hidden_size": 2**64},
     ("text_config.hidden_size = 18446744073709551616", "must be in [1, 262,144]")),
    ("vocab-negative", {"vocab_size": -262144}, ("text_config.vocab_size = -262144",)),
    ("intermediate-huge", {"intermediate_size": 2**40},
     ("text_config.intermediate_size = 1099511627776", "must be in [1, ")),
    ("intermediate-list-short", {"intermediate_size": [6144] * 34},
     ("intermediate_size has 34 entries", "num_hidden_layers = 35")),
    ("intermediate-list-negative", {"intermediate_size": [6144] * 34 + [-1]},
     ("text_config.intermediate_size.34 = -1", "must be in [1, ")),
    ("layer-types-short", {"layer_types": LAYERS[:34]},
     ("layer_types has 34 entries", "num_hidden_layers = 35")),
    ("layer-types-unknown", {"layer_types": [*LAYERS[:34], "cross_attention"]},
     ("text_config.layer_types.34 = 'cross_attention'", "'full_attention'")),
    ("layer-types-huge", {"layer_types": ["full_attention"] * 2000},
     ("text_config.layer_types", "at most 1024 entries")),
    ("shared-all-layers", {"num_kv_shared_layers": 35},
     ("num_kv_shared_layers = 35", "must be < num_hidden_layers (35)")),
    ("shared-negative", {"num_kv_shared_layers": -1},
     ("text_config.num_kv_shared_layers = -1", "must be in [0, 1,024]")),
    ("shared-without-source", {"num_kv_shared_layers": 34},
     ("num_kv_shared_layers = 34: shared layer 4", "no earlier cache-owning full_attention layer")),
    ("window-zero", {"sliding_window": 0},
     ("text_config.sliding_window = 0", "must be in [1, ")),
    ("window-missing", {"sliding_window": None},
     ("sliding_window is required", "sliding_attention")),
    ("tie-string", {"tie_word_embeddings": "yes"},
     ("text_config.tie_word_embeddings = 'yes'", "must be true or false")),
    ("k-eq-v", {"attention_k_eq_v": True}, ("attention_k_eq_v = true", "not modelled")),
]

# (id, whole file contents, what the one error line must contain)
FILES: list[tuple[str, str, tuple[str, ...]]] = [
    ("a-list", "[]", ("the file holds list", "must be a JSON object")),
    ("a-number", "35", ("the file holds int",)),
    ("text-config-string", '{"text_config": "gemma"}', ("text_config = 'gemma'", "object")),
    ("not-json", "{", ("not JSON",)),
    ("int-of-5000-digits", '{"num_hidden_layers": 1' + "0" * 5000 + "}", ("not JSON",)),
    ("deep", "[" * 200_000 + "]" * 200_000, ("nests too deeply",)),
    ("too-big", " " * (MAX_FILE_BYTES + 1) + "{}", ("over 1,048,576 bytes",)),
    ("not-utf8", '{"a": "\xff"}'.encode("latin-1").decode("latin-1"), ()),
]


@pytest.fixture(autouse=True)
def _embedded_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TPUSERVE_CONFIG", "TPUSERVE_PROJECT", "TPUSERVE_ZONE"):
        monkeypatch.delenv(var, raising=False)


def edited(path: Path, edits: dict[str, Any]) -> Path:
    doc = json.loads(E2B.read_text())
    for key, value in edits.items():
        if value is ...:
            del doc["text_config"][key]
        else:
            doc["text_config"][key] = value
    path.write_text(json.dumps(doc))
    return path


def assert_refused(args: list[str], needles: tuple[str, ...], *, stderr: str,
                   code: int, path: Path) -> None:
    assert code == 2, stderr
    assert "Traceback" not in stderr and "Error:" not in stderr.replace("error:", ""), stderr
    [line] = stderr.strip().splitlines()
    assert line.startswith(f"tpuserve: error: --model-config {str(path)!r}: "), line
    for needle in needles:
        assert needle in line, (needle, line)


@pytest.mark.parametrize(("edits", "needles"), [e[1:] for e in EDITS], ids=[e[0] for e in EDITS])
def test_hostile_fields_are_one_line_usage_errors(
    tmp_path: Path, edits: dict[str, Any], needles: tuple[str, ...]
) -> None:
    path = edited(tmp_path / "config.json", edits)
    result = invoke("--model-config", str(path))
    assert_refused([], needles, stderr=result.stderr, code=result.exit_code, path=path)


@pytest.mark.parametrize(("text", "needles"), [f[1:] for f in FILES], ids=[f[0] for f in FILES])
def test_hostile_files_are_one_line_usage_errors(
    tmp_path: Path, text: str, needles: tuple[str, ...]
) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(text.encode("latin-1") if "\xff" in text else text.encode())
    result = invoke("--model-config", str(path))
    assert_refused([], needles, stderr=result.stderr, code=result.exit_code, path=path)


def test_json_output_lists_the_errors(tmp_path: Path) -> None:
    path = edited(tmp_path / "config.json", {"num_attention_heads": True})
    result = invoke("--json", "--model-config", str(path))
    assert result.exit_code == 2
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 2
    [error] = doc["errors"]
    assert "text_config.num_attention_heads = true: must be an integer" in error


@pytest.mark.parametrize("edits", [{"num_attention_heads": True}, {"num_key_value_heads": 0}],
                         ids=["true-as-heads", "zero-kv-heads"])
def test_the_installed_cli(tmp_path: Path, edits: dict[str, Any]) -> None:
    """The real entry point (`python -m tpuserve`), as a user runs it."""
    path = edited(tmp_path / "config.json", edits)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUSERVE_")}
    proc = subprocess.run([sys.executable, "-m", "tpuserve", "plan", "--model-config", str(path)],
                          env=env, capture_output=True, text=True, check=False)
    field = next(iter(edits))
    assert_refused([], (f"text_config.{field} = ",), stderr=proc.stderr, code=proc.returncode,
                   path=path)
    assert proc.stdout == ""


def test_the_shipped_geometry_and_a_top_level_one_pass(tmp_path: Path) -> None:
    nested = load_geometry(E2B)
    top = tmp_path / "top.json"
    top.write_text(json.dumps(json.loads(E2B.read_text())["text_config"]))
    assert load_geometry(top) == nested
    assert nested.num_hidden_layers == 35 and nested.num_kv_shared_layers == 20
