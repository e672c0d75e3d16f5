"""The README as a user reads it: its shape, the quick start's offline commands run (synth,
`tpuserve plan`, `tpuserve endpoint` and the curl and SDK lines against the fakes), and every
figure in its marked tables held to `tpuserve plan --json`, so a figure that drifts fails."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_cli_tls import TlsEnv, tls_env  # noqa: F401 (the fixture)
from tests.cli_support import API_KEY, BOOT_READY, PROJECT, ZONE, ga, invoke
from tpuserve.paths import REPO_ROOT
from tpuserve.settings import STACK_NAMES, ConfigError, load

README = REPO_ROOT / "README.md"
TEXT = README.read_text()
LINES = TEXT.splitlines()
QUICK_START_LIMIT = 100  # the flex quick start (deploy to curl, SDK, destroy) within these lines


# ------------------------------------------------------------------------------ parsing


def marked_table(marker: str) -> list[list[str]]:
    """The rows (cells stripped, header and rule dropped) of the table under `<!-- marker:`."""
    start = next(i for i, ln in enumerate(LINES) if ln.startswith(f"<!-- {marker}:"))
    rows = []
    for ln in LINES[start + 1:]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in ln.strip().strip("|").split("|")])
    assert len(rows) > 2, f"no table under the {marker} marker"
    return rows[2:]


def number(cell: str) -> float:
    """The one number in a cell: '0.5779', '$0.12 a month', '18,432 B', '321,563 tokens'."""
    found = re.findall(r"\d[\d,]*(?:\.\d+)?", cell)
    assert len(found) == 1, cell
    return float(found[0].replace(",", ""))


def decimals(cell: str) -> int:
    found = re.search(r"\d[\d,]*(?:\.(\d+))?", cell)
    assert found is not None, cell
    return len(found.group(1) or "")


def fenced_blocks(lang: str) -> list[tuple[int, str]]:
    """(first line number, body) of every ```lang block."""
    out, i = [], 0
    while i < len(LINES):
        if LINES[i].startswith("```"):  # an opening fence; its block ends at the next bare one
            j = next(k for k in range(i + 1, len(LINES)) if LINES[k].strip() == "```")
            if LINES[i].strip() == f"```{lang}":
                out.append((i + 1, "\n".join(LINES[i + 1:j])))
            i = j
        i += 1
    return out


def quick_start() -> tuple[int, int]:
    """The quick start's line span (1-based heading line, next heading's line)."""
    start = next(i for i, ln in enumerate(LINES) if ln.startswith("## Quick start"))
    end = next(i for i in range(start + 1, len(LINES)) if LINES[i].startswith("## "))
    return start + 1, end + 1


def quick_start_commands() -> list[str]:
    """The quick start's shell commands, continuation lines joined, comments dropped."""
    start, end = quick_start()
    out: list[str] = []
    for first, body in fenced_blocks("sh"):
        if not start < first < end:
            continue
        joined = re.sub(r"\\\n\s*", "", body)
        for ln in joined.splitlines():
            ln = ln.strip()
            if ln and not ln.startswith("#"):
                out.append(ln)
    return out


def command(prefix: str) -> str:
    (found,) = [c for c in quick_start_commands() if c.startswith(prefix)]
    return found


def line_of(fragment: str) -> int:
    return next(i + 1 for i, ln in enumerate(LINES) if fragment in ln)


