"""`python -m tpuserve.kubectl apply|delete|preflight`: the fleet stack's provisioners.

The name is written into deployed stacks' Terraform, so it stays. This is the process (the
arguments, the environment of tpuserve.contracts, the exit codes); the bundle is read by
tpuserve.gcp.kube_bundle and applied by tpuserve.gcp.kubectl.

    python -m tpuserve.kubectl apply    # the bundle, server-side, as field manager `tpuserve`
    python -m tpuserve.kubectl delete   # what the bundle made, namespaces and CRDs last
    python -m tpuserve.kubectl preflight   # hashicorp/external: {"image": ...} on stdin

preflight runs at plan time (the fleet stack's `data.external.image_preflight`): an image
without a real digest fails the plan before the cluster or anything else is created, in one
line. apply checks again, for a stack synthesized before this check existed.

The cluster comes from $TPUSERVE_K8S_PROJECT, $TPUSERVE_K8S_LOCATION (its zone) and
$TPUSERVE_K8S_CLUSTER (or --project, --location, --cluster); the bundle (multi-document YAML)
from $TPUSERVE_K8S_BUNDLE_GZ, gzipped and base64-encoded (Terraform's base64gzip: Linux caps one
environment variable at 128 KiB), or --bundle-file. apply also reads the vLLM image
($TPUSERVE_K8S_IMAGE or --image) and refuses, before any call, one without a real digest.

Credentials: `gcloud container clusters get-credentials` writes into a private KUBECONFIG
(a temporary file of this run, removed after), never the user's ~/.kube/config. gcloud and
kubectl are found on PATH (gcloud ships kubectl: `gcloud components install kubectl`).
An error prints one line to stderr and exits 1 (bad input: 2); never a traceback.
"""


from __future__ import annotations

import argparse
import base64
import binascii
import gzip
import os
import sys
from collections.abc import Mapping, Sequence

from tpuserve import contracts, entry_point
from tpuserve.contracts import K8S_BUNDLE_GZ_ENV as ENV_BUNDLE_GZ
from tpuserve.contracts import K8S_CLUSTER_ENV as ENV_CLUSTER
from tpuserve.contracts import K8S_IMAGE_ENV as ENV_IMAGE
from tpuserve.contracts import K8S_LOCATION_ENV as ENV_LOCATION
from tpuserve.contracts import K8S_PROJECT_ENV as ENV_PROJECT
from tpuserve.gcp.kube_bundle import (
    KubectlError,
    check_image,
    placeholder_line,
    preflight,
)
from tpuserve.gcp.kubectl import Cluster, apply, delete
from tpuserve.settings.fleet import PLACEHOLDER_DIGEST


def decode_bundle(encoded: str) -> str:
    try:
        return gzip.decompress(base64.b64decode(encoded, validate=True)).decode()
    except (binascii.Error, OSError, EOFError, UnicodeDecodeError) as exc:
        raise KubectlError(f"${ENV_BUNDLE_GZ} is not a gzipped, base64-encoded bundle "
                           f"({exc})", 2) from None


def read_bundle(bundle_file: str | None, environ: Mapping[str, str]) -> str:
    if bundle_file:
        try:
            with open(bundle_file, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise KubectlError(f"cannot read the bundle {bundle_file}: {exc.strerror}",
                               2) from None
    elif environ.get(ENV_BUNDLE_GZ):
        text = decode_bundle(environ[ENV_BUNDLE_GZ])
    else:
        raise KubectlError(f"no bundle: set ${ENV_BUNDLE_GZ} or pass --bundle-file", 2)
    if not text.strip():
        raise KubectlError("the bundle is empty: nothing to apply", 2)
    return text



def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog=contracts.KUBECTL.prog)
    parser.add_argument("action", choices=contracts.KUBECTL.commands)
    parser.add_argument("--project", default=env.get(ENV_PROJECT, ""))
    parser.add_argument("--location", default=env.get(ENV_LOCATION, ""),
                        help="the cluster's zone")
    parser.add_argument("--cluster", default=env.get(ENV_CLUSTER, ""))
    parser.add_argument("--image", default=env.get(ENV_IMAGE))
    parser.add_argument("--bundle-file")
    args = parser.parse_args(argv)
    def body() -> int:
        if args.action == "preflight":
            print(preflight(sys.stdin.read()), flush=True)
            return 0
        if args.action == "apply":
            check_image(args.image)  # before anything else: no call with a wrong image
        bundle = read_bundle(args.bundle_file, env)
        if args.action == "apply" and PLACEHOLDER_DIGEST in bundle:
            raise KubectlError(placeholder_line(bundle), 2)
        for setting, value, name in (("project", args.project, ENV_PROJECT),
                                     ("location", args.location, ENV_LOCATION),
                                     ("cluster", args.cluster, ENV_CLUSTER)):
            if not value:
                raise KubectlError(f"no {setting}: set ${name} or pass --{setting}", 2)
        cluster = Cluster(args.project, args.location, args.cluster, env)
        if args.action == "apply":
            print(f"tpuserve: applied {apply(cluster, bundle)} objects to {cluster.name}",
                  flush=True)
        else:
            print(f"tpuserve: deleted the bundle's {delete(cluster, bundle)} objects from "
                  f"{cluster.name}", flush=True)
        return 0

    return entry_point.run(body, sys.stderr, failed=(KubectlError,),
                           exit_code=lambda exc: getattr(exc, "code", 1))


if __name__ == "__main__":
    sys.exit(main())
