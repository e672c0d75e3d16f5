"""Run the boot script of an older revision and of this tree against the same fakes; report
whether they behave the same.

    .venv/bin/python tools/compare_boot.py [--base 360652f]

The OLD script is rendered by the base revision's own code (`git archive` of its tpuserve/,
templates/ and config/ into a temp dir, run with PYTHONPATH there); the NEW one by this tree.
Both run through tests/render/boot's harness (Cloud, Node: the fake metadata server, Secret
Manager, Cloud Storage, TPU API and a fake docker), in ONE Cloud, so the ports, the secrets and
the registry are the same; between the two the bucket, the guest attributes and the request
logs are emptied. For each config variant: a cold boot (empty disk, empty bucket), a re-run on
the same node, and a warm boot (a new node, the bucket holding the first one's cache).

Compared, after normalising what differs on every run by nature (timestamps, the node's temp
dir, the certificate made at boot, object generations and upload session ids, archive sizes):
  requests      method, path, query and body shape to the metadata server, Secret Manager,
                Cloud Storage and the TPU API, in order
  attributes    the guest attributes written (key, value minus its timestamp), in order
  containers    every docker call's argv and environment (the readiness loop's polls, whose
                number is timing, apart: their forms over all boots), and each container's
                image, command, environment and mounts as the fake docker recorded them; a
                `docker run` spec label must be spec_hash of that run's own arguments
Exit status 0 when everything is equal; the figures and any difference are printed.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.render.boot.support import NAMESPACE, Cloud, Node, open_cloud  # noqa: E402
from tpuserve.settings import Deployment  # noqa: E402

# Config variants: section -> field updates on the default "spot" deployment.
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "default": {},
    "no-proxy": {"access": {"api_key_proxy": False}},
    "tls-off": {"access": {"tls": "off"}},
    "cache-off": {"cache": {"enabled": False}},
}
# Renders with whichever tpuserve is first on PYTHONPATH: the same code for both revisions.
_RENDER = """
import json, sys
try:  # the layered packages and the one loader
    from tpuserve.render.boot_script import render_startup
    from tpuserve.settings import load
    d = load(environ={}).deployments["spot"]
except ImportError:  # the flat package before it
    from tpuserve.config import load_deployments
    from tpuserve.startup import render_startup
    d = load_deployments(environ={})["spot"]
spec = json.loads(sys.argv[1])
d = d.model_copy(update={name: getattr(d, name).model_copy(update=values)
                         for name, values in spec["sections"].items()})
sys.stdout.write(render_startup(d, backend_port=spec["backend_port"]))
"""
# The fake vLLM compiles for 0.3 s instead of 0.05 s, so every boot's readiness loop polls
# both ways (docker logs, the restart count) at least once and their forms can be compared.
SLOW_VLLM = {"FAKE_VLLM_COMPILE": "0.3"}
STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")


def with_sections(d: Deployment, sections: dict[str, dict[str, Any]]) -> Deployment:
    return d.model_copy(update={
        name: getattr(d, name).model_copy(update=values) for name, values in sections.items()
    })


@contextmanager
def base_tree(commit: str) -> Iterator[Path]:
    """The base revision's renderer and data, in a temp dir."""
    with tempfile.TemporaryDirectory(prefix="compare-boot-base-") as tmp:
        archive = subprocess.run(["git", "archive", commit, "tpuserve", "templates", "config"],
                                 cwd=REPO, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        yield Path(tmp)


def render(pythonpath: Path, sections: dict[str, dict[str, Any]], backend_port: int) -> str:
    spec = json.dumps({"sections": sections, "backend_port": backend_port})
    return subprocess.run(
        [sys.executable, "-c", _RENDER, spec], check=True, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(pythonpath)}, cwd=pythonpath,
    ).stdout


# ------------------------------------------------------------------ recording
def shape(body: bytes) -> object:
    """A request body's shape: JSON with each value replaced by its type, else its kind."""
    if not body:
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return "bytes"

    def walk(v: object) -> object:
        if isinstance(v, dict):
            return {k: walk(x) for k, x in sorted(v.items())}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return type(v).__name__

    return walk(value)


