"""`tpuserve review BASE [HEAD]`: a plan review as Markdown (or JSON) for a pull-request comment."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from tpuserve.kinds import STACK_NAMES
from tpuserve.ops.errors import EXIT_USAGE, OpsError
from tpuserve.review.markdown import render_markdown
from tpuserve.review.model import render_json
from tpuserve.review.redact import redact
from tpuserve.review.revisions import ReviewError
from tpuserve.review.run import review

from .common import JsonOpt, command, err_console

_ATTACH_LIMIT = 200_000  # bytes read from one attachment before it is cut to fit the comment


def _attachment(spec: str) -> tuple[str, str]:
    title, sep, path = spec.partition("=")
    if not sep or not title or not path:
        raise OpsError(f"--attach {spec!r}: give TITLE=FILE", exit_code=EXIT_USAGE)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return title, f.read(_ATTACH_LIMIT)
    except OSError as exc:
        raise OpsError(f"--attach {spec!r}: {exc.strerror}", exit_code=EXIT_USAGE) from None


@command
def review_command(
    base: Annotated[str, typer.Argument(help="The base revision (a commit, branch or tag).")],
    head: Annotated[str | None, typer.Argument(
        help="The head revision; omitted: the working tree.", show_default=False)] = None,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="Write to FILE instead of stdout.", dir_okay=False,
        show_default=False)] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", help="A user config merged over both revisions' config/default.toml "
        "(TPUSERVE_CONFIG in the environment is ignored).", exists=True, dir_okay=False,
        show_default=False)] = None,
    repo: Annotated[Path | None, typer.Option(
        "--repo", help="The project directory (where main.py is); default: the current one.",
        file_okay=False, exists=True, show_default=False)] = None,
    attach: Annotated[list[str] | None, typer.Option(
        "--attach", help="TITLE=FILE: append FILE (e.g. `terraform plan` output) in a collapsed, "
        "redacted block. Repeatable.", show_default=False)] = None,
    head_synth: Annotated[Path | None, typer.Option(
        "--head-synth", help="A cdktf output directory (stacks/NAME/cdk.tf.json) to use as "
        "HEAD's Terraform instead of running HEAD's main.py here.", file_okay=False,
        exists=True, show_default=False)] = None,
    json_output: JsonOpt = False,
) -> None:
    """Synthesize BASE and HEAD offline and report, per stack, the Terraform resources added,
    removed and changed, the `vllm serve` argv and env diff with the measured rule behind each
    flag, the compile-cache key, and capacity and cost deltas (SPEC 4-7)."""
    attachments = [_attachment(a) for a in attach or ()]
    try:
        result = review(base, head, project_dir=repo, config=config, attachments=attachments,
                        head_synthesis=head_synth)
    except ReviewError as exc:
        raise OpsError(redact(str(exc)), exit_code=EXIT_USAGE) from None
    notes = _drift(config)
    if json_output:
        doc = json.loads(render_json(result))
        if notes:  # only where tune left a node off Terraform's script
            doc["tune_drift"] = notes
        text = redact(json.dumps(doc, indent=2)) + "\n"
    else:
        text = render_markdown(result, drift=[(n["stack"], n["note"]) for n in notes])
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        output.write_text(text)
        err_console.print(f"wrote {output}", markup=False)


def _drift(config: Path | None) -> list[dict[str, Any]]:
    """The reviewed config's stacks whose node `tpuserve tune` left off Terraform's script
    (tune/drift.py), from the state files beside --config (else the current directory)."""
    from tpuserve.contracts import CONFIG_ENV
    from tpuserve.settings import ConfigError, load
    from tpuserve.tune.drift import review_notes
    from tpuserve.tune.session import state_path

    environ = {CONFIG_ENV: str(config)} if config is not None else {}
    if not any(state_path(n, environ).is_file() for n in STACK_NAMES):
        return []
    try:
        deployments = load(environ).deployments
    except ConfigError:
        return []  # the review reports the config's problems itself
    return review_notes(deployments, lambda name: state_path(name, environ))


def register(app: typer.Typer) -> None:
    app.command("review")(review_command)