@pytest.fixture(scope="module")
def plans() -> dict[str, dict[str, Any]]:
    """`tpuserve plan --json` of the embedded default config, for flex and the fleet."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("TPUSERVE_CONFIG", "TPUSERVE_PROJECT", "TPUSERVE_ZONE"):
            mp.delenv(name, raising=False)
        out = {}
        for stack in ("flex", "fleet"):
            result = invoke("plan", "--stack", stack, "--json")
            assert result.exit_code == 0, result.stderr
            out[stack] = json.loads(result.stdout)
    return out


# ------------------------------------------------------------------------------ shape


def test_the_readme_is_at_most_300_lines() -> None:
    assert len(LINES) <= 300


def test_the_readme_opens_with_the_two_commands_ci_runs() -> None:
    # .ci/run runs `./dev synth` and `./dev test` in a fresh clone as the README's commands.
    assert LINES[0] == "```sh"
    assert LINES[1].startswith("./dev synth ")
    assert LINES[2].startswith("./dev test ")
    assert LINES[3] == "```"


def test_the_flex_quick_start_is_within_the_first_100_lines() -> None:
    start, _ = quick_start()
    for fragment in ("./dev deploy flex", "tpuserve endpoint flex", "curl --cacert",
                     "openai.OpenAI(", "./dev destroy flex"):
        assert start < line_of(fragment) <= QUICK_START_LIMIT, fragment


def test_the_stack_table_lists_every_kind_in_order() -> None:
    assert [row[0].strip("`") for row in marked_table("stacks")] == list(STACK_NAMES)


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # no headings in code
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("doc", ["README.md", "CONTRIBUTING.md",
                                 *sorted(p.relative_to(REPO_ROOT).as_posix()
                                         for p in (REPO_ROOT / "docs").glob("*.md"))])
def test_every_link_of_the_documents_resolves(doc: str) -> None:
    source = REPO_ROOT / doc
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", source.read_text()):
        if target.startswith("http"):
            continue
        path = (source.parent / target).resolve() if target else source
        # docs/configuration.md is generated from the settings (CONTRIBUTING.md).
        if path == REPO_ROOT / "docs" / "configuration.md":
            continue
        assert path.is_file(), (doc, target)
        if anchor:
            assert anchor in anchors(path), (doc, target, anchor)


# ------------------------------------------------------------------------------ figures


def test_the_stack_table_matches_the_plan(plans: dict[str, dict[str, Any]]) -> None:
    flex = plans["flex"]
    for stack, _, _, hour, month, per_m in marked_table("stacks"):
        stack = stack.strip("`")
        if stack == "fleet":
            cost = plans["fleet"]["fleet"]["cost"]["min"]["first_choice"]
            (cell,) = [t for t in plans["fleet"]["fleet"]["throughput"]
                       if (t["context"], t["clients_per_replica"]) == (128, 64)]
            want = (cost["usd_per_hour"], cost["usd_per_month"],
                    cell["min"]["usd_per_million_output_tokens"]["first_choice"])
        else:
            p = flex["provisioning"][stack]
            want = (p["usd_per_hour"], p["usd_per_month"],
                    p["usd_per_million_output_tokens"]["128x64"])
        for cell_text, value in zip((hour, month, per_m), want, strict=True):
            assert number(cell_text) == round(value, decimals(cell_text)), (stack, cell_text)


def test_the_figures_table_matches_the_plan(plans: dict[str, dict[str, Any]]) -> None:
    flex = plans["flex"]
    want = {
        "KV cache per token": flex["kv_bytes_per_token"],
        "KV pool": flex["kv_tokens"],
        "most clients at 8,192-token context": flex["kv_wall"]["8192"],
        "the base, dormant": flex["base"]["usd_per_month"],
    }
    rows = {row[0]: row[1] for row in marked_table("figures")}
    assert set(rows) == set(want)
    for name, value in want.items():
        assert number(rows[name]) == round(value, decimals(rows[name])), name


def test_the_prose_figures_match_the_plan(plans: dict[str, dict[str, Any]]) -> None:
    """The figures 'Picking a stack' and the quick start derive, as the plan derives them."""
    flex = plans["flex"]
    from tpuserve.settings import load

    hours = load().deployments["flex"].stack.max_run_seconds / 3600  # the default's run
    assert f"at most ${flex['provisioning']['flex']['usd_per_hour'] * hours:.2f} for the default" \
        in TEXT
    assert f"${flex['flex_premium_usd_per_hour']:.4f}/h premium" in TEXT
    assert f"every {flex['break_even_hours']['cold']:.1f} h" in TEXT
    assert f"({flex['break_even_hours']['warm']:.1f} h with a warm cache)" in TEXT
    assert f"({flex['kv_wall']['8192']} at 8,192 tokens, derived)" in TEXT
    prices = flex["provisioning"]
    dearer = (prices["flex"]["usd_per_hour"] / prices["spot"]["usd_per_hour"] - 1) * 100
    assert f"{dearer:.1f}% dearer than spot" in TEXT
    # A forgotten weekend on spot: 60 h (docs/measurements.md, SPEC 7), to the dollar.
    assert f"a forgotten weekend would be ~${prices['spot']['usd_per_hour'] * 60:.0f}" in TEXT
    peak = max(c["output_tokens_per_s"] for c in flex["throughput"])
    assert f"one chip's measured peak ({peak:,} tok/s, SPEC 6)" in TEXT
    overhead = plans["fleet"]["fleet"]["overhead_usd_per_hour"]["min"]
    assert f"autoscaling are worth ~${overhead:.2f}/h" in TEXT


def test_the_planner_page_states_what_the_default_flex_stack_plans(
        plans: dict[str, dict[str, Any]]) -> None:
    flex = plans["flex"]
    page = " ".join((REPO_ROOT / "docs" / "planner.md").read_text().split())
    assert (f"The default flex stack plans {flex['kv_bytes_per_token']:,} B/token, a "
            f"{flex['kv_pool_bytes'] / 2**30:.2f} GiB pool of {flex['kv_tokens']:,} tokens, "
            f"{flex['num_blocks']:,} blocks of {flex['block_size']}, a "
            f"{flex['decode_floor_ms']:.2f} ms decode floor and "
            f"${flex['provisioning']['flex']['usd_per_million_output_tokens']['128x64']:.3f} per "
            "million output tokens at 128 tokens x 64 clients") in page


def test_the_settings_table_states_the_defaults_the_loader_gives() -> None:
    deployments = load(environ={}).deployments

    def default(setting: str) -> Any:
        section, *rest = setting.split(".")
        if section == "stacks":  # stacks.NAME.key: that stack's own table
            return getattr(deployments[rest[0]].stack, rest[1])
        d = deployments["fleet" if section == "fleet" else "flex"]
        return getattr(getattr(d, section), rest[0])

    rows = marked_table("settings")
    assert len(rows) >= 8
    for setting_cell, default_cell, _ in rows:
        settings = re.findall(r"`([a-z_.]+)`", setting_cell)
        shown = re.findall(r"`([^`]*)`", default_cell) or re.findall(r"[\d.]+", default_cell)
        if default_cell.startswith("unset"):
            shown = ["None"] * len(settings)
        also = re.search(r"\(and `(\w+)`\)", setting_cell)  # e.g. (and `ondemand`)
        if also:
            sibling = settings[0].split(".")
            sibling[1] = also.group(1)
            settings, shown = [settings[0], ".".join(sibling)], shown * 2
        assert len(settings) == len(shown), setting_cell
        for setting, text in zip(settings, shown, strict=True):
            value = default(setting)
            want = json.dumps(value) if isinstance(value, list) else str(value)
            assert text.strip('"') in (want, want.removesuffix(".0")), (setting, text, value)


# ------------------------------------------------------------------------------ the commands


def test_dev_synth_makes_every_stack_of_the_table(synthesized: dict[str, dict[str, Any]]) -> None:
    """`./dev synth` with the embedded default config: the base and each stack in the table;
    port 8000 closed on the flex node until a setting opens it (what the quick start says)."""
    assert {"base", *STACK_NAMES} <= set(synthesized)
    rules = synthesized["flex"]["resource"]["google_compute_firewall"]
    assert not [r for r in rules.values()
                if any("8000" in a.get("ports", []) for a in r["allow"])]


def test_the_quick_start_config_opens_the_port_and_plans(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    ((_, body),) = [(n, b) for n, b in fenced_blocks("toml") if b.startswith("# mine.toml")]
    mine = tmp_path / "mine.toml"
    mine.write_text(body)
    assert command("export TPUSERVE_CONFIG=") == "export TPUSERVE_CONFIG=mine.toml"
    d = load(environ={"TPUSERVE_CONFIG": str(mine), "TPUSERVE_PROJECT": "my-project"}
             ).deployments["flex"]
    assert d.access.api_source_ranges == ["203.0.113.7/32"]
    monkeypatch.setenv("TPUSERVE_CONFIG", str(mine))
    monkeypatch.setenv("TPUSERVE_PROJECT", "my-project")
    result = invoke("plan")
    assert result.exit_code == 0, result.stderr


def test_endpoint_curl_and_sdk_of_the_quick_start_reach_the_server(tls_env: TlsEnv,  # noqa: F811
                                                                   tmp_path: Path) -> None:
    """Against a fake TPU API and a fake vLLM behind TLS: the README's endpoint command writes
    the certificate, and its curl and SDK lines, pointed at the node, get an answer."""
    d = tls_env.deployments["flex"]
    tls_env.tpu.seed_queued_resource(PROJECT, ZONE, d.node_name, state="ACTIVE")
    tls_env.tpu.set_node_ip(d.node_name, "127.0.0.1")
    ga(tls_env.tpu, d.node_name, dict(BOOT_READY) | {"tls": tls_env.served.attribute})

    args = shlex.split(command(".venv/bin/tpuserve endpoint"), comments=True)[1:]
    result = invoke(*args)  # cwd is tmp_path (the fixture)
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "tpuserve-flex.pem").is_file()
    node = f"127.0.0.1:{tls_env.oai.port}"
    assert f"https://{node}/v1" in result.stdout

    env = {**os.environ, "OPENAI_API_KEY": API_KEY}
    curl = command("curl ").replace("IP:8000", node)
    out = subprocess.run(["bash", "-c", curl], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["choices"][0]["message"]["content"] == "pong"

    ((_, sdk),) = [(n, b) for n, b in fenced_blocks("python") if "openai.OpenAI(" in b]
    out = subprocess.run([sys.executable, "-c", sdk.replace("IP:8000", node)], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "pong\n"


def test_the_configuration_error_shown_is_what_synth_prints(tmp_path: Path) -> None:
    """The README's example of a refused value is main.py's message for it, word for word."""
    ((_, shown),) = [(n, b) for n, b in fenced_blocks("") if "invalid configuration" in b]
    setting, value = re.search(r"\] ([\w.]+) = ([\d.]+):", shown).groups()
    section, key = setting.split(".")
    bad = tmp_path / "bad.toml"
    bad.write_text(f"[{section}]\n{key} = {value}\n")
    with pytest.raises(ConfigError) as exc:
        load(environ={"TPUSERVE_CONFIG": str(bad)})
    assert f"tpuserve: {exc.value}" == shown


def test_the_troubleshooting_zone_error_is_what_the_loader_says() -> None:
    (row,) = [ln for ln in LINES if ln.startswith("| `gcp.zone = 'europe-west4-a'")]
    shown = row.split("`")[1]
    with pytest.raises(ConfigError) as exc:
        load(environ={"TPUSERVE_ZONE": "europe-west4-a"})
    assert any(shown in p for p in exc.value.problems), exc.value.problems
