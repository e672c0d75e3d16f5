"""What each Terraform change does to the RUNNING server. Pure.

A VM stack's node (`google_tpu_v2_vm.tpu_node`) takes a `metadata` change in place, and the
node notices its changed boot script and re-runs it (idempotent): vLLM restarts on the same
node, warm when the compile-cache key is unchanged (its local cache is kept), cold when it
changed (SPEC 4: ~497 s and ~857 s). When the served config (image, argv, env: CONFIG_SHA256)
is unchanged too, the re-run keeps vLLM running and only re-applies the rest (proxy, TLS).
Any other field of the node but labels, tags, description and data disks is ForceNew in the
google-beta provider (6.50.0, services/tpuv2/resource_tpu_v2_vm.go: the update mask holds
description, dataDisks, metadata, tags and labels only): the node is replaced, and the new
node boots warm only when the key is unchanged and the bucket cache is on.

The flex stack: replacing `terraform_data.queued_resource` gives up the flex capacity (a new
request queues); replacing or creating `terraform_data.node_metadata` patches the running
node's metadata in place (restart as above; a request still waiting re-queues, losing only its
place in the queue). `terraform_data.billing_guard` re-arms a deadline: the server is not
touched. Destroying a secret, bucket, service account, IAM grant, network or firewall takes
something the server uses (by type, so a future `base` stack's resources are judged alike).

The keys come from the boot script each revision synthesized (its settings block:
`CACHE_KEY='...'`, `CONFIG_SHA256='...'`, `CACHE_BUCKET='...'`), else from the config facts
(today's code reading that revision's config). `compile` is the config's verdict: an image
tag that moved since the last boot makes any start cold.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tpuserve import contracts
from tpuserve.facts import COLD_START_S, WARM_START_S

from .config_facts import BOOT_TIMES_KEY
from .model import Compile, ResourceChange, ServerEffect, Status
from .revision_facts import StackFacts

NODE_TYPE = contracts.TPU_NODE_TYPE
QUEUED_RESOURCE = contracts.data_address(contracts.QUEUED_RESOURCE_ID)
NODE_METADATA = contracts.data_address(contracts.NODE_METADATA_ID)
BILLING_GUARD = contracts.data_address(contracts.BILLING_GUARD_ID)
# the fleet's Kubernetes objects (k8s_objects)
K8S_BUNDLE = contracts.data_address(contracts.K8S_BUNDLE_ID)
# google_tpu_v2_vm fields Terraform updates in place (the provider's update mask); every other
# configurable field is ForceNew. Terraform meta-arguments change nothing on the node.
IN_PLACE_FIELDS = frozenset({"description", "data_disks", "metadata", "tags", "labels"})
META_ARGUMENTS = frozenset({"depends_on", "lifecycle", "provider", "count", "for_each",
                            "provisioner", "connection", "timeouts"})
BOOT_SCRIPT = "metadata.startup-script"
# Resource types whose destruction takes something a running server uses.
DEPENDENCIES: Mapping[str, str] = {
    "google_secret_manager_secret": "a secret the node reads",
    "google_secret_manager_secret_version": "a secret's value the node reads",
    "google_secret_manager_secret_iam_member": "the node's right to read a secret",
    "google_storage_bucket": "a bucket the node uses (compile cache)",
    "google_storage_bucket_iam_member": "the node's right to a bucket",
    "google_service_account": "a service account (the node's identity)",
    "google_service_account_iam_member": "a grant on a service account",
    "google_project_iam_member": "a project role grant",
    "google_project_iam_custom_role": "a custom role",
    "google_compute_network": "the node's network",
    "google_compute_subnetwork": "the node's subnetwork",
    "google_compute_firewall": "a firewall rule that lets traffic reach the node",
}
_SETTINGS = re.compile(r"^(CACHE_KEY|CONFIG_SHA256|CACHE_BUCKET)=(.*)$", re.MULTILINE)


@dataclass(frozen=True)
class BootSettings:
    """One revision's boot-script settings that decide a restart; None: not known."""

    cache_key: str | None = None
    config_sha256: str | None = None
    cache_on: bool | None = None  # the bucket cache (a new node restores from it)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def script_settings(value: Any) -> dict[str, str]:
    """CACHE_KEY, CONFIG_SHA256 and CACHE_BUCKET of the first boot script found in `value` (a
    stack document or a resource body; the script is one string holding a settings block)."""
    for text in _strings(value):
        if "\nCACHE_KEY=" not in text:
            continue
        out: dict[str, str] = {}
        for name, rest in _SETTINGS.findall(text):
            try:
                words = shlex.split(rest, comments=True)
            except ValueError:
                continue
            out.setdefault(name, words[0] if words else "")
        return out
    return {}


