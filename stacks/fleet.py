"""The fleet stack: N replicas of the one-chip server on GKE, behind a regional load balancer.

Before anything: `data.external.fleet_preflight` (`python -m tpuserve.fleet_check`) proves at plan
time the Compute regional TPU quota the pools draw on, that the zone's release channel offers
the control-plane floor (MIN_MASTER_VERSION), and that the APIs below are enabled.

GCP side (google-beta, this stack's own, destroyed with it):
- in the base's network (by name), the proxy-only subnet a regional Gateway needs, one
  firewall rule that lets the load balancer's proxies and health checks reach the pods' key
  proxy port, and one that lets the proxies reach the endpoint picker's ext_proc port (the
  base denies all other ingress; the VM stacks' SSH and API-port rules are not the fleet's);
- the base's node account gets roles/container.defaultNodeServiceAccount (GKE's minimum for
  a node's own logs and metrics) while the fleet is up;
- a zonal VPC-native GKE Standard cluster at MIN_MASTER_VERSION or later (Workload Identity,
  Dataplane V2, managed Prometheus, Gateway API, the Secret Manager and GCS FUSE CSI add-ons,
  shielded nodes), a small system pool and one single-chip v5e pool per entry of
  `fleet.provisioning`, in that order;
- the pods' least-privilege grants, by Workload Identity principal (no Google service account
  to impersonate), each after the cluster (its identity pool exists only then): the vLLM pods
  read the base's two secrets and the staged weights and read/write the compile cache; the
  weights Job writes the weights; the custom-metrics adapter reads Cloud Monitoring. Every
  base resource is found by name: no cross-stack reference;
- the Gateway's reserved regional address and, with `fleet.domain`, a Google-managed regional
  certificate (DNS authorization: no private key anywhere, in state or elsewhere).

Kubernetes side: the rendered bundle (tpuserve/render/fleet_bundle.py), applied by
`python -m tpuserve.kubectl` from two `terraform_data` resources:
- `k8s_bundle` is replaced whenever the bundle's sha256 changes; its create step runs
  `kubectl apply --server-side` (idempotent: objects that did not change stay as they are). It
  has no destroy step, so a changed bundle re-applies in place: no outage, no deleted
  namespace in between;
- `k8s_teardown` holds the latest bundle (updated in place, no step runs) and is replaced
  only when the cluster is; its destroy step runs `kubectl delete` (namespace last) before
  the cluster and the address go, so the Gateway's load balancer, which Kubernetes created,
  does not outlive the stack and keep the address or the proxy-only subnet in use.
The bundle reaches the step gzipped and base64-encoded in one environment variable (Linux caps
one at 128 KiB): its size is checked at synth.
"""

from __future__ import annotations

from tpuserve import contracts
from tpuserve.contracts import HEALTH_CHECK_RANGES, MIN_MASTER_VERSION
from tpuserve.contracts import K8S_BUNDLE_GZ_ENV as ENV_BUNDLE_GZ
from tpuserve.contracts import K8S_CLUSTER_ENV as ENV_CLUSTER
from tpuserve.contracts import K8S_IMAGE_ENV as ENV_IMAGE
from tpuserve.contracts import K8S_LOCATION_ENV as ENV_LOCATION
from tpuserve.contracts import K8S_PROJECT_ENV as ENV_PROJECT
from tpuserve.kinds import by_model
from tpuserve.render import fleet_bundle
from tpuserve.settings import Deployment

