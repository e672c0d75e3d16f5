"""The rendered boot script as text: bash syntax, shellcheck, quoting, what it reads and records.

The script is run for real in tests/render/boot/; here it is rendered and inspected, and its
parts (templates/boot/*.sh.j2) are run alone where a function can be.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.render.boot.support import cache_object
from tpuserve import contracts, facts
from tpuserve.ops import boot_phases
from tpuserve.paths import REPO_ROOT, TEMPLATE_DIR
from tpuserve.render.boot_script import (
    BOOT_HELPER_PARTS,
    CACHE_GET_MAX_S,
    CACHE_OBJECT_PREFIX,
    GUEST_ATTRIBUTE_KEYS,
    GUEST_ATTRIBUTE_NAMESPACE,
    READY_TIMEOUT_S,
    _env,
    boot_helper_text,
    render_startup,
    startup_context,
    vllm_command,
)
from tpuserve.render.proxy_conf import NODE_LAYOUT, render_nginx_conf
from tpuserve.settings import Deployment

SHELLCHECK = Path(sys.executable).parent / "shellcheck"
RUFF = Path(sys.executable).parent / "ruff"
# The environment the script may read: Google's own override names, the one path prefix, the
# test-only time knobs, and bash's own variables. Anything else would be an undocumented input.
ALLOWED_ENV = {
    "GCE_METADATA_HOST", "CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER",
    "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE", "TPUSERVE_ROOT", "TPUSERVE_TIME_SCALE",
}
BASH_VARS = {"EPOCHREALTIME", "EPOCHSECONDS", "EUID", "BASH_REMATCH"}


def _with(d: Deployment, **sections: dict[str, object]) -> Deployment:
    return d.model_copy(update={
        name: getattr(d, name).model_copy(update=values) for name, values in sections.items()
    })


@pytest.fixture(scope="module")
def variants(deployments: dict[str, Deployment]) -> dict[str, Deployment]:
    spot = deployments["spot"]
    return {
        **deployments,
        "no-proxy": _with(spot, access={"api_key_proxy": False}),
        "no-cache": _with(spot, cache={"enabled": False}),
        "no-guard": _with(spot, stack={"max_run_hours": 0}),
        "odd-values": _with(spot, vllm={
            "model": "org/model$(touch pwned)`id`",
            "tool_call_parser": "x'; touch /tmp/pwned; echo '",
        }),
    }


@pytest.fixture(scope="module")
def rendered(variants: dict[str, Deployment], tmp_path_factory: pytest.TempPathFactory,
             ) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("startup")
    paths = {}
    for name, d in variants.items():
        paths[name] = out / f"{name}.sh"
        paths[name].write_text(render_startup(d))
    return paths


def _code(script: Path) -> str:
    """The script without its comment lines."""
    return "\n".join(line for line in script.read_text().splitlines()
                     if not line.lstrip().startswith("#"))


def _assigned(code: str) -> set[str]:
    """Upper-case names the script sets: NAME=... words leading a command, read -r, for."""
    names: set[str] = set()
    for line in code.splitlines():
        for word in line.split():
            if m := re.fullmatch(r"([A-Z][A-Z0-9_]*)\+?=.*", word):
                names.add(m[1])
            elif word not in ("local", "export", "-a"):
                break
    for group in re.findall(r"\bread -r ([A-Z_ ]+)", code):
        names.update(group.split())
    names.update(re.findall(r"\bfor ([A-Z_]+) in", code))
    return names


def _settings(script: Path, expr: str) -> list[str]:
    """Evaluate the script's settings block alone in bash and print EXPR's words."""
    text = script.read_text()
    block = text[text.index("# --- settings"):text.index("# --- end settings ---")]
    proc = subprocess.run(
        ["bash", "-c", f"set -eu\n{block}\nprintf '%s\\0' {expr}"],
        capture_output=True, text=True, check=True, cwd=script.parent,
    )
    return proc.stdout.split("\0")[:-1]


def test_every_variant_passes_bash_n(rendered: dict[str, Path]) -> None:
    for name, path in rendered.items():
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True,
                              check=False)
        assert proc.returncode == 0, f"{name}: {proc.stderr}"


def test_shellcheck_passes(rendered: dict[str, Path]) -> None:
    # The other variants differ only in values of the settings block; shellcheck takes ~1 s
    # a file, so it checks the structural ones, in parallel.
    procs = {
        name: subprocess.Popen([str(SHELLCHECK), "--shell=bash", str(rendered[name])],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for name in ("spot", "no-proxy", "odd-values")
    }
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{name}:\n{out}"


def test_the_script_is_strict_bash(rendered: dict[str, Path]) -> None:
    text = rendered["spot"].read_text()
    assert text.startswith("#!/bin/bash\n")
    assert "\nset -euo pipefail\n" in text


def test_settings_evaluate_to_the_config_values(
    rendered: dict[str, Path], variants: dict[str, Deployment],
) -> None:
    for name in ("spot", "no-proxy", "odd-values"):
        d = variants[name]
        ctx = startup_context(d)
        assert _settings(rendered[name], '"${VLLM_CMD[@]}"') == vllm_command(d), name
        got = _settings(rendered[name], '"$PROJECT" "$ZONE" "$NODE" "$IMAGE" "$CACHE_KEY" '
                                        '"$API_KEY_SECRET" "$CACHE_BUCKET" "$CACHE_PREFIX"')
        assert got == [d.gcp.project, d.gcp.zone, d.node_name, d.vllm.image, ctx["cache_key"],
                       ctx["api_key_secret"], ctx["cache_bucket"], CACHE_OBJECT_PREFIX]


def test_the_boot_budgets_follow_the_measured_boots(rendered: dict[str, Path]) -> None:
    # A cache restore may never cost what a warm boot saves; vLLM gets well over a cold boot.
    assert CACHE_GET_MAX_S < facts.COLD_START_S - facts.WARM_START_S
    assert READY_TIMEOUT_S > 2 * facts.COLD_START_S
    got = _settings(rendered["spot"], '"$CACHE_GET_MAX_S" "$READY_TIMEOUT"')
    assert got == [str(CACHE_GET_MAX_S), str(READY_TIMEOUT_S)]


def test_hostile_config_values_stay_words(rendered: dict[str, Path], tmp_path: Path) -> None:
    cmd = _settings(rendered["odd-values"], '"${VLLM_CMD[@]}"')
    assert "org/model$(touch pwned)`id`" in cmd
    assert "x'; touch /tmp/pwned; echo '" in cmd
    assert not (rendered["odd-values"].parent / "pwned").exists()


def test_the_hf_token_is_a_mounted_file_never_an_env_value(
    rendered: dict[str, Path], variants: dict[str, Deployment],
) -> None:
    text = rendered["spot"].read_text()
    assert "HF_TOKEN=" not in _code(rendered["spot"])
    assert _settings(rendered["spot"], '"${VLLM_ENV[@]}"') == [
        "HF_HOME=/dev/shm", "HF_TOKEN_PATH=/run/secrets/hf_token"]
    assert '-v "$SECRETS_DIR/hf_token:$CONTAINER_TOKEN_PATH:ro"' in text
    assert "--restart unless-stopped" in text
    # The access token reaches curl on stdin, never in argv.
    assert '-K - "$@" "$url"' in text


def test_only_documented_environment_is_read(rendered: dict[str, Path]) -> None:
    text = rendered["spot"].read_text()
    code = _code(rendered["spot"])
    referenced = set(re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", code))
    assert referenced - _assigned(code) - BASH_VARS == ALLOWED_ENV
    for name in ALLOWED_ENV:
        assert name in text.split("set -euo pipefail")[0], f"{name} is not documented"


def test_the_header_documents_every_guest_attribute_written(rendered: dict[str, Path]) -> None:
    text = rendered["spot"].read_text()
    header = text.split("set -euo pipefail")[0]
    # One namespace, facts.py's, rendered into the settings block; the header names the variable.
    assert GUEST_ATTRIBUTE_NAMESPACE == contracts.GUEST_ATTRIBUTE_NAMESPACE == boot_phases.NAMESPACE
    assert _settings(rendered["spot"], '"$GA_NAMESPACE"') == [contracts.GUEST_ATTRIBUTE_NAMESPACE]
    assert "namespace GA_NAMESPACE" in header
    assert 'guest-attributes/$GA_NAMESPACE"' in text
    assert "guest-attributes/tpuserve" not in text  # not hard-coded anywhere else
    code = _code(rendered["spot"])
    written = set(re.findall(r"\bphase ([a-z_]+) ", code)) | set(
        re.findall(r"\bga ([a-z_]+) ", code))
    assert written == set(GUEST_ATTRIBUTE_KEYS)
    for key in GUEST_ATTRIBUTE_KEYS:
        assert re.search(rf"^#   {key} ", header, re.MULTILINE), f"{key} is not documented"


def test_the_proxy_config_is_embedded_and_holds_no_key(
    rendered: dict[str, Path], variants: dict[str, Deployment],
) -> None:
    conf = "\n".join(_settings(rendered["spot"], '"$NGINX_CONF_TEXT"'))
    assert conf + "\n" == render_nginx_conf(public_port=8000, backend_port=8001, tls=True)
    assert "listen 8000 ssl;" in conf  # access.tls = "self-signed", the default
    assert "server 127.0.0.1:8001;" in conf
    assert "location = /health" not in conf  # the open request is judged on the raw target
    assert "include /etc/nginx/tpuserve/api-key.conf;" in conf
    # The boot mounts the key rule and the TLS files where the config reads them.
    got = _settings(rendered["spot"], '"$PROXY_KEY_PATH" "$PROXY_CERT_PATH" '
                                      '"$PROXY_TLS_KEY_PATH" "$TLS"')
    assert got == [NODE_LAYOUT.key_include, NODE_LAYOUT.tls_cert, NODE_LAYOUT.tls_key,
                   "self-signed"]
    assert "proxy_set_header Authorization \"\";" in conf
    assert "$http_authorization" not in conf  # the key rule is the include's, in the tmpfs
    assert _settings(rendered["no-proxy"], '"$NGINX_CONF_TEXT" "$API_KEY_SECRET"') == ["", ""]


def test_without_the_proxy_vllm_listens_on_the_public_port(variants: dict[str, Deployment],
                                                           ) -> None:
    assert vllm_command(variants["no-proxy"])[-4:] == ["--host", "0.0.0.0", "--port", "8000"]
    assert vllm_command(variants["spot"])[-4:] == ["--host", "127.0.0.1", "--port", "8001"]


def test_the_node_never_calls_the_tpu_api(rendered: dict[str, Path]) -> None:
    """The billing guard lives off the node: no script can delete a node."""
    for name, path in rendered.items():
        text = path.read_text()
        assert "tpu.googleapis.com" not in text and "OVERRIDES_TPU" not in text, name
        assert "DELETE" not in text and "MAX_RUN_SECONDS" not in text, name


def test_the_cache_key_follows_the_argv_and_the_bucket_switch(
    variants: dict[str, Deployment],
) -> None:
    spot = variants["spot"]
    key = startup_context(spot)["cache_key"]
    assert startup_context(_with(spot, vllm={"max_model_len": 16384}))["cache_key"] != key
    assert startup_context(_with(spot, tpu={"runtime_version": "v2-alpha-tpuv5"}))[
        "cache_key"] != key
    assert startup_context(variants["no-cache"])["cache_bucket"] == ""
    assert startup_context(spot)["cache_bucket"] == spot.cache_bucket


def _parts(*names: str) -> str:
    """Parts of the script (templates/boot/NAME.sh.j2), as rendered: plain bash functions."""
    return "".join(_env.get_template(f"boot/{name}.sh.j2").render() for name in names)


def test_the_image_digest_completes_the_cache_key(tmp_path: Path) -> None:
    """The script's own image_identity and cache_select (the only place the image's part is
    added to the config's key), run alone against a stub docker: the object named is the one
    the tests expect (support.cache_object), and an unusable digest fails the boot."""
    digest = "sha256:0123456789ab" + "f" * 52
    key = "3f0930acff858cd0"
    stubs = (
        'log() { :; }\nfail() { echo "FAIL $*"; exit 1; }\n'
        'docker() { printf "%s\\n" "$INSPECT"; }\n'
    )
    program = (_parts("containers", "cache") + stubs
               + 'CACHE_KEY=$1 CACHE_PREFIX=$2 CACHE_ROOT=/c\n'
               'image_identity vllm/vllm-tpu:nightly\ncache_select "$IMAGE_HASH"\n'
               'printf "%s\\n" "$CACHE_OBJECT" "$CACHE_ID" "$RUN_IMAGE"\n')
    script = tmp_path / "parts.sh"
    script.write_text(program)

    def run(inspect: str) -> list[str]:
        proc = subprocess.run(["bash", str(script), key, CACHE_OBJECT_PREFIX], text=True,
                              capture_output=True, check=False,
                              env={"INSPECT": inspect, "PATH": "/usr/bin:/bin"})
        return proc.stdout.splitlines()

    other = "sha256:" + "e" * 64
    pulled = run(f"sha256:{'a' * 64} other/repo@{other} vllm/vllm-tpu@{digest}")
    assert pulled == [cache_object(key, f"vllm/vllm-tpu@{digest}"),
                      f"{key}-0123456789ab", f"vllm/vllm-tpu@{digest}"]
    assert pulled[0] == f"{CACHE_OBJECT_PREFIX}{key}-0123456789ab.tar.gz"
    built = run(digest)  # an image id, no repo digest
    assert built[0] == cache_object(key, digest) == pulled[0] and built[2] == digest
    for bad in ("vllm/vllm-tpu:nightly", "sha256:0123", "sha256:../../etc/passwd"):
        with pytest.raises(ValueError, match="expected"):
            cache_object(key, bad)
        assert run(bad)[-1].startswith("FAIL image vllm/vllm-tpu:nightly: no usable digest"), bad


def test_the_guest_attribute_keys_are_one_list() -> None:
    """The renderer, its tests and the CLI's reader share render/node_metadata's list; the CLI's
    phases are those keys (less state and tls, and config and reconverge, which
    ops/served_config.py reads) with the off-node guard's after boot."""
    assert [k for k, _ in boot_phases.PHASES] == [
        "boot", "guard", "secret", "image", "cache", "container", "bypass_check", "metrics",
        "memory", "kv_cache", "startup_complete", "health", "cache_publish"]
    not_phases = {"state", "tls", "config", "reconverge"}
    assert {k for k, _ in boot_phases.PHASES} == set(GUEST_ATTRIBUTE_KEYS) - not_phases | {
        "guard"}
    from tpuserve.ops import served_config
    assert {served_config.CONFIG_KEY, served_config.RECONVERGE_KEY} == {"config", "reconverge"}