def boot_settings(doc: Mapping[str, Any] | None, facts: StackFacts | None) -> BootSettings | None:
    """The synthesized script's settings, each missing one from the config facts; None when
    the stack is absent on that side."""
    if doc is None and facts is None:
        return None
    found = script_settings(doc) if doc is not None else {}
    key = found.get("CACHE_KEY") or (facts.cache_key if facts else None)
    sha = found.get("CONFIG_SHA256") or (facts.config_sha256 if facts else None) or None
    if "CACHE_BUCKET" in found:
        cache_on: bool | None = bool(found["CACHE_BUCKET"])
    else:
        cache_on = facts.cache_enabled if facts else None
    return BootSettings(key, sha, cache_on)


def _same(a: str | None, b: str | None) -> bool | None:
    return None if a is None or b is None else a == b


# SPEC 4's boot times are Gemma 4 E2B's on v5litepod-1: on any other model or chip (its
# derived figures hold BOOT_TIMES_KEY, settings/pair_sources.py) the review says so.
DERIVED_TIMES = ("the boot times are Gemma 4 E2B's on v5litepod-1 (SPEC 4), derived: not "
                 "this model's or chip's")
_TIMES = tuple(f"~{t:.0f} s" for t in (COLD_START_S, WARM_START_S))


def times_source(derived: Mapping[str, str]) -> str:
    """Where a review's boot times come from, for a side whose derived figures are these."""
    return DERIVED_TIMES if BOOT_TIMES_KEY in derived else "SPEC 4"


def label_times(effect: ServerEffect, derived: Mapping[str, str]) -> ServerEffect:
    """The effect, its boot times labelled derived where they are not this deployment's."""
    if BOOT_TIMES_KEY not in derived or not any(t in effect.why for t in _TIMES):
        return effect
    return dataclasses.replace(effect, why=f"{effect.why}; {DERIVED_TIMES}")


def _compile_text(compile_: Compile | None, *, new_node: bool = False) -> str:
    if compile_ == "warm":
        source = " from the bucket cache" if new_node else ""
        return f"warm compile{source}, ~{WARM_START_S:.0f} s"
    if compile_ == "cold":
        return f"cold compile, ~{COLD_START_S:.0f} s"
    return "compile cache not known"


def new_node_compile(base: BootSettings | None, head: BootSettings | None) -> Compile | None:
    """A new node has no local cache: warm only from the bucket, under an unchanged key."""
    if base is None:
        return "cold"  # a new stack: nothing was ever compiled for it
    if head is None:
        return None
    same = _same(base.cache_key, head.cache_key)
    if same is None:
        return None
    if not same or head.cache_on is False:
        return "cold"
    return "warm" if head.cache_on else None


def rerun_effect(base: BootSettings | None, head: BootSettings | None, how: str) -> ServerEffect:
    """The node re-runs its changed boot script in place (`how`: what brings the change)."""
    b, h = base or BootSettings(), head or BootSettings()
    same_key = _same(b.cache_key, h.cache_key)
    if _same(b.config_sha256, h.config_sha256) and same_key is not False:
        return ServerEffect("reconverge_in_place", None,
                            f"{how}: the node re-runs its boot script in place and keeps vLLM "
                            "running (its image, argv and env are unchanged)")
    compile_: Compile | None = None if same_key is None else ("warm" if same_key else "cold")
    key = {True: "unchanged", False: "changed", None: "not known"}[same_key]
    return ServerEffect("restart_in_place", compile_,
                        f"{how}: the node re-runs its boot script in place and restarts vLLM "
                        f"with the new settings (compile-cache key {key}: "
                        f"{_compile_text(compile_)})")


def _top(path: str) -> str:
    return path.split(".", 1)[0].split("[", 1)[0]


