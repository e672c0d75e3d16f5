"""The contracts between processes, each stated once: what one program writes and another
reads, where neither can import the other's code at the moment it matters (a Terraform
provisioner run years after its stack was synthesized, a boot script on the node, a review of
a plan).

- the `python -m tpuserve.X` entry points the stacks' Terraform runs (deployed stacks name
  them, so the names never change) and the environment variables each reads;
- the Terraform logical ids the stacks pass to `override_logical_id` that other programs read
  back out of the synthesized JSON or a plan (the plan review, the synth summary);
- the guest attributes the boot script writes and the CLI reads through the TPU API;
- the constants two layers share: the fleet's machine type, Google's health-check ranges, the
  node pool names the summary reads, the fleet's control-plane floor, and the size one
  environment string may take.

Pure data, standard library only: the plan gate (stdlib-only) and every Terraform provisioner
import it on each call. A test fails when one of these names is spelled anywhere else.
"""

from __future__ import annotations

from typing import NamedTuple


class EntryPoint(NamedTuple):
    """One program the stacks' Terraform (or a workflow) runs as `python -m MODULE COMMAND`."""

    module: str
    commands: tuple[str, ...]
    env: tuple[str, ...] = ()  # the variables it reads, set by the stack's provisioner

    @property
    def prog(self) -> str:
        """How it is run, as its usage line and its messages name it."""
        return f"python -m {self.module}"


# ----------------------------------------------------------------------------- environment

# The base stack's destroy provisioner (`base_check teardown`).
BASE_PROJECT_ENV = "TPUSERVE_BASE_PROJECT"
BASE_DEPLOYMENT_ENV = "TPUSERVE_BASE_DEPLOYMENT"
BASE_REGION_ENV = "TPUSERVE_BASE_REGION"
BASE_FORCE_ENV = "TPUSERVE_BASE_FORCE"  # 1: destroy the base with serving stacks up (warn)
# Synthesis (main.py): set to the deployment's name, the base loses its prevent_destroy (a
# stale value left in a shell cannot unprotect another deployment).
TEARDOWN_ENV = "TPUSERVE_TEARDOWN"

# The TPU VM stacks' billing-guard provisioners.
GUARD_NODE_ENV = "TPUSERVE_GUARD_NODE"  # projects/P/locations/Z/nodes/N
GUARD_QUEUE_ENV = "TPUSERVE_GUARD_QUEUE"  # projects/P/locations/R/queues/Q
GUARD_SERVICE_ACCOUNT_ENV = "TPUSERVE_GUARD_SERVICE_ACCOUNT"  # the guard's email
GUARD_SECONDS_ENV = "TPUSERVE_GUARD_MAX_RUN_SECONDS"
# The root the task calls (the stack sets it from [gcp] tpu_api_endpoint); unset: production.
GUARD_TPU_ENDPOINT_ENV = "TPUSERVE_GUARD_TPU_ENDPOINT"

# The fleet's plan-time check: 1 plans with an absent quota metric (a warning).
FLEET_FORCE_ENV = "TPUSERVE_FLEET_FORCE"

# The fleet stack's Kubernetes provisioners.
K8S_PROJECT_ENV = "TPUSERVE_K8S_PROJECT"
K8S_LOCATION_ENV = "TPUSERVE_K8S_LOCATION"
K8S_CLUSTER_ENV = "TPUSERVE_K8S_CLUSTER"
K8S_BUNDLE_GZ_ENV = "TPUSERVE_K8S_BUNDLE_GZ"
K8S_IMAGE_ENV = "TPUSERVE_K8S_IMAGE"

# The flex stack's queued-resource provisioners.
QR_NAME_ENV = "TPUSERVE_QR_NAME"
QR_BODY_ENV = "TPUSERVE_QR_BODY"  # plain JSON, for hand runs
# The stack's form: a body over 100 KB does not fit one environment string (128 KiB).
QR_BODY_GZ_ENV = "TPUSERVE_QR_BODY_GZ"
QR_GENERATION_ENV = "TPUSERVE_QR_GENERATION"
QR_POLL_ENV = "TPUSERVE_QR_POLL_SECONDS"

