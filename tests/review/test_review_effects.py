"""What each change does to the RUNNING server (tpuserve/review/effects.py), on synthesized
documents: BASE is the session's one synthesis of the default config (tests/conftest.py); HEAD
is a copy with the node's boot script rendered from a changed Deployment (render_startup, then
the stacks' escape pass, exactly what synthesis writes: checked below) and its fields set as
the stacks set them. No new synthesis."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

from stacks.literals import escape_text
from tpuserve.paths import REPO_ROOT
from tpuserve.render.boot_script import render_startup, vllm_command
from tpuserve.render.vllm_args import compile_cache_key, served_config_sha256
from tpuserve.review.compare import build_review
from tpuserve.review.config_facts import config_facts
from tpuserve.review.effects import BootSettings, boot_settings, script_settings
from tpuserve.review.markdown import render_markdown
from tpuserve.review.model import Review, ServerEffect, render_json
from tpuserve.review.revision_facts import ConfigFacts, RevisionFacts, Synthesis
from tpuserve.settings import Deployment

Docs = dict[str, dict[str, Any]]


def _review(base: Docs, head: Docs, base_facts: ConfigFacts | None = None,
            head_facts: ConfigFacts | None = None) -> Review:
    """Facts left empty: the effects must come from the synthesized boot scripts alone."""
    return build_review(RevisionFacts("base", None, Synthesis(base), base_facts or ConfigFacts({})),
                        RevisionFacts("head", None, Synthesis(head), head_facts or ConfigFacts({})))


def _effect(r: Review, stack: str, address: str) -> ServerEffect:
    [change] = [c for c in r.stack(stack).resources if c.address == address]
    assert change.effect is not None
    return change.effect


def _node(docs: Docs, stack: str = "spot") -> dict[str, Any]:
    return docs[stack]["resource"]["google_tpu_v2_vm"]["tpu_node"]


def _with_node(synthesized: Docs, d: Deployment, **fields: Any) -> Docs:
    """HEAD: the spot stack with `d`'s boot script (and `fields`) on its node."""
    head = copy.deepcopy(synthesized)
    node = _node(head)
    node["metadata"]["startup-script"] = escape_text(render_startup(d))
    node.update(fields)
    return head


def _vllm(d: Deployment, **update: Any) -> Deployment:
    return d.model_copy(update={"vllm": d.vllm.model_copy(update=update)})


def test_the_script_is_what_synthesis_writes(synthesized: Docs, deployments: Any) -> None:
    d = deployments["spot"]
    assert _node(synthesized)["metadata"]["startup-script"] == escape_text(render_startup(d))
    found = script_settings(synthesized["spot"])
    argv = vllm_command(d)
    assert found["CACHE_KEY"] == compile_cache_key(d, argv)
    assert found["CONFIG_SHA256"] == served_config_sha256(d, argv)
    assert found["CACHE_BUCKET"] == d.cache_bucket
    # The flex stack's script sits in the queued resource's body: found all the same.
    assert script_settings(synthesized["flex"])["CACHE_KEY"] == compile_cache_key(
        deployments["flex"], vllm_command(deployments["flex"]))


def test_a_key_changing_flag_restarts_in_place_cold(synthesized: Docs, deployments: Any) -> None:
    d = deployments["spot"]
    head = _with_node(synthesized, _vllm(d, max_num_batched_tokens=1024))
    r = _review(synthesized, head)
    e = _effect(r, "spot", "google_tpu_v2_vm.tpu_node")
    assert (e.kind, e.compile) == ("restart_in_place", "cold")
    assert "compile-cache key changed: cold compile, ~857 s" in e.why
    assert r.stack("spot").server_effect == e


def test_shm_size_changes_the_script_not_the_key_warm_restart(synthesized: Docs,
                                                               deployments: Any) -> None:
    d = deployments["spot"]
    bigger = _vllm(d, shm_size="16gb")
    # Checked, not assumed: the script and the served config change, the cache key does not.
    assert render_startup(bigger) != render_startup(d)
    assert compile_cache_key(bigger, vllm_command(bigger)) == compile_cache_key(d, vllm_command(d))
    assert served_config_sha256(bigger, vllm_command(bigger)) != served_config_sha256(
        d, vllm_command(d))
    r = _review(synthesized, _with_node(synthesized, bigger))
    [node] = [c for c in r.stack("spot").resources if c.address == "google_tpu_v2_vm.tpu_node"]
    assert [a.path for a in node.attributes] == ["metadata.startup-script"]
    e = node.effect
    assert e is not None and (e.kind, e.compile) == ("restart_in_place", "warm")
    assert e.why == ("Terraform updates the node's metadata in place: the node re-runs its boot "
                     "script in place and restarts vLLM with the new settings (compile-cache key "
                     "unchanged: warm compile, ~497 s)")
    md = render_markdown(r)
    assert "  - running server: **restarts in place, warm compile**: Terraform updates" in md
    assert "| `spot` | changed | +0 ~1 -0 | - | - | - | restarts in place, warm compile |" in md