def _node_effect(c: ResourceChange, base: BootSettings | None,
                 head: BootSettings | None) -> ServerEffect:
    if c.action == "added":
        compile_ = new_node_compile(base, head)
        return ServerEffect("node_created", compile_,
                            "a new TPU node boots the server "
                            f"({_compile_text(compile_, new_node=True)})")
    if c.action == "removed":
        return ServerEffect("server_removed", None,
                            "the TPU node is deleted: the server stops and its endpoint is gone")
    fields = sorted({_top(a.path) for a in c.attributes} - META_ARGUMENTS)
    force_new = [f for f in fields if f not in IN_PLACE_FIELDS]
    if force_new:
        compile_ = new_node_compile(base, head)
        return ServerEffect("node_replaced", compile_,
                            f"{', '.join(force_new)} cannot change in place: the node is deleted "
                            f"and created again, and the new one boots "
                            f"({_compile_text(compile_, new_node=True)})")
    if any(a.path == BOOT_SCRIPT for a in c.attributes):
        return rerun_effect(base, head, "Terraform updates the node's metadata in place")
    if not fields:
        return ServerEffect("none", None, "only Terraform meta-arguments change")
    return ServerEffect("none", None, f"{', '.join(fields)} change in place; the boot script "
                        "does not re-run and the server keeps running")


def _effect(c: ResourceChange, base: BootSettings | None, head: BootSettings | None,
            replaced_node: str | None, server_removed: bool) -> ServerEffect:
    if c.kind != "resource":
        return ServerEffect("none", None, f"a {c.kind} block, not a deployed resource")
    rtype = c.address.split(".", 1)[0]
    if rtype == NODE_TYPE:
        return _node_effect(c, base, head)
    created = c.action == "added" or c.replaces
    if c.address == QUEUED_RESOURCE:
        if c.action == "removed":
            return ServerEffect("server_removed", None,
                                "the queued resource is deleted with its node: the server stops "
                                "and the flex capacity is released")
        if c.action == "added":
            compile_ = new_node_compile(base, head)
            return ServerEffect("queued_resource_created", compile_,
                                "a new flex-start request queues; the server boots when capacity "
                                f"is granted ({_compile_text(compile_, new_node=True)})")
        if c.replaces:
            compile_ = new_node_compile(base, head)
            return ServerEffect("queued_resource_replaced", compile_,
                                "queued resource replaced: the flex capacity is given up, a new "
                                "request queues "
                                f"({_compile_text(compile_, new_node=True)} once granted)")
        return ServerEffect("none", None, "only the stored input changes; nothing runs")
    if c.address == NODE_METADATA:
        if not created:
            return ServerEffect("none", None, "the node keeps the metadata it has")
        if replaced_node is not None:
            return ServerEffect("none", None, f"superseded: {replaced_node} in this change "
                                "brings the node up with this metadata")
        return rerun_effect(base, head, "the running node's metadata is patched in place (a "
                            "request still waiting re-queues, losing only its place)")
    if c.address == BILLING_GUARD:
        if c.action == "removed":
            return ServerEffect("none", None, "the billing guard is disarmed: the node no longer "
                                "deletes itself at its deadline")
        why = "the billing guard's deadline is re-armed" if created else "nothing runs"
        return ServerEffect("none", None, why)
    if c.address == K8S_BUNDLE:
        if c.action == "removed":
            return ServerEffect("none", None, "the stored bundle goes; what happens to each "
                                "object is listed under the Kubernetes objects")
        return ServerEffect("none", None, "the bundle is applied again; what each object's "
                            "change does is listed under the Kubernetes objects")
    if c.action == "removed" and rtype in DEPENDENCIES:
        if server_removed:
            return ServerEffect("none", None, "destroyed with the stack's server")
        return ServerEffect("loses_dependency", None, f"{DEPENDENCIES[rtype]} is destroyed: the "
                            "running server loses it")
    return ServerEffect("none", None, "nothing the running server uses changes")


def with_effects(
    changes: Sequence[ResourceChange],
    old_doc: Mapping[str, Any] | None,
    new_doc: Mapping[str, Any] | None,
    old_facts: StackFacts | None,
    new_facts: StackFacts | None,
    status: Status,
) -> tuple[ResourceChange, ...]:
    """`changes` (one stack's), each with its server effect."""
    base = boot_settings(old_doc, old_facts) if status != "added" else None
    head = boot_settings(new_doc, new_facts) if status != "removed" else None
    # A node that comes up anew in this change takes node_metadata along.
    replaced = next((c.address for c in changes if c.address == QUEUED_RESOURCE
                     and (c.action != "changed" or c.replaces)), None)
    removed = status == "removed" or any(
        c.action == "removed" and (c.address == QUEUED_RESOURCE or c.address.startswith(
            NODE_TYPE + ".")) for c in changes)
    derived = (new_facts or old_facts).derived if (new_facts or old_facts) else {}
    return tuple(dataclasses.replace(
        c, effect=label_times(_effect(c, base, head, replaced, removed), derived))
        for c in changes)