def normal_query(query: str) -> str:
    query = re.sub(r"upload_id=[^&]+", "upload_id=ID", query)
    return re.sub(r"ifGenerationMatch=[1-9]\d*", "ifGenerationMatch=GEN", query)


def record_requests(cloud: Cloud) -> list[tuple[str, ...]]:
    """Wrap each fake's handler: every request as (fake, method, path, query, body shape)."""
    seen: list[tuple[str, ...]] = []
    for name, fake in (("metadata", cloud.metadata), ("secretmanager", cloud.secrets),
                       ("storage", cloud.storage)):
        server = fake.server
        handler: Callable[[Any], Any] = server._handler

        def wrapped(request: Any, name: str = name, handler: Callable[[Any], Any] = handler,
                    ) -> Any:
            body = request.get_data(cache=True)
            query = request.query_string.decode()
            seen.append((name, request.method, request.path, normal_query(query),
                         json.dumps(shape(body), sort_keys=True)))
            return handler(request)

        server._handler = wrapped
    return seen


def reset(cloud: Cloud, requests: list[tuple[str, ...]]) -> None:
    """Back to an empty project: no object, no guest attribute, no call recorded."""
    for node in cloud.nodes:
        node.stop()
    cloud.storage.objects.clear()
    cloud.storage.calls.clear()
    cloud.secrets.calls.clear()
    cloud.metadata.guest_attributes.clear()
    cloud.metadata.writes.clear()
    requests.clear()


# ------------------------------------------------------------------ one revision's run
def normalise(text: str, node: Node) -> str:
    text = text.replace(str(node.root.parent), "<NODE>")
    text = STAMP.sub("<TIME>", text)
    text = re.sub(r"sha256=[0-9a-f]{64} cert=\S+", "sha256=<CERT> cert=<DER>", text)
    return re.sub(r"object_bytes=\d+", "object_bytes=<N>", text)


def spec_label_checked(argv: list[str], node: Node, tls_attr: str) -> list[str]:
    """A `docker run` argv with its spec label checked, then masked: the label hashes paths
    under the node's temp dir and, for the proxy, the certificate made at boot, so it differs
    on every run. It must be what the script's spec_hash gives for this run's own arguments
    (and, for the proxy, its nginx.conf and certificate fingerprint)."""
    if argv[:1] != ["run"] or "--label" not in argv:
        return argv
    at = argv.index("--label")
    label, rest = argv[at + 1], argv[at + 2:]
    extra: list[str] = []
    if rest[rest.index("--name") + 1] == "tpuserve-proxy":
        conf = (node.root / "var/lib/tpuserve/nginx.conf").read_bytes()
        m = re.search(r"sha256=([0-9a-f]{64})", tls_attr)
        extra = [hashlib.sha256(conf).hexdigest() + "  -", m[1] if m else ""]
    blob = b"".join(a.encode() + b"\0" for a in rest + extra)
    ok = label == "tpuserve.spec=" + hashlib.sha256(blob).hexdigest()[:16]
    return [*argv[:at + 1], "tpuserve.spec=<spec_hash of the rest>" if ok else label, *rest]


def observe(cloud: Cloud, node: Node, requests: list[tuple[str, ...]], since: float,
            start: int) -> dict[str, list[str]]:
    """What one boot of NODE did: its requests, attributes and docker calls since SINCE."""
    attrs = [f"{w.key} {w.value.split(' ', 1)[1] if ' ' in w.value else ''}"
             for w in cloud.metadata.writes_in(NAMESPACE) if w.at >= since]
    tls_attr = cloud.metadata.namespace(NAMESPACE).get("tls", "")
    docker, polls = [], set()
    for c in node.docker_calls():
        if c["at"] < since:
            continue
        call = json.dumps({"argv": spec_label_checked(c["argv"], node, tls_attr),
                           "env": c["env"]}, sort_keys=True)
        # watch_readiness polls (docker logs, the restart count) every 5 scaled seconds until
        # /health answers: how many times is timing. Their distinct forms are compared.
        if c["argv"][:1] == ["logs"] or "{{.RestartCount}} {{.State.Status}}" in c["argv"]:
            polls.add(call)
        else:
            docker.append(call)
    containers = []
    for path in sorted((node.docker_state / "containers").glob("*.json")):
        c = json.loads(path.read_text())
        containers.append(json.dumps(
            {k: c.get(k) for k in ("name", "image", "cmd", "env", "volumes")}, sort_keys=True))
    return {
        "requests": [normalise(" ".join(r), node) for r in requests[start:]],
        "attributes": [normalise(a, node) for a in attrs],
        "docker calls": [normalise(d, node) for d in docker],
        "readiness polls": sorted(normalise(p, node) for p in polls),
        "containers": [normalise(c, node) for c in containers],
        "tpu api calls": [str(c) for c in cloud.tpu.calls()],
    }


