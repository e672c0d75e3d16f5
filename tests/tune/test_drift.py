"""`tune --keep-best` leaves the node on the chosen config: the state file records it (the
candidate, its served-config hash, the overlay), and `review` says the drift until the overlay
is merged into the config, then that deploying it records what the node runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli_support import invoke
from tests.tune.toy_node import TOY_DIGEST, ToyNode, base_values
from tpuserve.review.markdown import render_markdown
from tpuserve.review.model import Review
from tpuserve.settings import load
from tpuserve.settings.loader import load_raw
from tpuserve.tune import state as state_file
from tpuserve.tune.candidates import by_id, sets_for, space
from tpuserve.tune.drift import review_notes, served_sha256
from tpuserve.tune.session import state_path

TUNE = """
[tune]
max_num_batched_tokens = [8192]  # not the stack's own 4096: the node drifts
max_num_seqs = ["unset"]
max_model_len = [32768]
VLLM_TPU_BUCKET_PADDING_GAP = [0]
NUM_PRECOMPILE_WORKERS = [1]
gpu_memory_utilization = [0.92]
"""


@pytest.fixture
def kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    cfg = tmp_path / "mine.toml"
    cfg.write_text(TUNE)
    env = {"TPUSERVE_CONFIG": str(cfg)}
    d = load(environ=env).deployments["flex"]
    node = ToyNode(2, sets_for(d), base_values(d))
    monkeypatch.setattr("tpuserve.cli.tune.node_for", lambda *_a: node)
    monkeypatch.chdir(tmp_path)
    overlay = tmp_path / "overlay.toml"
    r = invoke("tune", "flex", "--yes", "--keep-best", "--contexts", "1024", "--clients", "1",
               "--out", str(tmp_path / "out"), "--write", str(overlay), "--json", env=env)
    assert r.exit_code == 0, r.stderr
    return {"env": env, "cfg": cfg, "overlay": overlay, "doc": json.loads(r.stdout), "d": d}


def test_keep_best_records_the_config_the_node_is_left_on(kept: dict[str, Any]) -> None:
    best = kept["doc"]["best"]
    assert kept["doc"]["node_on"] == best != "terraform"
    st = state_file.load(state_path("flex", kept["env"]))
    assert st is not None and st.node_on == best and st.overlay == str(kept["overlay"])
    raw = load_raw(environ=kept["env"])
    candidates = by_id(space(kept["d"], raw).candidates)
    assert st.node_on_sha256 == served_sha256(kept["d"], raw, candidates[best])


def test_review_says_the_drift_until_the_overlay_is_merged(kept: dict[str, Any]) -> None:
    env = kept["env"]
    (note,) = review_notes(load(environ=env).deployments, lambda n: state_path(n, env))
    assert note["stack"] == "flex" and not note["merged"]
    assert str(kept["overlay"]) in note["note"] and str(state_path("flex", env)) in note["note"]
    assert "not what the node runs" in note["note"]
    md = render_markdown(Review("base", "head", ()), drift=[("flex", note["note"])])
    assert "The running server is not Terraform's" in md and "`flex`" in md
    # The overlay merged after the user's file: the config renders the node's config.
    both = {"TPUSERVE_CONFIG": f"{kept['cfg']}:{kept['overlay']}"}
    (merged,) = review_notes(load(environ=both).deployments, lambda n: state_path(n, env))
    assert merged["merged"] and "records it in Terraform's state" in merged["note"]
    # The overlay pins the build the node's boot ran: merged, and deploying it re-runs once.
    assert f"pinned to the build the node runs ({TOY_DIGEST})" in merged["note"]


def test_an_overlay_pinned_to_another_build_is_not_merged(kept: dict[str, Any]) -> None:
    other = kept["overlay"].with_name("other.toml")
    other.write_text(kept["overlay"].read_text().replace(TOY_DIGEST, "sha256:" + "5" * 64))
    env = {"TPUSERVE_CONFIG": f"{kept['cfg']}:{other}"}
    (note,) = review_notes(load(environ=env).deployments,
                           lambda n: state_path(n, kept["env"]))
    assert not note["merged"] and "not what the node runs" in note["note"]


def test_the_review_command_reads_the_state_beside_its_config(kept: dict[str, Any]) -> None:
    from tpuserve.cli.review import _drift

    (note,) = _drift(kept["cfg"])
    assert note["stack"] == "flex" and note["candidate"] == kept["doc"]["best"]


def test_without_keep_best_nothing_drifts(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "mine.toml"
    cfg.write_text(TUNE)
    env = {"TPUSERVE_CONFIG": str(cfg)}
    d = load(environ=env).deployments["flex"]
    monkeypatch.setattr("tpuserve.cli.tune.node_for",
                        lambda *_a: ToyNode(2, sets_for(d), base_values(d)))
    monkeypatch.chdir(tmp_path)
    r = invoke("tune", "flex", "--yes", "--contexts", "1024", "--clients", "1", "--out",
               str(tmp_path / "out"), env=env)
    assert r.exit_code == 0, r.stderr
    assert review_notes(load(environ=env).deployments, lambda n: state_path(n, env)) == []


def test_a_speculative_choice_is_an_overlay_the_loader_takes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "mine.toml"
    cfg.write_text(TUNE + 'speculative_config = [{ method = "ngram", num_speculative_tokens '
                   '= 3, prompt_lookup_max = 5 }]\n\n[stacks.flex.vllm]\n'
                   'allow_untested_speculative_config = true\n')
    env = {"TPUSERVE_CONFIG": str(cfg)}
    d = load(environ=env).deployments["flex"]
    node = ToyNode(2, sets_for(d), base_values(d))
    monkeypatch.setattr("tpuserve.cli.tune.node_for", lambda *_a: node)
    monkeypatch.chdir(tmp_path)
    overlay = tmp_path / "overlay.toml"
    r = invoke("tune", "flex", "--yes", "--contexts", "1024", "--clients", "1", "--out",
               str(tmp_path / "out"), "--write", str(overlay), "--json", env=env)
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["best"].endswith("dngram3")
    # Each boot carried the table as the settings take it.
    assert all(o["speculative_config"]["prompt_lookup_max"] == 5
               for kind, o in node.log if kind == "apply")
    both = load(environ={"TPUSERVE_CONFIG": f"{cfg}:{overlay}"}).deployments["flex"]
    assert both.vllm.speculative_config == {"method": "ngram", "num_speculative_tokens": 3,
                                            "prompt_lookup_max": 5}
