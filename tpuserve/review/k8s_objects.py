"""The fleet's Kubernetes objects in a review: the bundle each revision synthesized, object by
object, and what each change does to the running replicas. Pure (PyYAML's safe loader).

The fleet stack stores its rendered bundle (multi-document YAML) in
`resource.terraform_data.k8s_bundle.input.bundle`, escaped by the stacks' Terraform literal pass
(`${` written `$${`, `%{` written `%%{`), with `triggers_replace.bundle_sha256`. Objects are
matched by (kind, namespace, name); a changed object lists its changed paths: dict keys joined
by `.`, lists of named items (containers, env, volumes, ports) by `[name]`, any other list whole.

The bundle is hostile input (a pull request writes it): a size cap, a cap on the nodes walked
(alias bombs), and anything that is not YAML of mappings with a kind and a name becomes a
one-line note in the review, never a traceback.

Effects (model.EFFECT_KINDS): a change of the vLLM Deployment's pod template is a rolling
restart of the replicas, warm or cold by the compile cache the pod template names in its
annotation `tpuserve/cache-object` (the object: cache key and image digest; null when absent
on either side); an HPA change moves the scaling bounds and restarts nothing; any other
object: none.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from tpuserve import contracts
from tpuserve.facts import COLD_START_S, WARM_START_S

from .model import Action, Compile, ObjectChange, ServerEffect

BUNDLE_RESOURCE = contracts.data_address(contracts.K8S_BUNDLE_ID)
CACHE_KEY_ANNOTATION = "tpuserve/cache-object"
# The vLLM Deployment (the renderer's names, from the contracts: the renderer itself pulls the
# settings in).
VLLM_NAMESPACE = contracts.FLEET_NAMESPACE
VLLM_DEPLOYMENT = contracts.VLLM_DEPLOYMENT
MAX_BUNDLE_BYTES = 2 << 20  # the rendered bundle is tens of KB
MAX_NODES = 200_000  # values walked per revision: an alias bomb stops here
MAX_PATHS = 40  # changed paths listed per object
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_/-]+")

ObjectId = tuple[str, str | None, str]  # kind, namespace, name


class _TooBig(Exception):
    pass


def unescape(text: str) -> str:
    """Undo the Terraform literal pass (stacks/literals.escape_text)."""
    return text.replace("$${", "${").replace("%%{", "%{")


def bundle_text(doc: Mapping[str, Any] | None) -> str | None:
    """The stack's bundle as rendered, or None when the stack has none."""
    try:
        resources = doc["resource"][contracts.DATA_RESOURCE]  # type: ignore[index]
        body = resources[contracts.K8S_BUNDLE_ID]
        value = body["input"]["bundle"]
    except (KeyError, TypeError, IndexError):
        return None
    return unescape(value) if isinstance(value, str) else None


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return (text[:160] + "...") if len(text) > 160 else text or type(exc).__name__


def parse_bundle(text: str, which: str) -> tuple[dict[ObjectId, Any], list[str]]:
    """{(kind, namespace, name): object} of a bundle, and one note per problem."""
    notes: list[str] = []
    size = len(text.encode("utf-8", "replace"))
    if size > MAX_BUNDLE_BYTES:
        return {}, [(f"{which}: the Kubernetes bundle is {size:,} bytes, over the "
                    f"{MAX_BUNDLE_BYTES:,} this review reads: its objects are not compared")]
    import yaml  # the review's only YAML: kept off the `plan` path

    try:
        docs = list(yaml.safe_load_all(text))
        _count(docs)
    except _TooBig:
        return {}, [(f"{which}: the Kubernetes bundle expands past {MAX_NODES:,} values (YAML "
                    "aliases?): its objects are not compared")]
    except RecursionError:
        return {}, [(f"{which}: the Kubernetes bundle nests too deep: its objects are not "
                    "compared")]
    except Exception as exc:  # hostile input: any loader error is a note
        return {}, [(f"{which}: the Kubernetes bundle is not valid YAML ({_first_line(exc)}): "
                    "its objects are not compared")]
    objects: dict[ObjectId, Any] = {}
    for i, obj in enumerate(docs, 1):
        if obj is None:
            continue  # an empty document (a leading or trailing `---`)
        oid = _identity(obj)
        if oid is None:
            what = type(obj).__name__ if not isinstance(obj, Mapping) else "a mapping"
            notes.append(f"{which}: bundle document {i} ({what}) has no kind and "
                         "metadata.name as strings: skipped")
            continue
        if oid in objects:
            notes.append(f"{which}: bundle document {i} repeats {_label(oid)}: the last wins")
        objects[oid] = obj
    return objects, notes


def _count(value: Any) -> None:
    """Raise _TooBig past MAX_NODES values (shared subtrees counted each time they appear)."""
    budget = MAX_NODES
    stack = [value]
    while stack:
        item = stack.pop()
        budget -= 1
        if budget < 0:
            raise _TooBig
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _identity(obj: Any) -> ObjectId | None:
    if not isinstance(obj, Mapping):
        return None
    meta = obj.get("metadata")
    kind = obj.get("kind")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    ns = meta.get("namespace") if isinstance(meta, Mapping) else None
    if not (isinstance(kind, str) and kind and isinstance(name, str) and name):
        return None
    return kind, ns if isinstance(ns, str) and ns else None, name


def _label(oid: ObjectId) -> str:
    kind, ns, name = oid
    return f"{kind} {ns + '/' if ns else ''}{name}"


