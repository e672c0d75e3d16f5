"""How Terraform runs our Python on the deploying machine (flex's queued resource, the VM
stacks' billing guard): one interpreter and one working directory for every provisioner."""

from __future__ import annotations

import base64
import gzip

from tpuserve.contracts import PYTHON_ENV, EntryPoint

from .literals import tf_ref

# The project's Python: the venv `./dev setup` makes, relative to the repo root (every
# provisioner's working_dir), so it works whatever is on PATH. TPUSERVE_PYTHON (a path, or
# words such as `pipenv run python`) picks another interpreter. Plain shell text: the stack's
# escape pass makes Terraform hand it to the shell as written.
PYTHON = f"${{{PYTHON_ENV}:-.venv/bin/python}}"
# terraform runs in cdktf.out/stacks/<stack>: the repo root is three up.
REPO_ROOT_FROM_MODULE = "/../../.."


def python_module(entry: EntryPoint) -> str:
    """The shell command that runs `python -m MODULE` with the project's interpreter."""
    return f"{PYTHON} -m {entry.module}"


def repo_root() -> str:
    """The repo root as a Terraform expression (a token: the escape pass leaves it alone)."""
    return tf_ref("path.module") + REPO_ROOT_FROM_MODULE


def base64gzip_chars(text: str) -> int:
    """About what Terraform's base64gzip makes of TEXT (Go's gzip, default level)."""
    return len(base64.b64encode(gzip.compress(text.encode(), compresslevel=6)))