def test_the_helper_is_carried_verbatim_and_holds_no_config_value(
    rendered: dict[str, Path],
) -> None:
    helper = boot_helper_text()
    assert "{{" not in helper and "'" not in helper  # static, and held without quote escapes
    for name, path in rendered.items():
        got = _settings_and_helper(path)
        assert got == helper.rstrip("\n"), name


def test_the_helper_joined_from_its_parts_is_one_ruff_clean_program() -> None:
    # `ruff check .` skips the parts (alone, each names what another imports): the program the
    # node runs is checked whole here, under the repository's rules.
    for part in BOOT_HELPER_PARTS:
        assert part.read_text().endswith("\n"), f"{part}: the next part would join its last line"
    proc = subprocess.run(
        [str(RUFF), "check", "--no-cache", "--stdin-filename",
         str(TEMPLATE_DIR / "boot" / "boot_helper.py"), "-"],
        input=boot_helper_text(), capture_output=True, text=True, cwd=REPO_ROOT, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _settings_and_helper(script: Path) -> str:
    text = script.read_text()
    block = text[text.index("# --- settings"):text.index('\nROOT="')]  # lib starts there
    proc = subprocess.run(["bash", "-c", f"set -eu\n{block}\nprintf '%s' \"$BOOT_HELPER_PY\""],
                          capture_output=True, text=True, check=True)
    return proc.stdout
