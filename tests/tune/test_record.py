"""Measurements become rules: a tune run recorded in [capacity] profiles_dir (the chosen config
with its figures, every failed boot with its error), cited by `plan`, and each learned refusal
a validator for its (model, accelerator, image) in one line."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.cli_support import assert_one_line_error, invoke
from tests.tune.toy_node import TOY_DIGEST, ToyNode, base_values
from tpuserve.planner.tuned import tuned_for
from tpuserve.settings import ConfigError, load
from tpuserve.tune.candidates import sets_for

TUNE = """
[capacity]
profiles_dir = "profiles"

[tune]
max_num_batched_tokens = [4096]
max_num_seqs = ["unset"]
max_model_len = [32768]
VLLM_TPU_BUCKET_PADDING_GAP = [0]
NUM_PRECOMPILE_WORKERS = [1, 4]
gpu_memory_utilization = [0.92, 0.93]
"""


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    cfg = tmp_path / "mine.toml"
    cfg.write_text(TUNE)
    env = {"TPUSERVE_CONFIG": str(cfg)}
    d = load(environ=env).deployments["flex"]
    # The node's memory wall at 0.93: those candidates fail to boot (691 s, SPEC 4's error).
    node = ToyNode(2, sets_for(d), base_values(d), wall=0.93)
    monkeypatch.setattr("tpuserve.cli.tune.node_for", lambda *_a: node)
    monkeypatch.chdir(tmp_path)
    return {"env": env, "cfg": cfg, "tmp": tmp_path, "d": d, "node": node}


def _tune(setup: dict[str, Any], *args: str) -> Any:
    return invoke("tune", "flex", "--yes", "--contexts", "1024", "--clients", "1,16", "--out",
                  str(setup["tmp"] / "out"), "--json", *args, env=setup["env"])


def test_a_run_is_recorded_and_plan_cites_it(setup: dict[str, Any]) -> None:
    r = _tune(setup)
    assert r.exit_code == 0, r.stderr
    path = Path(json.loads(r.stdout)["profile"])
    assert path.parent == setup["tmp"] / "profiles"  # beside the user's file
    doc = tomllib.loads(path.read_text())
    d = setup["d"]
    assert (doc["model"], doc["accelerator"], doc["image"], doc["image_digest"]) == (
        d.vllm.model, d.tpu.accelerator_type, d.vllm.image, TOY_DIGEST)
    (measured,) = doc["measured"]
    assert measured["node"] == d.node_name and measured["values"][
        "vllm.gpu_memory_utilization"] == 0.92
    # Both 0.93 candidates failed to boot: each a refusal of its whole combination (the
    # workers aside: they change how programs compile, not what they hold), not of 0.93 alone.
    assert {tuple(sorted(x["values"].items())) for x in doc["refusals"]} == {(
        ("vllm.env.VLLM_TPU_BUCKET_PADDING_GAP", 0), ("vllm.gpu_memory_utilization", 0.93),
        ("vllm.max_model_len", 32768), ("vllm.max_num_batched_tokens", 4096),
        ("vllm.max_num_seqs", "unset"), ("vllm.speculative_config", "off"))}
    assert all("691" in x["error"] or "Allocation" in x["error"] for x in doc["refusals"])
    # The image is a tag (it names no build): plan uses nothing and says which pin would.
    p = invoke("plan", "--stack", "flex", "--json", env=setup["env"])
    assert p.exit_code == 0, p.stderr
    assert "tuned" not in json.loads(p.stdout)["sources"]
    (note,) = [ln for ln in p.stderr.splitlines() if "tuned profile exists" in ln]
    assert f"vllm/vllm-tpu:nightly@{TOY_DIGEST}" in note
    # The default config (no profiles_dir) cites nothing.
    assert tuned_for(load(environ={}).deployments["flex"]) == (None, None)


def test_a_learned_refusal_is_a_validator_in_one_line(setup: dict[str, Any]) -> None:
    assert _tune(setup).exit_code == 0
    mine = setup["cfg"]
    mine.write_text(mine.read_text() + '\n[stacks.flex.vllm]\ngpu_memory_utilization = 0.93\n'
                    'allow_untested_gpu_memory_utilization = true\n')
    with pytest.raises(ConfigError) as err:
        load(environ=setup["env"])
    (line,) = [p for p in err.value.problems if "failed to boot" in p]
    assert "vllm.gpu_memory_utilization = 0.93" in line and setup["d"].node_name in line
    assert "learned by tpuserve tune" in line and "\n" not in line
    r = invoke("plan", "--stack", "flex", env=setup["env"])
    assert_one_line_error(r, "vllm.gpu_memory_utilization = 0.93", "failed to boot")


def test_the_next_search_never_tries_a_learned_refusal(setup: dict[str, Any]) -> None:
    assert _tune(setup).exit_code == 0
    r = _tune(setup, "--fresh", "--no-record")
    # The 0.93 candidates are refused by the learned validator, before anything boots (the
    # other refusal: n-gram drafting, not proved on the pinned image).
    assert r.exit_code == 0, r.stderr
    assert "2 candidates (2 refused)" in " ".join(r.stderr.split())
    report = (setup["tmp"] / "out" / "tune-flex-report.md").read_text()
    assert "gpu_memory_utilization = 0.93" in report and "learned by tpuserve tune" in report
    assert "m0.93" not in json.loads(r.stdout)["best"]


def test_record_without_a_profiles_dir_is_a_usage_error(setup: dict[str, Any],
                                                        tmp_path: Path) -> None:
    setup["cfg"].write_text(TUNE.replace('profiles_dir = "profiles"', ""))
    r = _tune(setup, "--record")
    assert_one_line_error(r, "--record", "profiles_dir")
    assert r.exit_code == 2


def test_a_broken_profile_file_fails_closed(setup: dict[str, Any]) -> None:
    profiles = setup["tmp"] / "profiles"
    profiles.mkdir()
    (profiles / "x.toml").write_text(f'version = 2\nmodel = "m"\nimage_digest = "{TOY_DIGEST}"\n'
                                     '[[refusals]]\nerror = 3\n')
    with pytest.raises(ConfigError) as err:
        load(environ=setup["env"])
    assert any("x.toml" in p and "capacity.profiles_dir" in p for p in err.value.problems)


def test_a_hostile_error_round_trips_as_one_line(tmp_path: Path) -> None:
    from tpuserve.settings.learned_profiles import LearnedProfile, Refusal, parse, refusal_line
    from tpuserve.tune.record import to_toml

    bad = 'boom"\n[[refusals]]\nx = "\\u0000 $(rm -rf /)'
    p = LearnedProfile(tmp_path / "p.toml", "m/x", "v5litepod-1", "img:t", TOY_DIGEST, (),
                       (Refusal("2026-12-02", "node-1", "c", bad,
                                {"vllm.max_num_batched_tokens": 8192,
                                 "vllm.env.NUM_PRECOMPILE_WORKERS": 4}),))
    back = parse(p.path, to_toml(p))
    (r,) = back.refusals
    assert r.values == {"vllm.max_num_batched_tokens": 8192,
                        "vllm.env.NUM_PRECOMPILE_WORKERS": 4}
    line = refusal_line(back, r)
    assert "\n" not in line and "\x00" not in line
    assert line.startswith("vllm.max_num_batched_tokens = 8192 with "
                           "vllm.env.NUM_PRECOMPILE_WORKERS = 4: failed to boot on node node-1 "
                           "on 2026-12-02")


def test_an_interrupted_run_records_nothing_and_resumes(setup: dict[str, Any]) -> None:
    setup["node"].interrupt_at_measure = 2
    r = _tune(setup)
    assert r.exit_code == 130, r.stderr
    # Nothing learned yet: a refusal would change the candidates the resume needs.
    assert not (setup["tmp"] / "profiles").exists()
    r = _tune(setup)
    assert r.exit_code == 0, r.stderr
    assert "resuming" in r.stderr and Path(json.loads(r.stdout)["profile"]).is_file()


def test_a_refusal_holds_its_combination_not_one_value(setup: dict[str, Any]) -> None:
    """Learned at 0.93 with 4096 batched tokens: 0.93 with 8192 is another program set, which
    may fit, so it is not refused; the very combination is."""
    assert _tune(setup).exit_code == 0
    mine = setup["cfg"]
    base = mine.read_text()
    mine.write_text(base + '\n[stacks.flex.vllm]\ngpu_memory_utilization = 0.93\n'
                    'allow_untested_gpu_memory_utilization = true\n'
                    'max_num_batched_tokens = 8192\n')
    assert load(environ=setup["env"]).deployments["flex"].vllm.max_num_batched_tokens == 8192


def test_the_tuners_own_timeout_is_no_refusal() -> None:
    """A boot the tuner gave up waiting for (no word from the watcher) proves nothing of the
    config: no refusal is learned from it."""
    from tpuserve.settings.loader import from_raw, load_raw
    from tpuserve.tune.candidates import space
    from tpuserve.tune.node import BootRecord
    from tpuserve.tune.record import entries
    from tpuserve.tune.state import Run, TuneState
    from tpuserve.tune.tpu_node import NO_WORD
    from tpuserve.tune.workload import Workload

    raw = load_raw(environ={})
    d = from_raw(raw).deployments["flex"]
    sp = space(d, raw)
    c = sp.candidates[1]
    st = TuneState("flex", "fp")
    why = f"{NO_WORD} for script sha256 0123456789ab after 3600 s"
    st.runs = {c.id: [Run(0, 2, BootRecord(False, 3600.0, error=why, digest=TOY_DIGEST),
                          error=why)]}
    out, _notes = entries(d, st, {x.id: x for x in sp.candidates}, sp.baseline, None,
                          Workload((1024,), (16,)), "2026-12-02")
    assert all(not refusals for _m, refusals in out.values())
