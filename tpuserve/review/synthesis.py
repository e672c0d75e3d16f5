"""Synthesis of one tree by its own main.py, sandboxed (no credential in reach), memoized by
the digest of what it reads; and reading a cdktf outdir's stacks as untrusted data."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpuserve.contracts import CDK_IMPORT_ENV, CONFIG_ENV, PROJECT_ENV, ZONE_ENV
from tpuserve.paths import REPO_ROOT

from .gate import unique_keys
from .redact import redact
from .revision_facts import Synthesis

# What a synthesis reads; the digest of these names a synthesis in the memo.
SYNTH_INPUTS = ("main.py", "cdktf.json", "stacks", "tpuserve", "templates", "config")
SYNTH_TIMEOUT_S = 600.0
# Variables the synth subprocess may see; nothing else (no tokens, no cloud credentials, no
# HOME, USER or agent sockets): an allow-list, so a new credential variable is dropped too.
_PASS_ENV = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", PROJECT_ENV, ZONE_ENV,
             CDK_IMPORT_ENV, "JSII_RUNTIME", "JSII_RUNTIME_PACKAGE_CACHE")
# What synth runs by name: node (jsii) and terraform (cdktf's `terraform version` check); sh
# and the coreutils live in the system directories.
_SYNTH_PROGRAMS = ("node", "terraform")
_SYSTEM_PATH = ("/usr/bin", "/bin")

# One synthesis per distinct tree: the working-tree review reuses a commit's when equal.
_SYNTH_MEMO: dict[str, Synthesis] = {}


def tree_digest(project: Path, config: Path | None = None) -> str:
    """What a synthesis depends on: the files it reads, the user config and the interpreter."""
    h = hashlib.sha256(sys.executable.encode())
    for name in SYNTH_INPUTS:
        root = project / name
        files = [root] if root.is_file() else sorted(
            p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
        ) if root.is_dir() else []
        for path in files:
            h.update(str(path.relative_to(project)).encode() + b"\0" + path.read_bytes())
    if config is not None:
        h.update(b"config\0" + config.read_bytes())
    for var in (PROJECT_ENV, ZONE_ENV):
        h.update(f"{var}={os.environ.get(var, '')}".encode())
    return h.hexdigest()


def synth_path(environ: Mapping[str, str], node: str | None) -> str:
    """PATH for synth: the directories of node and terraform, then the system's, nothing else."""
    found = [node, *(shutil.which(p, path=environ.get("PATH", "")) for p in _SYNTH_PROGRAMS)]
    dirs = [str(Path(program).resolve().parent) for program in found if program]
    return os.pathsep.join(dict.fromkeys([*dirs, *_SYSTEM_PATH]))


def jsii_cache_root(environ: Mapping[str, str]) -> str | None:
    """The user's jsii package cache (where jsii itself puts it on Linux), or None.

    Shared with the sandbox on purpose: a fresh one costs 10.6 s and 349 MB per synth instead
    of 1.9 s (measured when the sandbox was built). It holds extracted npm packages, no credential.
    """
    if environ.get("JSII_RUNTIME_PACKAGE_CACHE_ROOT"):
        return environ["JSII_RUNTIME_PACKAGE_CACHE_ROOT"]
    base = environ.get("XDG_CACHE_HOME") or (
        str(Path(environ["HOME"]) / ".cache") if environ.get("HOME") else None)
    return None if base is None else str(Path(base) / "aws" / "jsii" / "package-cache")


def synth_env(project: Path, outdir: Path, config: Path | None,
              environ: Mapping[str, str] | None = None, *, home: Path | None = None
              ) -> dict[str, str]:
    """A minimal environment with a throwaway HOME: no credentials, nothing that leads to one.

    TPUSERVE_CONFIG only when the user gives --config. `home` defaults to a directory beside
    outdir (created by `synthesize`).
    """
    src = os.environ if environ is None else environ
    env = {k: src[k] for k in _PASS_ENV if k in src}
    node = src.get("JSII_NODE")
    ours = REPO_ROOT / "node_modules" / ".bin" / "node"
    if not node and ours.exists():
        node = str(ours)  # a worktree has no node_modules: use ours (Node 22)
    if node:
        env["JSII_NODE"] = node
    home = home or outdir.with_name(outdir.name + "-home")
    cache = jsii_cache_root(src)
    if cache is not None:
        env["JSII_RUNTIME_PACKAGE_CACHE_ROOT"] = cache
    env.update({
        "PATH": synth_path(src, node),
        "HOME": str(home),
        "TMPDIR": str(home / "tmp"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "PYTHONPATH": str(project),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "CDKTF_OUTDIR": str(outdir),
        "CHECKPOINT_DISABLE": "1",
    })
    if config is not None:
        env[CONFIG_ENV] = str(config.resolve())
    return env


def synthesize(project: Path, outdir: Path, *, config: Path | None = None,
               python: str = sys.executable, timeout_s: float = SYNTH_TIMEOUT_S) -> Synthesis:
    """Run the revision's own main.py (as cdktf would) and read every stack it wrote."""
    key = tree_digest(project, config)
    if key in _SYNTH_MEMO:
        return _SYNTH_MEMO[key]
    home = outdir.with_name(outdir.name + "-home")
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run([python, "main.py"], cwd=project,
                              env=synth_env(project, outdir, config, home=home),
                              stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return Synthesis({}, f"synth timed out after {timeout_s:.0f} s")
    if proc.returncode != 0 or not (outdir / "stacks").is_dir():
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:]) or f"exit {proc.returncode}"
        return Synthesis({}, redact(tail))
    result = read_synthesis(outdir)
    _SYNTH_MEMO[key] = result
    return result


# A synthesized stack is ~60 KB; a directory handed in (`--head-synth`) is untrusted data.
MAX_STACK_BYTES = 50 << 20


def read_synthesis(outdir: Path) -> Synthesis:
    """Every outdir/stacks/NAME/cdk.tf.json (links not followed), or why they cannot be read."""
    stacks_dir = outdir / "stacks"
    if not stacks_dir.is_dir():
        return Synthesis({}, f"{stacks_dir}: no synthesized stacks")
    out: dict[str, Mapping[str, Any]] = {}
    for p in sorted(stacks_dir.iterdir()):
        doc = p / "cdk.tf.json"
        if p.is_symlink() or doc.is_symlink() or not doc.is_file():
            continue
        try:
            if doc.stat().st_size > MAX_STACK_BYTES:
                raise ValueError(f"over {MAX_STACK_BYTES:,} bytes")
            value = json.loads(doc.read_text(), object_pairs_hook=unique_keys)
        except (OSError, ValueError, RecursionError) as exc:
            return Synthesis({}, f"{doc}: {' '.join(str(exc).split())[:200]}")
        if not isinstance(value, dict):
            return Synthesis({}, f"{doc}: not a JSON object")
        out[p.name] = value
    return Synthesis(out)
