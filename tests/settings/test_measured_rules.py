"""Each measured rule is one object: the validator raises its text, synth prints its warning,
the review's flag note and docs/configuration.md read it, and the argv spells its flag."""

from __future__ import annotations

import ast
import dataclasses
import tomllib
from typing import Any

import pytest

from tpuserve.paths import DEFAULT_CONFIG, REPO_ROOT
from tpuserve.render.vllm_args import serve_argv, serve_flags
from tpuserve.settings import ConfigError, from_raw, load_raw
from tpuserve.settings import measured_rules as mr
from tpuserve.settings.deployment import Deployment
from tpuserve.settings.flag_rules import FLAG_RULES, rule_for
from tpuserve.settings.loader import deep_merge
from tpuserve.settings.reference import DOC_PATH, render
from tpuserve.settings.stack import StackKeys
from tpuserve.settings.vllm import VllmSettings

MISSING = object()

# Config overlays that break rules; every error and warning rule must be met by one of them.
EXAMPLES: list[dict[str, Any]] = [
    {"vllm": {"dtype": "float16"}},
    {"vllm": {"kv_cache_dtype": "int8"}},
    {"vllm": {"kv_cache_dtype": "nvfp4"}},
    {"vllm": {"kv_cache_dtype": "float16"}},
    {"vllm": {"kv_cache_dtype": "q4"}},
    {"vllm": {"kv_cache_dtype": "fp8"}},
    {"vllm": {"max_num_batched_tokens": 2048}},
    {"vllm": {"max_num_batched_tokens": 3000}},
    {"vllm": {"tensor_parallel_size": 4}, "tpu": {"accelerator_type": "v5litepod-4"}},
    {"vllm": {"gpu_memory_utilization": 0.95}},
    {"vllm": {"gpu_memory_utilization": 0.93}},
    {"vllm": {"gpu_memory_utilization": 0.94, "allow_untested_gpu_memory_utilization": True}},
    {"vllm": {"max_num_seqs": 64}},
    {"vllm": {"block_size": 512}},
    {"pricing": {"spot": 1000.0}},
    {"pricing": {"flex": 0}},
    {"pricing": {"ondemand": 120}},
    {"tpu": {"accelerator_type": "v5e-8"}},
    {"tpu": {"accelerator_type": "v6e-1"}},
    {"tpu": {"accelerator_type": "v5litepod-16"}},
    {"tpu": {"accelerator_type": "v7-1"}},
    {"fleet": {"scale_up_period_s": 300}},
    {"fleet": {"scale_down_window_s": 0}},
]


def _outcome(over: dict[str, Any]) -> list[str]:
    """The problems, or else the warnings, of the default config with `over` merged in."""
    try:
        return from_raw(deep_merge(load_raw(environ={}), over)).warnings
    except ConfigError as exc:
        return exc.problems


def _value(over: dict[str, Any], setting: str) -> Any:
    section, _, field = setting.rpartition(".")
    return over.get(section, {}).get(field, MISSING)


@pytest.fixture(scope="module")
def outcomes() -> list[tuple[dict[str, Any], list[str]]]:
    return [(over, _outcome(over)) for over in EXAMPLES]


@pytest.mark.parametrize("rule", [r for r in mr.RULES if r.level != "note"],
                         ids=lambda r: f"{r.setting}:{r.level}:{r.words[:24]}")
def test_the_validator_or_synth_says_the_rules_own_text(rule: mr.Rule, outcomes: Any) -> None:
    # An error appears for every stack at once, a warning once per stack: either way the line
    # ends with the rule's own text for that value.
    met = [over for over, lines in outcomes
           if _value(over, rule.setting) is not MISSING
           and any(line.endswith("] " + rule.text(_value(over, rule.setting)))
                   for line in lines)]
    assert met, f"no example meets {rule.setting}: {rule.words}"


