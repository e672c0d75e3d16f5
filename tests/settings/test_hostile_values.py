"""Dozens of hostile values in every string setting: refused with a message naming the setting,
or landing literally in bash, nginx, vLLM's argv and Terraform.

Two tables. The first goes through the real loader (`validate`, as main.py and the CLI use it):
every value must be refused by a message that names the setting, or be accepted and land
literally. The second bypasses validation (`model_copy`), so it proves the renderers and the
Terraform escape pass keep a value literal on their own, not only because the patterns refuse it.
Landing is checked with the real components: the boot script's settings block run by bash, the
nginx config through `nginx -t` (Debian's nginx), and one `terraform apply` for every value.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from stacks.literals import escape_literals
from tests.nginx_support import NGINX
from tests.terraform_support import apply_outputs
from tpuserve.paths import REPO_ROOT
from tpuserve.render.boot_script import render_startup, startup_context, vllm_command
from tpuserve.settings import Deployment, load_raw
from tpuserve.settings.loader import validate

BASE = load_raw(environ={})
TERRAFORM = shutil.which("terraform")

HOSTILE = [
    "$(id)", "$(touch /tmp/pwned)", "`id`", "'", '"', "a'b", 'a"b', "'; id; echo '",
    "a\nb", "\nNGINX_CONF\n", "x\nEOF\ny", "\nEND\n", "a\rb", "a\tb", "a b", "",
    "{{ 7 * 7 }}", "{% raw %}", "{% endraw %}{{ stack }}", "{# c #}",
    '${file("/etc/passwd")}', "%{ if true }x%{ endif }", "$${x}", "$$${x}", "${TfToken[TOKEN.1]}",
    "a$", "%", "$HOME", "${HOME}", "\\", "\\n", ";", "| cat", "&& id", "# c", "!!", "*", "?",
    "~", "<x>", "{", "}", "-x", "--help", "--model=evil", "-", "\x00", "a\x00b", "\x1b[31m",
    "ünï", "a\u2028b", "../../etc/passwd", "/etc/passwd", "a" * 200_000,
    "vllm/vllm-tpu:nightly\nEOF", "org/name --trust-remote-code",
]

# Every string setting: where it lives in the TOML, and the name its messages use.
STRING_SETTINGS: dict[str, tuple[str, ...]] = {
    "gcp.project": ("gcp", "project"),
    "gcp.zone": ("gcp", "zone"),
    "gcp.network": ("gcp", "network"),
    "gcp.tpu_api_endpoint": ("gcp", "tpu_api_endpoint"),
    "tpu.accelerator_type": ("tpu", "accelerator_type"),
    "tpu.runtime_version": ("tpu", "runtime_version"),
    "vllm.model": ("vllm", "model"),
    "vllm.image": ("vllm", "image"),
    "vllm.kv_cache_dtype": ("vllm", "kv_cache_dtype"),
    "vllm.tool_call_parser": ("vllm", "tool_call_parser"),
    "vllm.reasoning_parser": ("vllm", "reasoning_parser"),
    "vllm.shm_size": ("vllm", "shm_size"),
    "vllm.dtype": ("vllm", "dtype"),
    "access.proxy_image": ("access", "proxy_image"),
    "access.api_source_ranges": ("access", "api_source_ranges", "[]"),
    "access.ssh_source_ranges": ("access", "ssh_source_ranges", "[]"),
    "capacity.model_geometry": ("capacity", "model_geometry"),
    "state.gcs_bucket": ("state", "gcs_bucket"),
    "state.gcs_prefix": ("state", "gcs_prefix"),
    "stack.max_run_duration": ("stacks", "flex", "max_run_duration"),
    "stack.valid_until_duration": ("stacks", "flex", "valid_until_duration"),
    "stacks.spot.provisioning_model": ("stacks", "spot", "provisioning_model"),
    "vllm.limit_mm_per_prompt": ("vllm", "limit_mm_per_prompt", "{}"),
    "vllm.env": ("vllm", "env", "{}"),
}
# Settings whose value the boot script carries, and the variable (or argv flag) holding it.
BASH_VARS = {"gcp.project": "PROJECT", "gcp.zone": "ZONE", "vllm.image": "IMAGE",
             "access.proxy_image": "PROXY_IMAGE", "vllm.shm_size": "SHM_SIZE"}
ARGV_FLAGS = {"vllm.model": None, "vllm.kv_cache_dtype": "--kv-cache-dtype",
              "vllm.tool_call_parser": "--tool-call-parser",
              "vllm.reasoning_parser": "--reasoning-parser"}
SCALARS = ("STACK", "PROJECT", "ZONE", "NODE", "HF_SECRET", "API_KEY_SECRET", "IMAGE",
           "PROXY_IMAGE", "SHM_SIZE", "CACHE_BUCKET", "CACHE_KEY", "NGINX_CONF_TEXT")
ARRAYS = ("VLLM_ENV", "VLLM_CMD")


def _raw_with(setting: str, value: str) -> dict[str, Any]:
    raw = copy.deepcopy(BASE)
    *where, key = STRING_SETTINGS[setting]
    if key in ("[]", "{}"):  # a list's element, a table's key
        *where, key = where
        value = [value] if key.endswith("ranges") else {value: 1}  # type: ignore[assignment]
    table = raw
    for part in where:
        table = table.setdefault(part, {})
    table[key] = value
    return raw


def _expected_settings(d: Deployment) -> dict[str, Any]:
    ctx = startup_context(d)
    out: dict[str, Any] = {name: str(ctx[name.lower()]) for name in SCALARS
                           if name.lower() in ctx}
    out["NODE"] = ctx["node_name"]
    out["HF_SECRET"] = ctx["hf_secret"]
    out["NGINX_CONF_TEXT"] = ctx["nginx_conf"].rstrip("\n")
    out["VLLM_ENV"] = [f"{k}={v}" for k, v in ctx["container_env"].items()]
    out["VLLM_CMD"] = vllm_command(d)
    return out


def _settings_block(script: str) -> str:
    return script[script.index("# --- settings"):script.index("# --- end settings ---")]


def _bash_settings(scripts: list[str], tmp: Path) -> list[dict[str, Any]]:
    """Run each script's settings block alone, in one bash (a subshell each); every variable's
    words as bash has them."""
    show = "".join(f'printf "%s\\0" "${{{n}:-}}"\n' for n in SCALARS)
    show += "".join(f'printf "%s\\0" "${{#{n}[@]}}" "${{{n}[@]}}"\n' for n in ARRAYS)
    program = ["set -u"]
    for i, script in enumerate(scripts):
        block = _settings_block(script)
        program.append(f"(\nset -eu\n{block}\n{show}) >out.{i} || echo {i} >>failed\n")
    subprocess.run(["bash", "-s"], input="\n".join(program).encode(), cwd=tmp, check=True)
    assert not (tmp / "failed").exists(), (tmp / "failed").read_text()
    results = []
    for i in range(len(scripts)):
        words = (tmp / f"out.{i}").read_bytes().decode().split("\0")[:-1]
        out: dict[str, Any] = dict(zip(SCALARS, words, strict=False))
        rest = words[len(SCALARS):]
        for name in ARRAYS:
            n = int(rest[0])
            out[name], rest = rest[1:1 + n], rest[1 + n:]
        results.append(out)
    return results


def _directives(conf: str) -> list[str]:
    """nginx directives in order, comments dropped, whitespace normalised."""
    code = re.sub(r"#[^\n]*", "", conf)
    return [" ".join(s.split()) for s in re.split(r"[;{}]", code) if s.strip()]


# ------------------------------------------------------------------ table 1: the real loader
@functools.cache
def outcomes() -> list[tuple[str, str, list[str], dict[str, Deployment]]]:
    """Computed on first use, not at import: every xdist worker imports this module to collect
    it, and only the worker that runs these tests should pay the ~1,300 validations."""
    out = []
    for setting in STRING_SETTINGS:
        for value in HOSTILE:
            deployments, problems = validate(_raw_with(setting, value))
            out.append((setting, value, problems, deployments))
    return out


def accepted() -> list[tuple[str, str, dict[str, Deployment]]]:
    return [(s, v, ds) for s, v, problems, ds in outcomes() if not problems]


@pytest.mark.parametrize("setting", list(STRING_SETTINGS))
def test_each_hostile_value_is_refused_naming_the_setting_or_accepted(setting: str) -> None:
    name = setting.removeprefix("stacks.spot.")
    for s, value, problems, _ in outcomes():
        if s != setting or not problems:
            continue
        assert all(name in p for p in problems), (value[:80], problems)
        # A message shows at most ~80 characters of a value, escaped: never a 200 KB line,
        # never a raw newline or escape sequence reaching the terminal.
        assert all(len(p) < 2000 and "\n" not in p and "\x1b" not in p for p in problems)


def test_every_hostile_value_but_an_empty_parser_is_refused() -> None:
    # TOML has no null: "" is how a parser is switched off, and it reaches no artefact.
    got = sorted((s, v) for s, v, _ in accepted())
    assert got == [("vllm.reasoning_parser", ""), ("vllm.tool_call_parser", "")]
    for _, _, ds in accepted():
        assert "--tool-call-parser" not in vllm_command(ds["spot"]) or (
            "--reasoning-parser" not in vllm_command(ds["spot"]))


# ------------------------------------------------------------------ table 2: past validation
def _bypass(d: Deployment, setting: str, value: str) -> Deployment:
    section, field = setting.split(".")
    return d.model_copy(update={section: getattr(d, section).model_copy(update={field: value})})


# NUL cannot be held by a bash variable nor a Terraform string: only validation guards it
# (table 1 shows it refused everywhere).
BYPASS_VALUES = [v for v in HOSTILE if "\x00" not in v]
BYPASS_SETTINGS = [*BASH_VARS, *ARGV_FLAGS]


@pytest.fixture(scope="module")
def landed(deployments: dict[str, Deployment]) -> list[tuple[str, str, Deployment]]:
    """(setting, value, deployment) that must land literally: accepted ones and bypassed ones."""
    spot = deployments["spot"]
    cases = [(s, v, ds["spot"]) for s, v, ds in accepted() if "spot" in ds]
    cases += [(setting, value, _bypass(spot, setting, value))
              for setting in BYPASS_SETTINGS for value in BYPASS_VALUES]
    return cases


def test_the_settings_block_holds_each_value_literally(landed, tmp_path: Path) -> None:
    refused, cases = 0, []
    for setting, value, d in landed:
        try:
            cases.append((setting, value, _expected_settings(d), render_startup(d)))
        except ValueError as exc:  # the renderer's own refusal: a leading dash in argv
            assert setting in str(exc) and value.startswith("-"), (setting, value[:80])
            refused += 1
    assert refused  # "-x", "--help" ... reached the renderer and were refused there
    results = _bash_settings([script for *_, script in cases], tmp_path)
    for (setting, value, expected, _), got in zip(cases, results, strict=True):
        assert got == {k: expected[k] for k in got}, (setting, value[:80])
        if setting in BASH_VARS:
            assert got[BASH_VARS[setting]] == value
    assert not (tmp_path / "pwned").exists() and not Path("/tmp/pwned").exists()


def test_vllm_argv_is_unchanged_apart_from_the_value(landed, deployments) -> None:
    default = vllm_command(deployments["spot"])
    for setting, value, d in landed:
        if setting not in ARGV_FLAGS or (value.startswith("-")):
            continue
        if value == "" and setting.endswith("parser"):
            continue  # an empty parser is "off" after validation; bypassed, it drops the flag
        argv = vllm_command(d)
        assert len(argv) == len(default), (setting, value[:80])
        diff = [i for i, (a, b) in enumerate(zip(argv, default, strict=True)) if a != b]
        flag = ARGV_FLAGS[setting]
        at = 2 if flag is None else default.index(flag) + 1
        assert diff in ([at], []) and argv[at] == value, (setting, value[:80])


def _nginx_t(conf: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    """`nginx -t` on the rendered file. The node's paths (user nginx, the key include under
    /etc/nginx/tpuserve) exist only in a private mount namespace: nothing on this machine
    changes."""
    etc = tmp / "etc-nginx"
    (etc / "tpuserve").mkdir(parents=True, exist_ok=True)
    (etc / "tpuserve" / "api-key.conf").write_text(
        'if ($http_authorization != "Bearer k") { return 401; }\n')
    # The default serves TLS: a throwaway certificate where the node's boot writes its own.
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-days", "1", "-subj", "/CN=t",
                    "-keyout", str(etc / "tpuserve" / "tls-key.pem"),
                    "-out", str(etc / "tpuserve" / "tls-cert.pem")],
                   check=True, capture_output=True)
    for name, line in (("passwd", "nginx:x:101:101::/nonexistent:/usr/sbin/nologin"),
                       ("group", "nginx:x:101:")):
        (tmp / name).write_text(Path(f"/etc/{name}").read_text() + line + "\n")
    (tmp / "nginx.conf").write_text(conf)
    script = (f"mount --bind {tmp}/passwd /etc/passwd && mount --bind {tmp}/group /etc/group"
              f" && mkdir -p /etc/nginx && mount --bind {etc} /etc/nginx"
              f" && exec {NGINX} -t -q -e stderr -p {tmp}/ -c {tmp}/nginx.conf")
    return subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True,
                          text=True, check=False)


def test_nginx_config_holds_no_config_value(landed, deployments, tmp_path: Path) -> None:
    default = startup_context(deployments["spot"])["nginx_conf"]
    for setting, value, d in landed:
        try:
            conf = startup_context(d)["nginx_conf"]
        except ValueError:
            continue  # refused by the renderer (leading dash), checked above
        assert conf == default, (setting, value[:80])
    assert _directives(default)[:4] == ["user nginx", "worker_processes auto",
                                        "pid /var/run/nginx.pid", "error_log /dev/stderr warn"]
    if NGINX is None or shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("nginx -t needs Debian's nginx (apt-get install -y nginx), unshare and root")
    proc = _nginx_t(default, tmp_path)
    if "unshare" in proc.stderr and proc.returncode:
        pytest.skip(f"no private mount namespace here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(TERRAFORM is None, reason="terraform is not installed")
def test_terraform_evaluates_every_value_to_the_literal(landed, tmp_path: Path) -> None:
    """One apply: each value, and a boot script carrying it, as outputs. A value holding
    cdktf's own token marker cannot be literal in any cdktf string (cdktf reads it as a
    token): only validation guards it, and table 1 shows it refused."""
    values: dict[str, str] = {}
    seen: set[str] = set()
    for setting, value, d in landed:
        if "TfToken[" in value or value in seen:
            continue
        seen.add(value)
        values[f"v{len(seen)}"] = value
        if setting in BASH_VARS and len(value) < 1000:
            # The settings block: the only part of the script a config value reaches (the rest
            # is the same text for every value; tests/stacks/test_terraform_strings.py applies it
            # whole). Terraform takes ~1.7 s per 38 KB script, so 50 whole scripts would not do.
            values[f"s{len(seen)}"] = _settings_block(render_startup(d))
    outputs = {k: {"value": escape_literals(v)} for k, v in values.items()}
    # A "$" right before a reference: written as an expression, so it stays a "$".
    outputs["dollar_ref"] = {"value": escape_literals("a$${TfToken[TOKEN.1]}").replace(
        "${TfToken[TOKEN.1]}", "${path.module}")}
    values["dollar_ref"] = "a$."
    got = apply_outputs({k: o["value"] for k, o in outputs.items()}, tmp_path)
    assert got == values


def test_no_template_writes_a_value_into_a_comment_or_a_heredoc() -> None:
    """A newline in a value would end a comment; a value holding the terminator a heredoc."""
    for template in sorted((REPO_ROOT / "templates").rglob("*.j2")):
        rendered_part = re.sub(r"{% raw %}.*?{% endraw %}", "", template.read_text(),
                               flags=re.DOTALL)
        for line in rendered_part.splitlines():
            if "#" in line:
                assert "{{" not in line[line.index("#"):], f"{template.name}: {line}"
            assert "<<" not in line, f"{template.name}: a heredoc around values: {line}"