from .cdk import (
    Construct,
    DataResource,
    GoogleCertificateManagerCertificate,
    GoogleCertificateManagerCertificateManaged,
    GoogleCertificateManagerDnsAuthorization,
    GoogleComputeAddress,
    GoogleComputeFirewall,
    GoogleComputeFirewallAllow,
    GoogleComputeSubnetwork,
    GoogleContainerNodePool,
    GoogleContainerNodePoolAutoscaling,
    GoogleContainerNodePoolManagement,
    GoogleContainerNodePoolNodeConfig,
    GoogleContainerNodePoolNodeConfigReservationAffinity,
    GoogleContainerNodePoolNodeConfigShieldedInstanceConfig,
    GoogleContainerNodePoolNodeConfigTaint,
    GoogleContainerNodePoolNodeConfigWorkloadMetadataConfig,
    GoogleProjectIamMember,
    LocalExecProvisioner,
    TerraformResource,
)
from .foundation import VM_SCOPES
from .gke_cluster import gke_cluster
from .literals import tf_ref
from .local_exec import base64gzip_chars, python_module, repo_root
from .preflight import external_program, fleet_preflight
from .serving import ServingStack
from .workload_identity import workload_identity

CLIENT = python_module(contracts.KUBECTL)
# Node label the bundle's ComputeClass and selectors read.
PROVISIONING_LABEL = "tpuserve/provisioning"
COMPUTE_CLASS_KEY = "cloud.google.com/compute-class"
# What GKE documents as the least a node's own account needs for its logs and metrics.
NODE_ROLE = "roles/container.defaultNodeServiceAccount"
# The bundle, gzipped and base64-encoded, is one environment string of the step.
MAX_BUNDLE_GZ_CHARS = contracts.MAX_ENV_CHARS


# The APIs the stack's resources and the cluster's add-ons call, each for what needs it.
FLEET_APIS = (
    "container.googleapis.com",             # the cluster and its pools
    "compute.googleapis.com",               # subnet, firewall rule, address, the TPU nodes
    "cloudresourcemanager.googleapis.com",  # the project lookup and its IAM members
    "networkservices.googleapis.com",       # the Gateway's extension calling the picker
    "monitoring.googleapis.com",            # managed Prometheus, the adapter's HPA metric
    "logging.googleapis.com",               # the cluster's logging_config
)
CERTIFICATE_API = "certificatemanager.googleapis.com"  # only with fleet.domain


def fleet_apis(d: Deployment) -> list[str]:
    return [*FLEET_APIS, *([CERTIFICATE_API] if d.fleet.domain else [])]


def pool_name(model: str) -> str:
    """The TPU pool of one provisioning model: the bundle's ComputeClass names the same."""
    return fleet_bundle.NODE_POOLS[model]


