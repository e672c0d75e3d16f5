"""Images that exist, flags they accept: every third-party image of the bundle is `repo:tag@
sha256:...` at the tag its manifest and args come from, and every flag the bundle passes to the
endpoint picker and the custom-metrics adapter is one their source at that tag defines and
does not refuse (vendor/upstream_flags.json, extracted by tools/extract_flags.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tpuserve.paths import REPO_ROOT
from tpuserve.render import fleet_bundle as fb
from tpuserve.settings import ConfigError, from_raw
from tpuserve.settings.fleet import ADAPTER_IMAGE_TAG, PICKER_IMAGE_TAG, PLACEHOLDER_DIGEST

from .conftest import fleet_raw

PINNED = re.compile(r"[a-z0-9.\-/]+:[\w.\-]+@sha256:[0-9a-f]{64}")


def containers(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for o in objects:
        if o["kind"] in ("Deployment", "Job"):
            spec = o["spec"]["template"]["spec"]
            for c in spec.get("initContainers", []) + spec["containers"]:
                out[f'{o["metadata"]["name"]}/{c["name"]}'] = c
    return out


def picker(objects) -> dict[str, Any]:
    return containers(objects)[f"{fb.EPP}/epp"]


def adapter(objects) -> dict[str, Any]:
    return containers(objects)[f"{fb.ADAPTER_DEPLOYMENT}/pod-custom-metrics-stackdriver-adapter"]


def test_the_picker_runs_v1_5_0s_epp_with_exactly_the_charts_args(objects) -> None:
    c = picker(objects)
    assert c["image"].startswith(PICKER_IMAGE_TAG + "@sha256:")
    assert PICKER_IMAGE_TAG.endswith("/epp:v1.5.0")
    # config/charts/inferencepool @ v1.5.0, default values, release `vllm` in `tpuserve`.
    assert c["args"] == ["--pool-name", "vllm", "--pool-namespace", "tpuserve",
                         "--pool-group", "inference.networking.k8s.io",
                         "--zap-encoder", "json", "--config-file",
                         "/config/default-plugins.yaml", "--v", "1", "--tracing=false"]


def test_every_flag_the_bundle_passes_is_accepted_at_the_pinned_tag(objects) -> None:
    data = fb.upstream_flags()
    for program, argv in (("picker", picker(objects)["args"]),
                          ("adapter", adapter(objects)["command"][1:])):
        spec = data[program]
        names = fb.flag_names(argv, set(spec["bool_flags"]))
        assert names, program
        for name in names:
            assert name in spec["flags"], (program, name)
            assert name not in spec["deprecated"], (program, name)
            assert name not in spec["refused_when_set"], (program, name)


@pytest.mark.parametrize(("program", "argv", "words"), [
    ("picker", ["--kv-cache-usage-percentage-metric", "vllm:kv_cache_usage_perc"],
     ("--kv-cache-usage-percentage-metric is deprecated at kubernetes-sigs/"
      "gateway-api-inference-extension v1.5.0")),
    ("picker", ["--model-server-metrics-port", "8080"], "is deprecated"),
    ("picker", ["--no-such-flag", "x"], "--no-such-flag is not a flag of epp"),
    ("adapter", ["--use-new-resource-model=true", "--v=2"], "--v is not a flag of custom-"),
])
def test_a_flag_the_program_lacks_or_refuses_stops_the_render(program, argv, words) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        fb.check_flags(program, argv)


def test_the_renderer_checks_the_pickers_args(monkeypatch) -> None:
    from .conftest import fleet_deployment

    monkeypatch.setattr(fb, "epp_args", lambda: ["--pool-name", "vllm",
                                                 "--kv-cache-usage-percentage-metric", "m"])
    with pytest.raises(ValueError, match="deprecated"):
        fb.render_objects(fleet_deployment())


def test_the_flag_data_records_its_sources_commits() -> None:
    data = fb.upstream_flags()
    assert data["picker"]["sources"][0]["ref"] == "v1.5.0"
    assert data["picker"]["sources"][0]["commit"] == "df9f8909fe06fe2dfd4a6fc0bd0c01a0acabf849"
    assert data["adapter"]["sources"][0]["commit"].startswith("af49d863755c")
    for program in ("picker", "adapter"):
        for src in data[program]["sources"]:
            assert re.fullmatch(r"[0-9a-f]{40}", src["commit"]), src
    # The refusal rule read from Validate(): the metric flags, the one v1.4.0 on stop at.
    assert "kv-cache-usage-percentage-metric" in data["picker"]["refused_when_set"]


def test_every_third_party_image_is_pinned_by_tag_and_digest(objects) -> None:
    for where, c in containers(objects).items():
        assert PINNED.fullmatch(c["image"]), (where, c["image"])


def test_the_adapter_is_v0_16_9_gke_0_from_its_manifest(objects) -> None:
    c = adapter(objects)
    assert c["image"].startswith(ADAPTER_IMAGE_TAG + "@sha256:")
    assert ADAPTER_IMAGE_TAG.endswith(":v0.16.9-gke.0")
    assert c["command"] == ["/adapter", "--use-new-resource-model=true",
                            "--fallback-for-container-metrics=true"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/healthz"


def test_the_defaults_carry_the_placeholder_until_the_user_sets_the_digest(fleet) -> None:
    assert fleet.fleet.picker_image == f"{PICKER_IMAGE_TAG}@{PLACEHOLDER_DIGEST}"
    assert fleet.fleet.adapter_image == f"{ADAPTER_IMAGE_TAG}@{PLACEHOLDER_DIGEST}"


@pytest.mark.parametrize("value", [
    "registry.k8s.io/gateway-api-inference-extension/epp:v1.6.0@sha256:" + "ab" * 32,
    PICKER_IMAGE_TAG,
    f"registry.k8s.io/gateway-api-inference-extension/epp@sha256:{'ab' * 32}",
])
def test_a_picker_image_at_another_tag_or_without_a_digest_is_refused(value) -> None:
    with pytest.raises(ConfigError, match=re.escape("fleet.picker_image = ")):
        from_raw(fleet_raw(picker_image=value))


def test_the_proxy_image_default_is_pinned_for_every_stack() -> None:
    from tpuserve.settings.sections import PROXY_IMAGE, AccessSettings

    assert AccessSettings().proxy_image == PROXY_IMAGE
    assert PINNED.fullmatch(PROXY_IMAGE)
    assert PROXY_IMAGE.startswith("nginx:1.30.5-alpine@sha256:0985e772fb9f")
    deployments = from_raw(fleet_raw()).deployments
    assert {d.access.proxy_image for d in deployments.values()} == {PROXY_IMAGE}


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e",
                        "HOME": str(cwd), "PATH": "/usr/bin:/bin"})


def test_the_extractor_reads_flags_deprecations_and_refusals_from_source(tmp_path) -> None:
    """tools/extract_flags.py over a checkout laid out like the three upstreams."""
    repo = tmp_path / "src"
    files = {
        "pkg/epp/server/options.go": '''
	fs.IntVar(&opts.GRPCPort, "grpc-port", opts.GRPCPort, "gRPC port.")
	fs.BoolVar(&opts.Tracing, "tracing", opts.Tracing, "Enables emitting traces.")
	fs.StringVar(&opts.KV, "kv-metric", opts.KV,
		"Prometheus metric.")
	_ = fs.MarkDeprecated("kv-metric", "use engineConfigs instead")
	deprecatedMetricFlags := []string{
		"kv-metric",
	}
''',
        "pkg/common/observability/logging/options.go":
            '\tfs.IntVarP(&opts.LogVerbosity, "v", "v", opts.LogVerbosity, "")\n',
        "pkg/log/zap/zap.go": 'func (o *Options) BindFlags(fs *flag.FlagSet) {\n'
            '\tfs.BoolVar(&o.Development, "zap-devel", o.Development, "")\n'
            '\tfs.Var(&encVal, "zap-encoder", "Zap log encoding")\n}\n',
        "custom-metrics-stackdriver-adapter/adapter.go":
            '\tflags.BoolVar(&serverOptions.X, "use-new-resource-model", true, "")\n',
    }
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "x")
    _git(repo, "tag", "v9")
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "extract_flags.py"), "--gaie", str(repo),
         "--gaie-ref", "v9", "--controller-runtime", str(repo), "--controller-runtime-ref",
         "v9", "--stackdriver", str(repo), "--stackdriver-ref", "v9"],
        check=True, capture_output=True, text=True).stdout
    import json

    data = json.loads(out)
    assert data["picker"]["flags"] == {"grpc-port": "int", "kv-metric": "string",
                                       "tracing": "bool", "v": "int", "zap-devel": "bool",
                                       "zap-encoder": "value"}
    assert data["picker"]["deprecated"] == {"kv-metric": "use engineConfigs instead"}
    assert data["picker"]["refused_when_set"] == ["kv-metric"]
    assert data["adapter"]["flags"] == {"use-new-resource-model": "bool"}
    assert re.fullmatch(r"[0-9a-f]{40}", data["picker"]["sources"][0]["commit"])