def test_a_proxy_image_change_keeps_vllm_running(synthesized: Docs, deployments: Any) -> None:
    d = deployments["spot"]
    proxy = d.model_copy(update={"access": d.access.model_copy(
        update={"proxy_image": "nginx:1.27.4-alpine"})})
    r = _review(synthesized, _with_node(synthesized, proxy))
    e = _effect(r, "spot", "google_tpu_v2_vm.tpu_node")
    assert (e.kind, e.compile) == ("reconverge_in_place", None)
    assert "keeps vLLM running (its image, argv and env are unchanged)" in e.why


def test_runtime_version_replaces_the_node(synthesized: Docs, deployments: Any) -> None:
    d = deployments["spot"]
    newer = d.model_copy(update={"tpu": d.tpu.model_copy(
        update={"runtime_version": "v2-alpha-tpuv5-lite-next"})})
    head = _with_node(synthesized, newer, runtime_version="v2-alpha-tpuv5-lite-next")
    r = _review(synthesized, head)
    e = _effect(r, "spot", "google_tpu_v2_vm.tpu_node")
    # runtime_version is in the compile-cache key: the new node compiles cold.
    assert (e.kind, e.compile) == ("node_replaced", "cold")
    assert e.why.startswith("runtime_version cannot change in place: the node is deleted")
    assert "`google_tpu_v2_vm.tpu_node` (changed, replaced)" in render_markdown(r)
    # A ForceNew field alone (the key unchanged, the bucket cache on) boots warm from the bucket.
    moved = copy.deepcopy(synthesized)
    _node(moved)["zone"] = "us-west4-b"
    e = _effect(_review(synthesized, moved), "spot", "google_tpu_v2_vm.tpu_node")
    assert (e.kind, e.compile) == ("node_replaced", "warm")


def test_labels_and_tags_change_nothing_on_the_server(synthesized: Docs) -> None:
    head = copy.deepcopy(synthesized)
    _node(head)["labels"]["team"] = "ml"
    _node(head)["tags"] = ["tpuserve-spot", "extra"]
    _node(head)["depends_on"] = []
    e = _effect(_review(synthesized, head), "spot", "google_tpu_v2_vm.tpu_node")
    assert (e.kind, e.compile) == ("none", None)
    assert e.why.startswith("labels, tags change in place; the boot script does not re-run")


def _flex_qr(docs: Docs) -> dict[str, Any]:
    return docs["flex"]["resource"]["terraform_data"]["queued_resource"]


def test_a_flex_body_change_gives_up_the_capacity(synthesized: Docs) -> None:
    """A change the TPU API cannot apply to a running node (here the run duration): the
    queued resource is replaced. Its boot script is the same, so the new node boots warm."""
    head = copy.deepcopy(synthesized)
    qr = _flex_qr(head)
    qr["input"]["body"]["runDuration"] = {"maxRunDuration": "7200s"}
    qr["triggers_replace"]["spec_sha256"] = "0" * 64
    r = _review(synthesized, head)
    change = next(c for c in r.stack("flex").resources
                  if c.address == "terraform_data.queued_resource")
    assert change.replaces
    e = change.effect
    assert e is not None and (e.kind, e.compile) == ("queued_resource_replaced", "warm")
    assert e.why.startswith("queued resource replaced: the flex capacity is given up, a new "
                            "request queues")
    doc = json.loads(render_json(r))
    [flex] = [s for s in doc["stacks"] if s["name"] == "flex"]
    assert flex["server_effect"]["kind"] == "queued_resource_replaced"
    [qr_json] = [c for c in flex["resources"] if c["address"] == "terraform_data.queued_resource"]
    assert qr_json["server_effect"] == {"kind": "queued_resource_replaced", "compile": "warm",
                                        "why": e.why}
    assert qr_json["replace"] is True and qr_json["action"] == "changed"  # old keys kept