class FleetStack(ServingStack):
    VM_FIREWALL = False  # no IAP SSH, no API-port rule: only firewall_lb below

    def __init__(self, scope: Construct, deployment: Deployment) -> None:
        super().__init__(scope, deployment)
        d = deployment
        f = d.fleet
        self.cluster_name = d.node_name
        self.fleet_preflight = fleet_preflight(
            self, d, machine_type=d.tpu.accelerator.machine_type,
            min_master_version=MIN_MASTER_VERSION, apis=fleet_apis(d))
        pre = [self.preflight, self.fleet_preflight]
        self.preflights = pre

        proxy_only = GoogleComputeSubnetwork(
            self, "proxy_only_subnet",
            name=f"{d.node_name}-proxy-only", region=d.gcp.region, network=d.network_name,
            ip_cidr_range=f.proxy_only_cidr, purpose="REGIONAL_MANAGED_PROXY", role="ACTIVE",
            depends_on=pre,
        )
        proxy_only.override_logical_id("proxy_only_subnet")
        # The proxies and probers reach the pods' key proxy only (the InferencePool's target
        # port and the HealthCheckPolicy's port): not SSH, not any other port of the nodes.
        lb = GoogleComputeFirewall(
            self, "firewall_lb",
            name=f"{d.node_name}-allow-lb", network=d.network_name, direction="INGRESS",
            allow=[GoogleComputeFirewallAllow(protocol="tcp",
                                              ports=[str(fleet_bundle.PROXY_PORT)])],
            source_ranges=[f.proxy_only_cidr, *HEALTH_CHECK_RANGES],
            target_tags=[d.network_tag],
            description="The Gateway's proxies (proxy-only subnet) and health checks to the "
                        "pods' key proxy port",
            depends_on=pre,
        )
        lb.override_logical_id("firewall_lb")
        # The same proxies call the endpoint picker (the Gateway's ext_proc extension, a
        # backend of the load balancer) on the picker Service's port: an Envoy-based load
        # balancer's traffic to any backend comes from the proxy-only subnet (Google's load
        # balancing docs, firewall-rules: "Load balancers based on the open source Envoy
        # proxy"). Without it the base's deny drops every callout and, the pool being
        # FailClose, the Gateway answers nothing. Not the probers' ranges: 9002 only.
        picker = GoogleComputeFirewall(
            self, "firewall_picker",
            name=f"{d.node_name}-allow-picker", network=d.network_name, direction="INGRESS",
            allow=[GoogleComputeFirewallAllow(protocol="tcp",
                                              ports=[str(fleet_bundle.EPP_PORT)])],
            source_ranges=[f.proxy_only_cidr],
            target_tags=[d.network_tag],
            description="The Gateway's proxies (proxy-only subnet) to the endpoint picker's "
                        "ext_proc port",
            depends_on=pre,
        )
        picker.override_logical_id("firewall_picker")

        node_role = GoogleProjectIamMember(
            self, "node_default_role", project=d.gcp.project, role=NODE_ROLE,
            member=f"serviceAccount:{d.service_account_email}", depends_on=pre,
        )
        node_role.override_logical_id("node_default_role")
        self.cluster = gke_cluster(self, d, name=self.cluster_name,
                                   depends_on=[*pre, node_role])
        self.pools = [self._system_pool(d)]
        for i, model in enumerate(f.provisioning):
            self.pools.append(self._tpu_pool(d, model, first=i == 0))
        grants = workload_identity(self, d, after=[*self.preflights, self.cluster])
        self.address = GoogleComputeAddress(
            self, "fleet_ip", name=f"{d.node_name}-ip", region=d.gcp.region,
            address_type="EXTERNAL", description="The fleet Gateway's address",
            depends_on=pre,
        )
        self.address.override_logical_id("fleet_ip")
        certs = self._certificate(d) if f.domain else []
        self._bundle(d, depends_on=[proxy_only, lb, picker, node_role, self.cluster,
                                    *self.pools, *grants, self.address, *certs])
        self._outputs(d)

    # ------------------------------------------------------------------ pools
    def _node_config(self, d: Deployment, **extra: object) -> GoogleContainerNodePoolNodeConfig:
        return GoogleContainerNodePoolNodeConfig(
            service_account=d.service_account_email,  # the base's node account, by email
            oauth_scopes=list(VM_SCOPES),
            workload_metadata_config=GoogleContainerNodePoolNodeConfigWorkloadMetadataConfig(
                mode="GKE_METADATA"),
            shielded_instance_config=GoogleContainerNodePoolNodeConfigShieldedInstanceConfig(
                enable_secure_boot=True, enable_integrity_monitoring=True),
            tags=[d.network_tag],
            resource_labels=d.labels,
            **extra,  # type: ignore[arg-type]
        )

    def _system_pool(self, d: Deployment) -> GoogleContainerNodePool:
        """The endpoint picker, the metrics adapter and kube-system run here."""
        pool = GoogleContainerNodePool(
            self, "system_pool",
            name=contracts.SYSTEM_POOL_NAME, cluster=self.cluster.name, location=d.gcp.zone,
            initial_node_count=1,
            autoscaling=GoogleContainerNodePoolAutoscaling(
                total_min_node_count=1, total_max_node_count=3, location_policy="BALANCED"),
            management=GoogleContainerNodePoolManagement(auto_repair=True, auto_upgrade=True),
            node_config=self._node_config(d, machine_type=d.fleet.system_machine_type,
                                          labels={PROVISIONING_LABEL: "system"}),
        )
        pool.override_logical_id("system_pool")
        return pool

    def _tpu_pool(self, d: Deployment, model: str, *, first: bool) -> GoogleContainerNodePool:
        f = d.fleet
        extra: dict[str, object] = {}
        repair = True
        kind = by_model(model)  # the pool's capacity is its kind's (tpuserve/kinds)
        if kind.flex_start:
            # GKE's flex-start for node pools: no reservation, no auto-repair (a repaired
            # node would be a new flex-start request), nodes live max_run_duration at most.
            extra = {"flex_start": True, "max_run_duration": f"{f.flex_max_run_seconds}s",
                     "reservation_affinity": GoogleContainerNodePoolNodeConfigReservationAffinity(
                         consume_reservation_type="NO_RESERVATION")}
            repair = False
        elif kind.spot:
            extra = {"spot": True}
        pool = GoogleContainerNodePool(
            self, f"tpu_pool_{model}",
            name=pool_name(model), cluster=self.cluster.name, location=d.gcp.zone,
            # Zero at creation: nodes come when replicas are pending (the first pool's floor
            # keeps min_replicas warm afterwards); a flex request at create would hold the apply.
            initial_node_count=0,
            autoscaling=GoogleContainerNodePoolAutoscaling(
                total_min_node_count=f.min_replicas if first else 0,
                total_max_node_count=f.max_replicas, location_policy="ANY"),
            management=GoogleContainerNodePoolManagement(auto_repair=repair, auto_upgrade=True),
            # No placement_policy.tpu_topology: every slice served is single-host (one VM,
            # the machine type's chips), and a single-host pool takes no topology (Google's
            # xpk, src/xpk/core/nodepool.py: --tpu-topology only past one VM per slice; the
            # gcloud comparison in tests/gcloud records the multi-host form).
            # GKE's rule for a ComputeClass over manually created pools: each carries the
            # class as a label and a NoSchedule taint, so only the class's pods land there.
            node_config=self._node_config(
                d, machine_type=d.tpu.accelerator.machine_type,
                labels={PROVISIONING_LABEL: model, COMPUTE_CLASS_KEY: fleet_bundle.COMPUTE_CLASS},
                taint=[GoogleContainerNodePoolNodeConfigTaint(
                    key=COMPUTE_CLASS_KEY, value=fleet_bundle.COMPUTE_CLASS,
                    effect="NO_SCHEDULE")],
                **extra),
        )
        pool.override_logical_id(f"tpu_pool_{model}")
        return pool

    # ------------------------------------------------------------------ certificate
    def _certificate(self, d: Deployment) -> list[TerraformResource]:
        """A Google-managed regional certificate: a regional one is DNS-authorized (the user
        adds the CNAME record the output names); Google holds the key."""
        auth = GoogleCertificateManagerDnsAuthorization(
            self, "fleet_dns_authorization", name=f"{d.node_name}-dns-auth",
            domain=d.fleet.domain, location=d.gcp.region, type="PER_PROJECT_RECORD",
            depends_on=self.preflights,
        )
        auth.override_logical_id("fleet_dns_authorization")
        cert = GoogleCertificateManagerCertificate(
            self, "fleet_cert", name=f"{d.node_name}-cert", location=d.gcp.region,
            description="The fleet Gateway's certificate (Google-managed)",
            managed=GoogleCertificateManagerCertificateManaged(
                domains=[d.fleet.domain], dns_authorizations=[auth.id]),
        )
        cert.override_logical_id("fleet_cert")
        self.dns_authorization = auth
        return [auth, cert]

    # ------------------------------------------------------------------ the bundle
    def _bundle(self, d: Deployment, depends_on: list[TerraformResource]) -> None:
        # A placeholder or tag-only image fails the plan here, before the cluster exists.
        external_program(self, "image_preflight", f"{CLIENT} preflight",
                         {"image": d.vllm.image or "", "picker_image": d.fleet.picker_image,
                          "adapter_image": d.fleet.adapter_image})
        bundle = fleet_bundle.render_bundle(d)
        size = base64gzip_chars(bundle)
        if size > MAX_BUNDLE_GZ_CHARS:
            raise ValueError(
                f"the fleet's Kubernetes bundle is {size:,} characters gzipped and base64-coded: "
                f"at most {MAX_BUNDLE_GZ_CHARS:,} fit the apply step's environment (Linux caps "
                "one variable at 128 KiB); shrink the rendered objects (templates/fleet/)"
            )
        root = repo_root()
        target = {"project": d.gcp.project, "location": d.gcp.zone,
                  "cluster": self.cluster_name}

        def env(*, image: bool) -> dict[str, str]:
            out = {ENV_PROJECT: tf_ref("self.input.project"),
                   ENV_LOCATION: tf_ref("self.input.location"),
                   ENV_CLUSTER: tf_ref("self.input.cluster"),
                   ENV_BUNDLE_GZ: tf_ref("base64gzip(self.input.bundle)")}
            if image:
                out[ENV_IMAGE] = tf_ref("self.input.image")
            return out

        # Replaced only with the cluster: it deletes what the bundle made before the cluster,
        # pools and address go. Its input follows the bundle in place (no step runs).
        teardown = DataResource(
            self, "k8s_teardown",
            input={"bundle": bundle, **target},
            triggers_replace={**target, "cluster_id": self.cluster.id},
            provisioners=[LocalExecProvisioner(
                type="local-exec", when="destroy", command=f"{CLIENT} delete",
                working_dir=root, environment=env(image=False),
            )],
            depends_on=depends_on,
        )
        teardown.override_logical_id("k8s_teardown")
        # Any change of the bundle (or a new cluster) applies it again; nothing is deleted.
        applied = DataResource(
            self, contracts.K8S_BUNDLE_ID,
            input={"bundle": bundle, "image": d.vllm.image, **target},
            triggers_replace={"bundle_sha256": fleet_bundle.bundle_sha256(bundle),
                              "cluster_id": self.cluster.id},
            provisioners=[LocalExecProvisioner(
                type="local-exec", command=f"{CLIENT} apply", working_dir=root,
                environment=env(image=True),
            )],
            depends_on=[teardown],
        )
        applied.override_logical_id(contracts.K8S_BUNDLE_ID)

    # ------------------------------------------------------------------ outputs
    def _outputs(self, d: Deployment) -> None:
        f = d.fleet
        ip = self.address.address
        self.output("cluster_name", self.cluster_name, "The GKE cluster")
        self.output("zone", d.gcp.zone, "The cluster's zone")
        self.output("external_ip", ip, "The Gateway's reserved regional address")
        if f.domain:
            self.output("endpoint", f"https://{f.domain}/v1",
                        f"OpenAI-compatible base URL (point {f.domain} at the external_ip)")
            rec = self.dns_authorization.dns_resource_record.get(0)
            self.output("certificate_dns_record",
                        f"{rec.name} {rec.type} {rec.data}",
                        "Add this DNS record once: the managed certificate is issued after it")
        else:
            self.output("endpoint", f"http://{ip}/v1",
                        "OpenAI-compatible base URL (plain HTTP: set fleet.domain for HTTPS)")
        # A succeeding data.external program's stderr is not shown: its warnings are here.
        self.output("preflight_warnings",
                    tf_ref("data.external.fleet_preflight.result.warning_text"),
                    "What the plan-time check warned of (e.g. TPU quota below max_replicas)")
        self.output("get_credentials_command",
                    f"gcloud container clusters get-credentials {self.cluster_name} "
                    f"--zone {d.gcp.zone} --project {d.gcp.project}",
                    "kubectl access to the cluster")
        self.output(contracts.USD_PER_HOUR_OUTPUT, round(d.usd_per_hour, 4),
                    f"One replica in the {f.provisioning[0]} pool, $/hour (SPEC 2)")
        self.output("max_usd_per_hour", round(d.usd_per_hour * f.max_replicas, 4),
                    f"All {f.max_replicas} replicas at the first pool's price, $/hour (TPU "
                    "nodes only: the system pool and the load balancer add to it)")

