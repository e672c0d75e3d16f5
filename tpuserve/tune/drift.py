"""The node left off Terraform's script by `tpuserve tune --keep-best` (or a config that did
not go back): read from the stack's tune state file, for `tpuserve status` and `review`.

The state file records the candidate the node runs, the served-config hash of that candidate
(what the boot script's `config` guest attribute shows) and the overlay written for it. The
drift holds while the config this CLI reads does not render that hash: a deploy from it would
put another script on the node. Once the overlay is merged into the config, the config renders
the node's hash and `npx cdktf deploy STACK` records it in Terraform's state without touching
the server. The overlay pins `vllm.image` to the build the node's boot ran (a tag moves): a
config that differs from the node's only by that pin counts as merged, and deploying it re-runs
the script once on the same build.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuserve.settings import Deployment
from tpuserve.settings.learned_profiles import pinned_digest, unpinned
from tpuserve.tune import halving
from tpuserve.tune import state as state_file
from tpuserve.tune.candidates import Candidate
from tpuserve.tune.state import TERRAFORM, TuneState


def served_sha256(d: Deployment, raw: Mapping[str, Any], c: Candidate) -> str:
    """The `config` hash the node shows once it runs candidate C."""
    from tpuserve.ops.served_config import deployed_sha256
    from tpuserve.tune.tpu_node import overlaid

    return deployed_sha256(overlaid(raw, d.name, c.overlay()))


def mark(state: TuneState, d: Deployment, raw: Mapping[str, Any],
         candidates: Mapping[str, Candidate], overlay: str | None) -> None:
    """Record in the state which config the node was left on (nothing for Terraform's)."""
    c = candidates.get(state.node_on) if state.node_on != TERRAFORM else None
    state.node_on_sha256 = served_sha256(d, raw, c) if c is not None else None
    state.overlay = overlay if c is not None else None


@dataclass(frozen=True)
class Drift:
    stack: str
    candidate: str
    state_file: Path
    overlay: str | None
    running_sha256: str | None
    deployed_sha256: str

    def line(self) -> str:
        merge = (f"merge {self.overlay} into your config and deploy it" if self.overlay
                 else "no overlay was written for it")
        return (f"the node runs `tpuserve tune --keep-best`'s config {self.candidate!r} "
                f"(argv sha256 {self.running_sha256 or 'unknown'}), not Terraform's script "
                f"(config sha256 {self.deployed_sha256}); {merge} (TPUSERVE_CONFIG=yours.toml:"
                f"OVERLAY), or run `npx cdktf deploy {self.stack}` to put Terraform's script "
                f"back; tune state: {self.state_file}")

    def to_json(self) -> dict[str, Any]:
        return {"candidate": self.candidate, "state_file": str(self.state_file),
                "overlay": self.overlay, "running_sha256": self.running_sha256,
                "deployed_sha256": self.deployed_sha256}


def pinned_only(d: Deployment, st: TuneState) -> str | None:
    """The node's build (DIGEST) when the config differs from the kept config by no more than
    pinning its image to it: the config hashed with its tag alone is the node's hash."""
    from tpuserve.ops.served_config import deployed_sha256

    run = halving.latest(st, st.node_on)
    digest = pinned_digest(d.vllm.image)
    if run is None or digest is None or run.boot.digest != digest:
        return None
    tag = d.model_copy(update={"vllm": d.vllm.model_copy(
        update={"image": unpinned(d.vllm.image)})})
    return digest if deployed_sha256(tag) == st.node_on_sha256 else None


def drift_for(d: Deployment, path: Path, running: str | None = None) -> Drift | None:
    """The drift the state file at PATH records for the stack, or None: no state file, the node
    back on Terraform's script, the config already rendering the node's hash, or a node known
    to run another config (redeployed since). A broken state file is said, not skipped."""
    from tpuserve.ops.served_config import deployed_sha256

    try:
        st = state_file.load(path)
    except ValueError as exc:
        return Drift(d.name, f"unknown ({exc})", path, None, None, deployed_sha256(d))
    if st is None or st.stack != d.name or st.node_on == TERRAFORM:
        return None
    deployed = deployed_sha256(d)
    kept = st.node_on_sha256
    if kept is not None and (kept == deployed or (running is not None and running != kept)
                             or pinned_only(d, st)):
        return None
    return Drift(d.name, st.node_on, path, st.overlay, kept, deployed)


def review_notes(deployments: Mapping[str, Deployment],
                 path_for: Any) -> list[dict[str, Any]]:
    """What `tpuserve review` says per VM stack whose tune state leaves its node off
    Terraform's script: the drift while the reviewed config does not render the node's
    config, or that deploying the reviewed config records it (the overlay merged)."""
    from tpuserve.ops.served_config import deployed_sha256

    out: list[dict[str, Any]] = []
    for name, d in deployments.items():
        if d.kind.on_gke:
            continue
        path = path_for(name)
        drift = drift_for(d, path)
        if drift is not None:
            out.append({"stack": name, "merged": False, **drift.to_json(),
                        "note": drift.line() + "; the argv and env diff below is against "
                        "the base revision's config, not what the node runs"})
            continue
        try:
            st = state_file.load(path)
        except ValueError:
            continue  # said by drift_for above (a broken file is a drift of unknown config)
        if st is None or st.stack != name or st.node_on == TERRAFORM:
            continue
        deployed = deployed_sha256(d)
        build = None if st.node_on_sha256 == deployed else pinned_only(d, st)
        if st.node_on_sha256 == deployed or build:
            how = ("deploying it records it in Terraform's state without touching the server"
                   if build is None else "deploying it records it in Terraform's state and "
                   f"re-runs the script once, its image pinned to the build the node runs "
                   f"({build})")
            out.append({"stack": name, "merged": True, "candidate": st.node_on,
                        "state_file": str(path), "overlay": st.overlay,
                        "running_sha256": st.node_on_sha256, "deployed_sha256": deployed,
                        "note": f"the reviewed config renders the config `tpuserve tune "
                        f"--keep-best` left on the node ({st.node_on!r}, argv sha256 "
                        f"{st.node_on_sha256}): {how}; tune state: {path}"})
    return out