# The interpreter every provisioner runs (a path, or words such as `pipenv run python`).
PYTHON_ENV = "TPUSERVE_PYTHON"
# Tests: multiplies every retry pause of the Google edge (as in the boot script).
TIME_SCALE_ENV = "TPUSERVE_TIME_SCALE"
# Synthesis: `full` imports the google-beta provider package the ordinary way (stacks/cdk.py);
# the review passes it to the synthesis it runs, bench/synth times both ways.
CDK_IMPORT_ENV = "TPUSERVE_CDK_IMPORT"

# The settings' own override layers (tpuserve/settings/loader.py), which `tpuserve review`
# passes on to the synthesis it runs in a sandbox.
CONFIG_ENV = "TPUSERVE_CONFIG"  # a TOML file merged over config/default.toml
PROJECT_ENV = "TPUSERVE_PROJECT"  # gcp.project
ZONE_ENV = "TPUSERVE_ZONE"  # gcp.zone

# Linux caps one environment string at 128 KiB (MAX_ARG_STRLEN): what a provisioner gets in one
# variable (base64gzip of a body or bundle) stays under this, with room for the variable's name
# and for Go's gzip coding it a little longer than Python's.
MAX_ENV_CHARS = 100_000

# ----------------------------------------------------------------------------- entry points

BASE_CHECK = EntryPoint("tpuserve.base_check", ("preflight", "teardown"),
                        (BASE_PROJECT_ENV, BASE_DEPLOYMENT_ENV, BASE_REGION_ENV, BASE_FORCE_ENV))
BILLING_GUARD = EntryPoint("tpuserve.billing_guard", ("arm", "disarm"),
                           (GUARD_NODE_ENV, GUARD_QUEUE_ENV, GUARD_SERVICE_ACCOUNT_ENV,
                            GUARD_SECONDS_ENV, GUARD_TPU_ENDPOINT_ENV))
FLEET_CHECK = EntryPoint("tpuserve.fleet_check", ("preflight",), (FLEET_FORCE_ENV,))
KUBECTL = EntryPoint("tpuserve.kubectl", ("apply", "delete", "preflight"),
                     (K8S_PROJECT_ENV, K8S_LOCATION_ENV, K8S_CLUSTER_ENV, K8S_BUNDLE_GZ_ENV,
                      K8S_IMAGE_ENV))
QUEUED_RESOURCE = EntryPoint("tpuserve.queued_resource",
                             ("create", "delete", "probe", "describe", "converge"),
                             (QR_NAME_ENV, QR_BODY_ENV, QR_BODY_GZ_ENV, QR_GENERATION_ENV,
                              QR_POLL_ENV))
# The plan-review workflow's gate (.github/workflows/plan-review.yml) and `./dev synth`'s
# summary: run by name too, with no environment of their own.
PLAN_GATE = EntryPoint("tpuserve.plan_gate", ())
SYNTH_SUMMARY = EntryPoint("tpuserve.synth_summary", ())
ENTRY_POINTS = (BASE_CHECK, BILLING_GUARD, FLEET_CHECK, KUBECTL, QUEUED_RESOURCE, PLAN_GATE,
                SYNTH_SUMMARY)

# ----------------------------------------------------------------------------- Terraform

# Logical ids the stacks pin with override_logical_id and other programs read back: the plan
# review (tpuserve/review/effects.py, k8s_objects.py) and the synth summary.
DATA_RESOURCE = "terraform_data"  # the type of every provisioner-only resource
TPU_NODE_TYPE = "google_tpu_v2_vm"
NODE_POOL_TYPE = "google_container_node_pool"
# Terraform outputs the synth summary reads: a serving stack's price, the base's dormant cost.
USD_PER_HOUR_OUTPUT = "usd_per_hour"
DORMANT_OUTPUT = "dormant_usd_per_month"
TPU_NODE_ID = "tpu_node"  # the VM stacks' node
BILLING_GUARD_ID = "billing_guard"  # the VM stacks' guard arming
QUEUED_RESOURCE_ID = "queued_resource"  # the flex stack's QR
NODE_METADATA_ID = "node_metadata"  # the flex stack's in-place metadata converge
K8S_BUNDLE_ID = "k8s_bundle"  # the fleet's applied Kubernetes objects
TEARDOWN_GUARD_ID = "teardown_guard"  # the base's destroy guard (the summary knows a base by it)