def _key(prefix: str, key: Any) -> str:
    if isinstance(key, str) and _PLAIN_KEY.fullmatch(key):
        return f"{prefix}.{key}" if prefix else key
    return f"{prefix}[{json.dumps(key if isinstance(key, str) else str(key))}]"


def _named(items: list[Any]) -> dict[str, Any] | None:
    """A list of mappings each with a distinct string `name`, by name; else None."""
    out: dict[str, Any] = {}
    for item in items:
        name = item.get("name") if isinstance(item, Mapping) else None
        if not isinstance(name, str) or name in out:
            return None
        out[name] = item
    return out or None


def changed_paths(old: Any, new: Any, prefix: str = "") -> Iterator[str]:
    """The paths where two objects differ: the deepest mapping key or named list item that
    differs as a whole (added, removed, or a scalar or plain list changed)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for key in [*new, *(k for k in old if k not in new)]:
            if key not in old or key not in new:
                yield _key(prefix, key)
            elif old[key] != new[key]:
                yield from changed_paths(old[key], new[key], _key(prefix, key))
        return
    if isinstance(old, list) and isinstance(new, list):
        a, b = _named(old), _named(new)
        if a is not None and b is not None:
            for name in [*b, *(n for n in a if n not in b)]:
                path = f"{prefix}[{name}]"
                if name not in a or name not in b:
                    yield path
                elif a[name] != b[name]:
                    yield from changed_paths(a[name], b[name], path)
            return
    if old != new:
        yield prefix or "(whole object)"


def _get(obj: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def cache_key(deployment: Any) -> str | None:
    value = _get(deployment, "spec", "template", "metadata", "annotations",
                 CACHE_KEY_ANNOTATION)
    return value if isinstance(value, str) and value else None


def _rollout(deployment: Any) -> str:
    ru = _get(deployment, "spec", "strategy", "rollingUpdate")
    unavailable, surge = _get(ru, "maxUnavailable"), _get(ru, "maxSurge")
    if unavailable in (1, "1") and surge in (0, "0", None):
        return "one at a time: maxUnavailable 1, no spare chip"
    return f"maxUnavailable {unavailable!r}, maxSurge {surge!r}"


def _compile_text(compile_: Compile | None) -> str:
    if compile_ == "warm":
        return f"compile-cache key unchanged: warm, ~{WARM_START_S:.0f} s per replica"
    if compile_ == "cold":
        return f"compile-cache key changed: cold, ~{COLD_START_S:.0f} s per replica"
    return (f"compile-cache key not in the bundle (annotation {CACHE_KEY_ANNOTATION}): warm "
            f"~{WARM_START_S:.0f} s or cold ~{COLD_START_S:.0f} s per replica")


def object_effect(oid: ObjectId, action: Action, paths: tuple[str, ...], old: Any,
                  new: Any) -> ServerEffect:
    kind, ns, name = oid
    vllm = kind == "Deployment" and name == VLLM_DEPLOYMENT and ns in (VLLM_NAMESPACE, None)
    if vllm and action == "removed":
        return ServerEffect("server_removed", None, "the vLLM Deployment is deleted: every "
                            "replica stops")
    if vllm and action == "added":
        return ServerEffect("node_created", None, "the vLLM Deployment is created: its replicas "
                            "boot on the TPU pools (warm from the bucket cache when its key is "
                            "there, else cold)")
    if vllm and any(p == "spec.template" or p.startswith(("spec.template.", "spec.template["))
                    for p in paths):
        a, b = cache_key(old), cache_key(new)
        compile_: Compile | None = None if a is None or b is None else (
            "warm" if a == b else "cold")
        return ServerEffect("rolling_restart", compile_,
                            f"the pod template changes: rolling restart of the replicas "
                            f"({_rollout(new)}; with one replica the fleet serves nothing until "
                            f"the new pod is ready); {_compile_text(compile_)}")
    if kind == "HorizontalPodAutoscaler" and action == "changed":
        return ServerEffect("scaling_changed", None, "scaling bounds change, no restart")
    return ServerEffect("none", None, "no replica restarts")


def diff_bundles(old_doc: Mapping[str, Any] | None, new_doc: Mapping[str, Any] | None,
                 ) -> tuple[tuple[ObjectChange, ...], tuple[str, ...]]:
    """The object changes between two revisions' bundles, and the notes (unreadable bundles);
    ((), ()) when neither revision has a bundle."""
    texts = bundle_text(old_doc), bundle_text(new_doc)
    if texts == (None, None):
        return (), ()
    notes: list[str] = []
    sides = []
    for which, text in zip(("base", "head"), texts, strict=True):
        if text is None:
            sides.append({})
            continue
        objects, found = parse_bundle(text, which)
        notes += found
        if found and not objects:
            return (), tuple(notes)  # one side unreadable: a diff would claim everything moved
        sides.append(objects)
    before, after = sides
    changes: list[ObjectChange] = []
    for oid in [*after, *(o for o in before if o not in after)]:
        if oid not in before or oid not in after:
            action: Action = "added" if oid not in before else "removed"
            paths: tuple[str, ...] = ()
        else:
            if before[oid] == after[oid]:
                continue
            action = "changed"
            listed = list(changed_paths(before[oid], after[oid]))
            paths = tuple(listed[:MAX_PATHS])
            if len(listed) > MAX_PATHS:
                paths += (f"... and {len(listed) - MAX_PATHS} more",)
        effect = object_effect(oid, action, paths, before.get(oid), after.get(oid))
        changes.append(ObjectChange(*oid, action=action, paths=paths, effect=effect))
    return tuple(changes), tuple(notes)