def run_revision(cloud: Cloud, requests: list[tuple[str, ...]], d: Deployment, script: str,
                 ) -> dict[str, dict[str, list[str]]]:
    """Cold boot, re-run, warm boot on a new node, with SCRIPT."""
    reset(cloud, requests)
    out: dict[str, dict[str, list[str]]] = {}
    first = cloud.node(d, **SLOW_VLLM)
    first.script.write_text(script)
    for boot, node in (("cold", first), ("rerun", first)):
        since, start = time.time(), len(requests)
        node.run()
        out[boot] = observe(cloud, node, requests, since, start)
    first.stop()
    warm = cloud.node(d, **SLOW_VLLM)
    warm.script.write_text(script)
    since, start = time.time(), len(requests)
    warm.run()
    out["warm"] = observe(cloud, warm, requests, since, start)
    warm.stop()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="360652f", help="the revision to compare with")
    args = parser.parse_args()
    totals: dict[str, int] = {}
    differences: list[str] = []
    # The readiness loop's polls run 0..n times a boot (timing): their forms, over all boots.
    poll_forms: dict[str, set[str]] = {"old": set(), "new": set()}
    with base_tree(args.base) as old_tree, tempfile.TemporaryDirectory() as tmp, \
            open_cloud(Path(tmp)) as cloud:
        requests = record_requests(cloud)
        for variant, sections in VARIANTS.items():
            d = with_sections(cloud.deployment, sections)
            old = render(old_tree, {**sections, "vllm": {"port": cloud.public_port}},
                         cloud.backend_port)
            new = render(REPO, {**sections, "vllm": {"port": cloud.public_port}},
                         cloud.backend_port)
            runs = {"old": run_revision(cloud, requests, d, old),
                    "new": run_revision(cloud, requests, d, new)}
            for boot in ("cold", "rerun", "warm"):
                for revision, run in runs.items():
                    poll_forms[revision].update(run[boot].pop("readiness polls"))
                for what, old_items in runs["old"][boot].items():
                    new_items = runs["new"][boot][what]
                    totals[what] = totals.get(what, 0) + len(old_items)
                    if old_items != new_items:
                        lines = difflib.unified_diff(old_items, new_items, "old", "new",
                                                     lineterm="", n=0)
                        differences.append(f"{variant}/{boot}/{what}:\n" + "\n".join(lines))
                state = [a for a in runs["new"][boot]["attributes"] if a.startswith("state ")]
                print(f"{variant:10} {boot:6} new: {state[-1] if state else 'no state'}; "
                      f"{len(runs['new'][boot]['requests'])} requests, "
                      f"{len(runs['new'][boot]['attributes'])} attributes, "
                      f"{len(runs['new'][boot]['docker calls'])} docker calls")
    if poll_forms["old"] != poll_forms["new"]:
        differences.append(f"readiness poll forms:\n  old {sorted(poll_forms['old'])}\n"
                           f"  new {sorted(poll_forms['new'])}")
    print("compared (old revision's counts, summed over variants and boots):")
    for what, n in totals.items():
        print(f"  {what:14} {n}")
    print(f"  {'readiness poll forms':14} {len(poll_forms['old'])} (docker logs, restart count;"
          " how many polls a boot makes is timing)")
    if differences:
        print(f"DIFFERENT in {len(differences)} places:")
        print("\n".join(differences))
        return 1
    print(f"all equal: {len(VARIANTS)} configs x 3 boots (cold, re-run, warm)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