def test_an_error_rule_refuses_before_anything_is_built() -> None:
    fatal = next(mr.rules_of("vllm.gpu_memory_utilization", "error"))
    with pytest.raises(ConfigError) as exc:
        from_raw(deep_merge(load_raw(environ={}), {"vllm": {"gpu_memory_utilization": 0.97}}))
    assert exc.value.problems == [f"[spot, ondemand, flex, fleet] {fatal.text(0.97)}"]
    assert fatal.text(0.97) == (
        "vllm.gpu_memory_utilization = 0.97: must be <= 0.92 (SPEC 4: 0.95 died 691 s into "
        "boot with RuntimeProgramAllocationFailure (compiled XLA programs need the 1.26 GiB "
        "left outside the cap), twice)")


def test_changing_a_rule_object_changes_the_error_the_warning_and_the_docs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    probe = "SPEC 4: probe figure"
    rules = tuple(dataclasses.replace(r, measurement=probe)
                  if r.setting in ("vllm.block_size", "vllm.max_num_seqs") and r.level != "note"
                  else r for r in mr.RULES)
    monkeypatch.setattr(mr, "RULES", rules)
    want = f"vllm.block_size = 16: never set it; the backend picks it from max_model_len ({probe})"
    assert want in _outcome({"vllm": {"block_size": 16}})[0]
    assert any(w.endswith(f"vllm.max_num_seqs = 64: capping it was worse in every measured "
                          f"cell ({probe}); leave it unset")
               for w in _outcome({"vllm": {"max_num_seqs": 64}}))
    section = render().split("### `vllm.block_size`")[1].split("###")[0]
    assert f"- error: never set it; the backend picks it from max_model_len ({probe})" in section


def test_each_note_is_the_reviews_flag_note_and_the_docs_text() -> None:
    notes = [r for r in mr.RULES if r.level == "note"]
    assert rule_for("--gpu-memory-utilization").rule == next(
        mr.rules_of("vllm.gpu_memory_utilization", "note")).note
    docs = render()
    for note in notes:
        [flag_rule] = [f for f in FLAG_RULES.values() if f.rule == note.note]
        assert flag_rule.setting == note.setting
        if note.setting != "(fixed)":
            assert f"### `{note.setting}`" in docs
            assert note.note in docs.split(f"### `{note.setting}`")[1].split("###")[0]
    assert len(FLAG_RULES) == len(notes)  # no two notes under one name


def test_a_flag_is_spelled_once_on_its_setting() -> None:
    # The argv renders the spelling on the field; the review names the same field by it.
    # tensor_parallel_size: None in [vllm] alone (the deployment derives it from the slice).
    everything = VllmSettings().model_copy(
        update={"max_num_seqs": 8, "block_size": 512, "tensor_parallel_size": 1,
                "speculative_config": {"method": "ngram", "num_speculative_tokens": 4}})
    argv = serve_argv(everything)
    for name, flag, _kind in serve_flags():
        assert FLAG_RULES[flag].setting == f"vllm.{name}"
        if name not in ("gpu_memory_utilization", "kv_cache_memory_bytes"):
            assert flag in argv, flag
    source = (REPO_ROOT / "tpuserve" / "render" / "vllm_args.py").read_text()
    assert [f for _n, f, _k in serve_flags() if f'"{f}"' in source] == []


def test_the_configuration_reference_is_generated_and_current() -> None:
    path = REPO_ROOT / DOC_PATH
    assert path.is_file(), "run: python tools/gen_config_reference.py"
    assert path.read_text(encoding="utf-8") == render(), (
        f"{DOC_PATH} is stale: run python tools/gen_config_reference.py")