def _flex_script(docs: Docs, script: str, sha: str) -> Docs:
    """The flex stack with another boot script, as synthesis writes it: in the queued
    resource's stored body (an in-place input change) and in node_metadata (replaced)."""
    out = copy.deepcopy(docs)
    data = out["flex"]["resource"]["terraform_data"]
    for name in ("queued_resource", "node_metadata"):
        data[name]["input"]["body"]["tpu"]["nodeSpec"][0]["node"]["metadata"][
            "startup-script"] = script
    data["node_metadata"]["triggers_replace"]["metadata_sha256"] = sha
    return out


def test_a_flex_metadata_change_restarts_in_place(synthesized: Docs, deployments: Any) -> None:
    d = deployments["flex"]
    warm = _flex_script(synthesized, escape_text(render_startup(_vllm(d, shm_size="16gb"))),
                        "b" * 64)
    cold = _flex_script(
        synthesized, escape_text(render_startup(_vllm(d, max_num_batched_tokens=1024))), "c" * 64)
    e = _effect(_review(synthesized, warm), "flex", "terraform_data.node_metadata")
    assert (e.kind, e.compile) == ("restart_in_place", "warm")
    assert e.why.startswith("the running node's metadata is patched in place (a request still "
                            "waiting re-queues, losing only its place)")
    r = _review(synthesized, cold)
    e = _effect(r, "flex", "terraform_data.node_metadata")
    assert (e.kind, e.compile) == ("restart_in_place", "cold")
    # The queued resource's stored input changes in place: nothing runs, the capacity stays.
    qr = _effect(r, "flex", "terraform_data.queued_resource")
    assert qr.kind == "none"
    assert r.stack("flex").server_effect.kind == "restart_in_place"  # type: ignore[union-attr]


def test_destroying_what_the_server_uses(synthesized: Docs) -> None:
    head = copy.deepcopy(synthesized)
    del head["base"]["resource"]["google_secret_manager_secret"]["hf_token_secret"]
    del head["base"]["resource"]["google_storage_bucket"]["cache_bucket"]
    del head["spot"]["resource"]["terraform_data"]["billing_guard"]
    head["spot"]["resource"]["google_compute_firewall"]["firewall_ssh"]["description"] = "x"
    r = _review(synthesized, head)
    e = _effect(r, "base", "google_secret_manager_secret.hf_token_secret")
    assert e.kind == "loses_dependency"
    assert e.why == "a secret the node reads is destroyed: the running server loses it"
    assert _effect(r, "base", "google_storage_bucket.cache_bucket").kind == "loses_dependency"
    guard = _effect(r, "spot", "terraform_data.billing_guard")
    assert guard.kind == "none" and "disarmed" in guard.why
    assert _effect(r, "spot", "google_compute_firewall.firewall_ssh").kind == "none"
    # A removed stack: the server goes, what is its own goes with it.
    gone = _review(synthesized, {k: v for k, v in synthesized.items() if k != "ondemand"})
    assert _effect(gone, "ondemand", "google_tpu_v2_vm.tpu_node").kind == "server_removed"
    assert _effect(gone, "ondemand", "google_compute_firewall.firewall_ssh").kind == "none"
    assert gone.stack("ondemand").server_effect.kind == "server_removed"  # type: ignore[union-attr]


def test_config_facts_stand_in_for_an_older_script() -> None:
    facts = config_facts(REPO_ROOT).stacks["spot"]
    changed = dataclasses.replace(facts, cache_key="f" * 16, config_sha256="e" * 16)
    # No boot script in either document: the keys come from the config facts.
    assert boot_settings({"resource": {}}, facts) == BootSettings(
        facts.cache_key, facts.config_sha256, facts.cache_enabled)
    node = {"google_tpu_v2_vm": {"tpu_node": {"metadata": {"startup-script": "#!/bin/bash\n"}}}}
    head_node = {"google_tpu_v2_vm": {"tpu_node": {"metadata": {"startup-script": "#!/bin/sh\n"}}}}
    r = _review({"spot": {"resource": node}}, {"spot": {"resource": head_node}},
                ConfigFacts({"spot": facts}), ConfigFacts({"spot": changed}))
    e = _effect(r, "spot", "google_tpu_v2_vm.tpu_node")
    assert (e.kind, e.compile) == ("restart_in_place", "cold")
    r = _review({"spot": {"resource": node}}, {"spot": {"resource": head_node}})
    e = _effect(r, "spot", "google_tpu_v2_vm.tpu_node")
    assert (e.kind, e.compile) == ("restart_in_place", None)  # neither side says: not known
