"""Extract the command-line flags the fleet's third-party programs accept, from their source.

    python tools/extract_flags.py \
        --gaie PATH --gaie-ref v1.5.0 \
        --controller-runtime PATH --controller-runtime-ref v0.23.3 \
        --stackdriver PATH --stackdriver-ref af49d863755c0535f598cfde9288ae9a75251d38 \
        > templates/fleet/vendor/upstream_flags.json

Each PATH is a git checkout (or a bare clone) of, in order, kubernetes-sigs/
gateway-api-inference-extension (the endpoint picker, cmd/epp), kubernetes-sigs/controller-
runtime (the zap logging flags the picker binds, at the version the picker's go.mod names) and
GoogleCloudPlatform/k8s-stackdriver (custom-metrics-stackdriver-adapter); each REF a tag or
commit. Files are read with `git show REF:FILE`, so no work tree needs to be checked out.

What it reads (a flag the bundle passes must be found here; tests/render/fleet/
test_upstream_flags.py fails otherwise):
- picker: pkg/epp/server/options.go (every `fs.<Type>Var[P](&opts.X, "name", ...)`, every
  `fs.MarkDeprecated("name", ...)`, and the `deprecatedMetricFlags` list Validate() refuses
  when set), pkg/common/observability/logging/options.go (`-v`), and controller-runtime's
  pkg/log/zap/zap.go BindFlags (`zap-*`, added through AddGoFlagSet);
- adapter: custom-metrics-stackdriver-adapter/adapter.go (`flags.<Type>Var(...)`). The flags
  the adapter's base (sigs.k8s.io/custom-metrics-apiserver) and klog add are not extracted:
  the bundle passes none, and one it starts passing fails the test until extracted.

The output records each source's repository, ref and commit id.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from typing import Any

_VAR = re.compile(
    r'\b(?P<set>fs|flags)\.(?P<type>[A-Z][A-Za-z]*?)Var(?P<p>P?)\(\s*&[\w.]+,\s*"(?P<name>[^"]+)"')
_GO_VAR = re.compile(r'\bfs\.(?P<type>[A-Z][A-Za-z]*?)Var\(\s*&[\w.]+,\s*"(?P<name>[^"]+)"')
_GO_VALUE = re.compile(r'\bfs\.Var\(\s*&\w+,\s*"(?P<name>[^"]+)"')
_DEPRECATED = re.compile(r'MarkDeprecated\(\s*"(?P<name>[^"]+)",\s*"(?P<why>[^"]*)"')
_REFUSED_LIST = re.compile(r"deprecatedMetricFlags\s*:=\s*\[\]string\{(?P<body>[^}]*)\}")

GAIE_OPTIONS = "pkg/epp/server/options.go"
GAIE_LOGGING = "pkg/common/observability/logging/options.go"
CR_ZAP = "pkg/log/zap/zap.go"
ADAPTER_MAIN = "custom-metrics-stackdriver-adapter/adapter.go"


def git_show(path: str, ref: str, file: str) -> str:
    return subprocess.run(["git", "-C", path, "show", f"{ref}:{file}"], check=True,
                          capture_output=True, text=True).stdout


def commit_of(path: str, ref: str) -> str:
    return subprocess.run(["git", "-C", path, "rev-parse", f"{ref}^{{commit}}"], check=True,
                          capture_output=True, text=True).stdout.strip()


def _types(text: str, pattern: re.Pattern[str]) -> dict[str, str]:
    return {m.group("name"): m.group("type").lower() for m in pattern.finditer(text)}


def _go_bool_flags(text: str) -> list[str]:
    return sorted(n for n, t in _types(text, _VAR).items() if t == "bool")


def picker(gaie: str, gaie_ref: str, cr: str, cr_ref: str) -> dict[str, Any]:
    options = git_show(gaie, gaie_ref, GAIE_OPTIONS)
    logging = git_show(gaie, gaie_ref, GAIE_LOGGING)
    zap = git_show(cr, cr_ref, CR_ZAP)
    bind = zap[zap.index("func (o *Options) BindFlags"):]
    bind = bind[:bind.index("\n}\n")]
    flags = {**_types(options, _VAR), **_types(logging, _VAR), **_types(bind, _GO_VAR)}
    for m in _GO_VALUE.finditer(bind):
        flags[m.group("name")] = "value"
    refused = _REFUSED_LIST.search(options)
    if refused is None:
        raise SystemExit(f"{GAIE_OPTIONS}@{gaie_ref}: no deprecatedMetricFlags list: the "
                         "refusal rule moved; read Validate() and update this script")
    return {
        "program": "epp",
        "sources": [
            {"repository": "kubernetes-sigs/gateway-api-inference-extension", "ref": gaie_ref,
             "commit": commit_of(gaie, gaie_ref), "files": [GAIE_OPTIONS, GAIE_LOGGING]},
            {"repository": "kubernetes-sigs/controller-runtime", "ref": cr_ref,
             "commit": commit_of(cr, cr_ref), "files": [CR_ZAP]},
        ],
        "flags": dict(sorted(flags.items())),
        "bool_flags": sorted(n for n, t in flags.items() if t == "bool"),
        "deprecated": {m.group("name"): m.group("why")
                       for m in _DEPRECATED.finditer(options)},
        "refused_when_set": re.findall(r'"([^"]+)"', refused.group("body")),
    }


def adapter(sd: str, sd_ref: str) -> dict[str, Any]:
    main = git_show(sd, sd_ref, ADAPTER_MAIN)
    flags = _types(main, _VAR)
    return {
        "program": "custom-metrics-stackdriver-adapter",
        "sources": [{"repository": "GoogleCloudPlatform/k8s-stackdriver", "ref": sd_ref,
                     "commit": commit_of(sd, sd_ref), "files": [ADAPTER_MAIN]}],
        "flags": dict(sorted(flags.items())),
        "bool_flags": _go_bool_flags(main),
        "deprecated": {m.group("name"): m.group("why") for m in _DEPRECATED.finditer(main)},
        "refused_when_set": [],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools/extract_flags.py")
    p.add_argument("--gaie", required=True)
    p.add_argument("--gaie-ref", default="v1.5.0")
    p.add_argument("--controller-runtime", required=True)
    p.add_argument("--controller-runtime-ref", default="v0.23.3")
    p.add_argument("--stackdriver", required=True)
    p.add_argument("--stackdriver-ref", required=True)
    a = p.parse_args(argv)
    out = {
        "generated_by": "tools/extract_flags.py",
        "picker": picker(a.gaie, a.gaie_ref, a.controller_runtime, a.controller_runtime_ref),
        "adapter": adapter(a.stackdriver, a.stackdriver_ref),
    }
    json.dump(out, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
