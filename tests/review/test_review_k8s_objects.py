"""The fleet's Kubernetes objects in a review (tpuserve/review/k8s_objects.py): hand-made
synthesized documents holding small bundles, escaped as the stacks' literal pass writes them."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from tpuserve.review import k8s_objects
from tpuserve.review.compare import build_review
from tpuserve.review.k8s_objects import bundle_text, changed_paths, diff_bundles, parse_bundle
from tpuserve.review.markdown import render_markdown
from tpuserve.review.model import Review, render_json
from tpuserve.review.revision_facts import ConfigFacts, RevisionFacts, Synthesis


def _deployment(args: list[str], key: str | None = "k1") -> dict[str, Any]:
    annotations = {} if key is None else {"tpuserve/cache-object": key}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "vllm", "namespace": "tpuserve"},
        "spec": {
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": {"app": "vllm"}, "annotations": annotations},
                "spec": {"containers": [
                    {"name": "vllm", "image": "vllm/vllm-tpu@sha256:" + "ab" * 32,
                     "args": args, "env": [{"name": "X", "value": "${NOT_TF}"}]},
                    {"name": "proxy", "image": "nginx:1.27"},
                ]},
            },
        },
    }


def _hpa(max_replicas: int = 4) -> dict[str, Any]:
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "vllm", "namespace": "tpuserve"},
            "spec": {"minReplicas": 1, "maxReplicas": max_replicas}}


NS = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tpuserve"}}
ARGS = ["--max-model-len", "32768"]


def _escape(text: str) -> str:
    return text.replace("${", "$${").replace("%{", "%%{")


def _doc(objects: list[Any] | None = None, *, text: str | None = None) -> dict[str, Any]:
    bundle = text if text is not None else yaml.safe_dump_all(objects, sort_keys=False)
    return {"resource": {"terraform_data": {"k8s_bundle": {
        "input": {"bundle": _escape(bundle)},
        "triggers_replace": {"bundle_sha256": str(hash(bundle))},
    }}}}


def _review(base: dict[str, Any], head: dict[str, Any]) -> Review:
    return build_review(
        RevisionFacts("base", None, Synthesis({"fleet": base}), ConfigFacts({})),
        RevisionFacts("head", None, Synthesis({"fleet": head}), ConfigFacts({})))


def test_the_bundle_is_unescaped() -> None:
    doc = _doc([_deployment(ARGS)])
    assert "$${NOT_TF}" in doc["resource"]["terraform_data"]["k8s_bundle"]["input"]["bundle"]
    text = bundle_text(doc)
    assert text is not None and "${NOT_TF}" in text and "$${" not in text
    assert bundle_text({"resource": {}}) is None and bundle_text(None) is None


def test_pod_template_change_is_a_rolling_restart_warm_by_the_key() -> None:
    base = _doc([NS, _deployment(ARGS), _hpa()])
    head = _doc([NS, _deployment([*ARGS, "--enable-prefix-caching"]), _hpa()])
    r = _review(base, head)
    s = r.stack("fleet")
    [obj] = s.kubernetes_objects
    assert (obj.kind, obj.namespace, obj.name, obj.action) == (
        "Deployment", "tpuserve", "vllm", "changed")
    assert obj.paths == ("spec.template.spec.containers[vllm].args",)
    assert obj.effect is not None
    assert (obj.effect.kind, obj.effect.compile) == ("rolling_restart", "warm")
    assert "maxUnavailable 1, no spare chip" in obj.effect.why
    assert s.server_effect == obj.effect
    j = json.loads(render_json(r))["stacks"][0]
    assert j["kubernetes_objects"] == [{
        "kind": "Deployment", "namespace": "tpuserve", "name": "vllm", "action": "changed",
        "paths": ["spec.template.spec.containers[vllm].args"],
        "server_effect": obj.effect.to_json()}]
    assert j["kubernetes_notes"] == []
    md = render_markdown(r)
    assert "**Kubernetes objects** (the bundle): 0 to add, 1 to change, 0 to delete" in md
    assert "`Deployment tpuserve/vllm` (changed)" in md
    assert "  - `spec.template.spec.containers[vllm].args`" in md
    assert "rolling restart of the replicas, warm compile" in md
    # The Terraform side: the bundle attribute is named, not called a boot script.
    assert "the Kubernetes bundle changed; its objects are listed below" in md


def test_a_new_cache_key_is_cold_and_a_missing_one_is_unknown() -> None:
    base = _doc([_deployment(ARGS, key="k1")])
    cold = _review(base, _doc([_deployment(["--x"], key="k2")])).stack("fleet")
    assert cold.kubernetes_objects[0].effect.compile == "cold"  # type: ignore[union-attr]
    unknown = _review(base, _doc([_deployment(["--x"], key=None)])).stack("fleet")
    e = unknown.kubernetes_objects[0].effect
    assert e is not None and (e.kind, e.compile) == ("rolling_restart", None)
    assert "tpuserve/cache-object" in e.why


def test_hpa_change_scales_without_restart_and_others_are_none() -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "t"},
          "data": {"a": "1"}}
    cm2 = copy.deepcopy(cm)
    cm2["data"]["a"] = "2"
    r = _review(_doc([NS, _hpa(4), cm]), _doc([NS, _hpa(8), cm2, {**NS, "metadata": {
        "name": "other"}}]))
    s = r.stack("fleet")
    by = {(o.kind, o.name): o for o in s.kubernetes_objects}
    hpa = by[("HorizontalPodAutoscaler", "vllm")]
    assert hpa.paths == ("spec.maxReplicas",)
    assert hpa.effect is not None and hpa.effect.kind == "scaling_changed"
    assert hpa.effect.why == "scaling bounds change, no restart"
    assert by[("ConfigMap", "c")].effect.kind == "none"  # type: ignore[union-attr]
    assert by[("Namespace", "other")].action == "added"
    assert s.server_effect is not None and s.server_effect.kind == "scaling_changed"
    assert "scaling bounds change, no restart" in render_markdown(r)


def test_removed_deployment_and_named_list_items() -> None:
    old, new = _deployment(ARGS), _deployment(ARGS)
    new["spec"]["template"]["spec"]["containers"].pop()  # proxy gone
    new["metadata"]["labels"] = {"app.kubernetes.io/name": "vllm"}
    assert list(changed_paths(old, new)) == [
        'metadata.labels', "spec.template.spec.containers[proxy]"]
    old["metadata"]["labels"] = {"a": 1}
    assert list(changed_paths(old, new)) == [
        'metadata.labels["app.kubernetes.io/name"]', "metadata.labels.a",
        "spec.template.spec.containers[proxy]"]
    r = _review(_doc([NS, _deployment(ARGS)]), _doc([NS]))
    [obj] = r.stack("fleet").kubernetes_objects
    assert obj.action == "removed" and obj.effect is not None
    assert obj.effect.kind == "server_removed"


@pytest.mark.parametrize(("text", "note"), [
    ("a: [unclosed", "not valid YAML"),
    ("kind: A\nmetadata: {name: x}\n---\nkey: !!python/object:os.system x\n", "not valid YAML"),
    ("t: 2001-02-30\n", "not valid YAML"),
    ("? [a, b]\n: 1\n", "not valid YAML"),
    ("x: " + "[" * 5000 + "]" * 5000 + "\n", "nest"),
    ("a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefg", "bcdefgh", strict=True)), "expands past"),
    ("x" * (k8s_objects.MAX_BUNDLE_BYTES + 1), "bytes, over the"),
])
def test_hostile_bundles_are_one_line_notes(text: str, note: str) -> None:
    r = _review(_doc([NS, _deployment(ARGS)]), _doc(text=text))
    s = r.stack("fleet")
    assert s.kubernetes_objects == ()
    assert len(s.kubernetes_notes) == 1 and note in s.kubernetes_notes[0]
    assert s.kubernetes_notes[0].startswith("head: ") and "\n" not in s.kubernetes_notes[0]
    assert "- note: head: the Kubernetes bundle" in render_markdown(r)
    assert json.loads(render_json(r))["stacks"][0]["kubernetes_notes"] == list(
        s.kubernetes_notes)


def test_non_mapping_and_nameless_documents_are_skipped_with_a_note() -> None:
    text = "---\n- a list\n---\njust text\n---\nkind: X\n---\n" + yaml.safe_dump(NS) + "---\n"
    objects, notes = parse_bundle(text, "head")
    assert list(objects) == [("Namespace", None, "tpuserve")]
    assert len(notes) == 3 and all("skipped" in n for n in notes)
    dup, dup_notes = parse_bundle(yaml.safe_dump_all([NS, NS]), "base")
    assert len(dup) == 1 and "repeats Namespace tpuserve" in dup_notes[0]


def test_no_bundle_on_either_side_is_nothing() -> None:
    assert diff_bundles({"resource": {}}, None) == ((), ())
    r = _review({"resource": {}}, {"resource": {}})
    assert r.stack("fleet").kubernetes_objects == ()


def test_a_new_fleet_lists_its_objects_as_added() -> None:
    objects, notes = diff_bundles(None, _doc([NS, _deployment(ARGS), _hpa()]))
    assert notes == () and [o.action for o in objects] == ["added"] * 3
    vllm = next(o for o in objects if o.kind == "Deployment")
    assert vllm.effect is not None and vllm.effect.kind == "node_created"
