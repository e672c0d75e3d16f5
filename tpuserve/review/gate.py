"""The gate between a pull request's synthesized Terraform and a job that holds a credential.

The plan-review workflow synthesizes the PR in a job with no credential; the job that holds
the read-only plan identity runs only the BASE branch's code, and plans the PR's JSON only if
this gate (base code) passes it. `terraform plan` runs no local-exec provisioner, but a
synthesized document can still make it run or reveal things:

- `data "external"` runs its `program` at plan time: the program and working_dir must be
  exactly one the base synthesized (its `query` is data on the program's stdin);
- any other data source (`google_client_config` exposes the access token) must be of a type
  the base uses, and the base uses none besides `external`;
- Terraform evaluates `${...}` and `%{...}` in every string: `${file(...)}` would print the
  runner's credential file into the plan. Only plain references (`${a.b[0].c}`) and the
  exact expressions the base synthesized pass;
- `terraform` (backend, required providers) and `provider` blocks (custom endpoints would
  receive the token) must equal the base's; `module` (downloads code), `check`, `import` and
  any other top-level block are refused; a resource is a `google_*` type or `terraform_data`
  (any other prefix makes `terraform init` fetch another provider), and names its provider,
  if at all, among the base's.

Refusal is per stack, with reasons; a refused stack is reported in the review, not planned.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tpuserve.contracts import PLAN_GATE

ALLOWED_TOP = frozenset({"//", "terraform", "provider", "resource", "data", "output"})
# cdktf writes stack directories with these names; anything else is not a stack.
STACK_NAME = re.compile(r"[a-z][a-z0-9-]{0,62}")
# ${a.b[0].c}: a reference, no call, no operator, no quote.
PLAIN_REFERENCE = re.compile(r"\$\{[A-Za-z_][\w-]*(?:\.[A-Za-z_*][\w-]*|\[\d+\])*\}")
# Keys Terraform reads as bare references (no ${}) in JSON syntax.
REFERENCE_KEYS = frozenset({"depends_on", "ignore_changes", "replace_triggered_by"})
BARE_REFERENCE = re.compile(r"[A-Za-z_][\w-]*(?:\.[A-Za-z_*][\w-]*|\[\d+\])*")
MAX_DOC_BYTES = 50 << 20  # the synthesized flex stack is ~60 KB


def template_expressions(text: str) -> Iterator[str]:
    """Each `${...}` / `%{...}` Terraform would evaluate in `text`, as written (escapes
    `$${` and `%%{` are literal text). An unbalanced one is yielded to its end."""
    i = 0
    while i < len(text):
        if text.startswith(("$${", "%%{"), i):
            i += 3
            continue
        if text.startswith(("${", "%{"), i):
            depth, j = 0, i + 1
            while j < len(text):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                if depth == 0:
                    break
                j += 1
            yield text[i: j + 1]
            i = j + 1
            continue
        i += 1


def _strings(value: Any, path: str = "") -> Iterator[tuple[str, str, str]]:
    """(path, parent key, string) of every key and string value in a JSON document."""
    if isinstance(value, str):
        yield path, path.rsplit(".", 1)[-1].split("[", 1)[0], value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield f"{path}.{key}", "", str(key)
            yield from _strings(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, f"{path}[{i}]")


def _strip_meta(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _strip_meta(v) for k, v in value.items() if k != "//"}
    if isinstance(value, list):
        return [_strip_meta(v) for v in value]
    return value


def _external_programs(doc: Mapping[str, Any]) -> set[str]:
    external = (doc.get("data") or {}).get("external") or {}
    return {json.dumps([body.get("program"), body.get("working_dir")])
            for body in external.values() if isinstance(body, Mapping)}


def problems(pr: Any, base: Mapping[str, Any], base_all: list[Mapping[str, Any]]) -> list[str]:
    """Why `pr` (one stack's cdk.tf.json) must not be planned with a credential; [] to plan.

    `base` is the same stack synthesized by the base branch; `base_all` every base stack.
    """
    if not isinstance(pr, Mapping):
        return ["not a JSON object"]
    return [*_block_problems(pr, base), *_data_problems(pr, base_all),
            *_resource_problems(pr, base), *_template_problems(pr, base)]


def _block_problems(pr: Mapping[str, Any], base: Mapping[str, Any]) -> list[str]:
    """Top-level blocks: only the allowed ones, and terraform/provider exactly the base's."""
    out = [f"top-level block {key!r} is not allowed (only {sorted(ALLOWED_TOP)})"
           for key in sorted(set(pr) - ALLOWED_TOP)]
    out += [(f"the {key!r} block differs from the base branch's (backend, providers and their "
             "endpoints come from the base)")
            for key in ("terraform", "provider")
            if _strip_meta(pr.get(key)) != _strip_meta(base.get(key))]
    return out


def _data_problems(pr: Mapping[str, Any], base_all: list[Mapping[str, Any]]) -> list[str]:
    """Data sources: a type the base uses; an external program exactly one the base runs."""
    out: list[str] = []
    programs = set().union(*(_external_programs(b) for b in base_all))
    data_types = {t for b in base_all for t in (b.get("data") or {})}
    data = pr.get("data") or {}
    for dtype, named in (data.items() if isinstance(data, Mapping) else []):
        if dtype not in data_types:
            out.append(f"data source type {dtype!r} is not one the base branch uses "
                       f"({sorted(data_types)})")
            continue
        for name, body in (named.items() if isinstance(named, Mapping) else []):
            if dtype == "external":
                program = json.dumps([body.get("program"), body.get("working_dir")]
                                     if isinstance(body, Mapping) else None)
                if program not in programs:
                    out.append(f"data.external.{name}: its program and working_dir are not the "
                               "base branch's (external programs run at plan time)")
    return out


def _resource_problems(pr: Mapping[str, Any], base: Mapping[str, Any]) -> list[str]:
    """Resources: google_* or terraform_data, with a provider among the base's."""
    out: list[str] = []
    providers = set(base.get("provider") or {})
    resources = pr.get("resource") or {}
    for rtype, named in (resources.items() if isinstance(resources, Mapping) else []):
        if not (rtype.startswith("google_") or rtype == "terraform_data"):
            out.append(f"resource type {rtype!r}: only google_* and terraform_data (another "
                       "prefix makes terraform init fetch another provider)")
        for name, body in (named.items() if isinstance(named, Mapping) else []):
            provider = body.get("provider") if isinstance(body, Mapping) else None
            if provider is not None and str(provider).split(".")[0] not in providers:
                out.append(f"{rtype}.{name}: provider {provider!r} is not one of the base's "
                           f"{sorted(providers)}")
    return out


def _template_problems(pr: Mapping[str, Any], base: Mapping[str, Any]) -> list[str]:
    """Strings: every template a plain reference or one the base synthesizes; reference keys
    hold references only (terraform and provider were compared whole)."""
    out: list[str] = []
    allowed = {e for _, _, s in _strings(base) for e in template_expressions(s)}
    for path, parent, text in _strings({k: v for k, v in pr.items()
                                        if k not in ("terraform", "provider")}):
        out += [(f"{path}: template {expr[:80]!r} is neither a plain reference nor an "
                 "expression the base branch synthesizes")
                for expr in template_expressions(text)
                if not PLAIN_REFERENCE.fullmatch(expr) and expr not in allowed]
        if parent in REFERENCE_KEYS and not (BARE_REFERENCE.fullmatch(text)
                                             or PLAIN_REFERENCE.fullmatch(text)):
            out.append(f"{path}: {text[:80]!r} is not a plain reference")
    return out


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """object_pairs_hook: Terraform reads every duplicate block key, json keeps the last one,
    so a duplicate could hide a second `data` or `provider` from the checks: refuse it."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _read(path: Path) -> Any:
    if path.stat().st_size > MAX_DOC_BYTES:
        raise ValueError(f"over {MAX_DOC_BYTES:,} bytes")
    return json.loads(path.read_text(), object_pairs_hook=unique_keys)


def _stacks(outdir: Path) -> dict[str, Path]:
    root = outdir / "stacks"
    if not root.is_dir():
        return {}
    return {p.name: p / "cdk.tf.json" for p in sorted(root.iterdir())
            if STACK_NAME.fullmatch(p.name) and not p.is_symlink()
            and (p / "cdk.tf.json").is_file() and not (p / "cdk.tf.json").is_symlink()}


def gate(base_out: Path, pr_out: Path, gated_out: Path, reports: Path) -> dict[str, list[str]]:
    """Copy each PR stack that passes into gated_out/stacks/NAME; write why the others did
    not to reports/NAME.txt. Returns {stack: problems} ([] for a stack that passed)."""
    base = {name: _read(p) for name, p in _stacks(base_out).items()}
    result: dict[str, list[str]] = {}
    for name, path in _stacks(pr_out).items():
        try:
            doc = _read(path)
        except (OSError, ValueError, RecursionError) as exc:
            result[name] = [f"unreadable: {' '.join(str(exc).split())[:200]}"]
            continue
        if name not in base:
            result[name] = [("a stack the base branch does not have: its providers and "
                             "programs have no trusted counterpart")]
        else:
            result[name] = problems(doc, base[name], list(base.values()))
        if not result[name]:
            # Written from what was checked (not copied), so Terraform reads exactly that.
            (gated_out / "stacks" / name).mkdir(parents=True, exist_ok=True)
            (gated_out / "stacks" / name / "cdk.tf.json").write_text(json.dumps(doc))
    reports.mkdir(parents=True, exist_ok=True)
    for name, found in result.items():
        if found:
            (reports / f"{name}.txt").write_text(
                "Not planned with credentials: the pull request's synthesized stack failed the "
                "plan gate (tpuserve/plan_gate.py):\n" + "".join(f"- {p}\n" for p in found))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PLAN_GATE.prog, description=__doc__
                                     .split("\n", 1)[0])
    parser.add_argument("base_out", type=Path, help="the base branch's cdktf.out")
    parser.add_argument("pr_out", type=Path, help="the pull request's cdktf.out (untrusted)")
    parser.add_argument("gated_out", type=Path, help="where the stacks that pass are written")
    parser.add_argument("reports", type=Path, help="where NAME.txt says why a stack did not")
    args = parser.parse_args(argv)
    if not _stacks(args.base_out):
        print(f"tpuserve: error: {args.base_out}: no synthesized stacks", file=sys.stderr)
        return 2
    for name, found in gate(args.base_out, args.pr_out, args.gated_out, args.reports).items():
        print(f"{name}: {'plan' if not found else f'refused ({len(found)} problem(s))'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