def test_every_setting_has_its_section_in_the_reference() -> None:
    docs = render()
    for section, info in Deployment.model_fields.items():
        # A stack's table is documented by every key it takes (StackKeys), whatever its kind.
        model = StackKeys if section == "stack" else info.annotation
        if not (isinstance(model, type) and hasattr(model, "model_fields")):
            continue  # the stack's name: set by the loader
        for name, field in model.model_fields.items():
            if not hasattr(field.annotation, "model_fields"):
                assert f"### `{section}.{name}`" in docs
    assert "### `vllm.env.NUM_PRECOMPILE_WORKERS`" in docs
    # A rule's words reach the docs with `<name>` where its message puts the value.
    assert "compiles as the <bucket> bucket anyway" in docs


# --------------------------------------------------------------------------- default.toml


def _model_default(path: list[str]) -> Any:
    model: Any = Deployment
    if path[0] in StackKeys.model_fields:
        model, path = StackKeys, path
    for key in path[:-1]:
        model = model.model_fields[key].annotation
    info = model.model_fields[path[-1]]
    return MISSING if info.is_required() else info.get_default(
        call_default_factory=True)


def _leaves(table: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for key, value in table.items():
        if isinstance(value, dict) and key != "limit_mm_per_prompt":
            out += _leaves(value, (*prefix, key))
        else:
            out.append((*prefix, key))
    return out


def test_default_toml_restates_no_model_default() -> None:
    raw = tomllib.loads(DEFAULT_CONFIG.read_text(encoding="utf-8"))
    restated = []
    for leaf in _leaves(raw):
        path = list(leaf[2:] if leaf[0] == "stacks" else leaf)
        value: Any = raw
        for key in leaf:
            value = value[key]
        if value == _model_default(path):
            restated.append(".".join(leaf))
    # limit_mm_per_prompt moved to the model's profile, which a user's table merges into.
    assert restated == []


def test_a_users_limit_mm_table_merges_into_the_default_one() -> None:
    # Why default.toml keeps limit_mm_per_prompt: {image = 0} leaves audio = 1 (as it always did).
    d = from_raw(deep_merge(load_raw(environ={}), {"vllm": {"limit_mm_per_prompt": {"image": 0}}}))
    assert d.deployments["spot"].vllm.limit_mm_per_prompt == {"image": 0, "audio": 1}


# Validators that still raise a measured rule of their own (not a Rule, so neither
# docs/configuration.md nor the review sees it), each with why. A listed file that no longer
# does fails, so the list cannot go stale.
OWN_MEASURED_ERRORS: dict[str, str] = {
    # image_reference: one check for every image setting (vllm.image, access.proxy_image).
    "tpuserve/settings/base.py": "a check shared by several settings",
    # The slice's chips and ceiling: limits derived per accelerator, not a value's own rule.
    "tpuserve/settings/accelerator_rules.py": "limits derived from the slice",
}


def _own_measured_errors(path: Any) -> list[int]:
    """Lines of `spec_error(...)` calls whose text cites a SPEC section."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "spec_error"
            and any(isinstance(c, ast.Constant) and isinstance(c.value, str)
                    and "SPEC " in c.value for arg in node.args for c in ast.walk(arg))]


def test_a_measured_error_is_a_rule_object() -> None:
    found = {str(p.relative_to(REPO_ROOT)): lines
             for p in sorted((REPO_ROOT / "tpuserve" / "settings").glob("*.py"))
             if (lines := _own_measured_errors(p))}
    assert {f: n for f, n in found.items() if f not in OWN_MEASURED_ERRORS} == {}, (
        "a measured rule belongs in settings/measured_rules.py (a Rule the validator enforces)")
    assert set(OWN_MEASURED_ERRORS) <= set(found), "a listed file raises none now: unlist it"


def test_the_measured_error_scan_finds_a_spec_citation(tmp_path: Any) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text('raise spec_error("a.b", 1, "must be 2", f"SPEC 4: {1} s")\n')
    assert _own_measured_errors(probe) == [1]
    probe.write_text('raise spec_error("a.b", 1, "must be 2", "Cloud Tasks: 30 days")\n')
    assert _own_measured_errors(probe) == []