def data_address(logical_id: str) -> str:
    """A terraform_data resource's address in a plan: `terraform_data.ID`."""
    return f"{DATA_RESOURCE}.{logical_id}"


# ----------------------------------------------------------------------------- guest attributes

# Where the boot script records its phases in guest attributes; the CLI reads them back through
# the TPU API (nodes.getGuestAttributes, queryPath "tpuserve/").
GUEST_ATTRIBUTE_NAMESPACE = "tpuserve"
# The keys the boot script writes, in the order a boot first writes them; their values: the
# script's header. The renderer and its tests, and the CLI's reader (ops/boot_phases.py), take
# them from here. `reconverge` is the watcher's (the script re-run in place when metadata
# changes), not a boot's.
# The keys the CLI reads apart from the boot's phases: each by its name.
GA_BOOT = "boot"  # written first on every boot: an older key is an earlier boot's
GA_STATE = "state"  # booting | waiting <why> | ready | failed <reason>
GA_SECRET = "secret"  # the key's api_key_sha256= (`tpuserve rotate-key` waits for it)
GA_TLS = "tls"  # the proxy's certificate
GA_CONFIG = "config"  # the served configuration's sha256
GA_RECONVERGE = "reconverge"  # the watcher's re-run in place
GA_GUARD = "guard"  # the billing guard's deadline, shown right after `boot` (not the script's)
GUEST_ATTRIBUTE_KEYS: tuple[str, ...] = (
    GA_BOOT, GA_STATE, GA_SECRET, GA_TLS, "image", "cache", "container", GA_CONFIG,
    "bypass_check", "metrics", "memory", "kv_cache", "startup_complete", "health",
    "cache_publish", GA_RECONVERGE,
)
# How the boot script's `failed <reason>` begins when vLLM never answered /health within the
# readiness budget (templates/boot/readiness.sh.j2): the tuner reads it as a compile past the
# budget, which less memory does not shorten, so it does not retry such a candidate lower.
GA_FAILED_NOT_READY = "vLLM not healthy after"

# ----------------------------------------------------------------------------- labels

# Every resource the stacks create carries managed-by=tpuserve and its deployment's name; a
# serving stack's carry the stack's name too. The base's destroy guard (`base_check teardown`)
# finds what is still up by them.
MANAGED_BY_LABEL = "managed-by"
MANAGED_BY = "tpuserve"
DEPLOYMENT_LABEL = "deployment"
STACK_LABEL = "stack"

# ----------------------------------------------------------------------------- the fleet

# The fleet's TPU machine type is the configured accelerator's (tpuserve/accelerators.py): one
# replica per node holding the whole slice; the stack's pools, the plan-time quota check's query
# and the bundle's node selectors all read it there.
# Google's health-check probers (the regional external Application Load Balancer's too): the
# stack's firewall rule lets them in, the bundle's collector accepts them.
HEALTH_CHECK_RANGES = ("35.191.0.0/16", "130.211.0.0/22")
# The fleet's system node pool (the summary tells it from the TPU pools by this name).
SYSTEM_POOL_NAME = "system"
# The bundle's Kubernetes objects other programs name: the vLLM Deployment (the review reads
# its changes), the endpoint picker and the custom-metrics adapter (the apply step waits for
# them; the stack grants the adapter's service account, by Workload Identity principal).
FLEET_NAMESPACE = "tpuserve"
VLLM_DEPLOYMENT = "vllm"
EPP_DEPLOYMENT = "vllm-epp"
ADAPTER_NAMESPACE = "custom-metrics"
ADAPTER_DEPLOYMENT = "custom-metrics-stackdriver-adapter"
ADAPTER_KSA = ADAPTER_DEPLOYMENT  # the vendored manifest names its service account alike
# The fleet cluster's control-plane floor (the stack sets it as min_master_version, the plan-time
# check proves the channel offers it): GKE installs the InferencePool CRD
# (inference.networking.k8s.io/v1) from 1.34.0-gke.1626000 (GKE Inference Gateway docs); TPU
# flex-start pools need 1.33.0-gke.1712000, below it. The fleet's Kubernetes schema tests
# validate at its minor.
MIN_MASTER_VERSION = "1.34.0-gke.1626000"
