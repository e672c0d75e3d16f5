"""The fleet's GKE cluster (stacks/fleet.py says what the stack holds around it): zonal,
VPC-native, Standard, at the control-plane floor or later, with Workload Identity, Dataplane V2,
managed Prometheus, the Gateway API and the Secret Manager and GCS FUSE CSI add-ons."""

from __future__ import annotations

from tpuserve.contracts import MIN_MASTER_VERSION
from tpuserve.settings import Deployment

from .cdk import (
    Construct,
    GoogleContainerCluster,
    GoogleContainerClusterAddonsConfig,
    GoogleContainerClusterAddonsConfigGcsFuseCsiDriverConfig,
    GoogleContainerClusterAddonsConfigHorizontalPodAutoscaling,
    GoogleContainerClusterAddonsConfigHttpLoadBalancing,
    GoogleContainerClusterGatewayApiConfig,
    GoogleContainerClusterIpAllocationPolicy,
    GoogleContainerClusterLoggingConfig,
    GoogleContainerClusterMasterAuth,
    GoogleContainerClusterMasterAuthClientCertificateConfig,
    GoogleContainerClusterMonitoringConfig,
    GoogleContainerClusterMonitoringConfigManagedPrometheus,
    GoogleContainerClusterNodeConfig,
    GoogleContainerClusterNodeConfigShieldedInstanceConfig,
    GoogleContainerClusterNodeConfigWorkloadMetadataConfig,
    GoogleContainerClusterPodAutoscaling,
    GoogleContainerClusterReleaseChannel,
    GoogleContainerClusterSecretManagerConfig,
    GoogleContainerClusterWorkloadIdentityConfig,
    TerraformResource,
    TerraformResourceLifecycle,
)
from .foundation import VM_SCOPES
from .workload_identity import workload_pool


def gke_cluster(scope: Construct, d: Deployment, *, name: str,
                depends_on: list[TerraformResource]) -> GoogleContainerCluster:
    """The fleet's zonal GKE Standard cluster, named NAME (the pools are declared apart)."""
    f = d.fleet
    cluster = GoogleContainerCluster(
        scope, "cluster",
        name=name,
        location=d.gcp.zone,  # zonal: the measured-good zone; one control plane, free tier
        network=d.network_name,
        subnetwork=d.subnet_name,
        # The default pool goes at once; the pools below are declared, each on its own.
        remove_default_node_pool=True,
        initial_node_count=1,
        # The default pool lives minutes, but as the base's node account with the GKE
        # metadata server, like every pool, not as the project's default compute account.
        node_config=GoogleContainerClusterNodeConfig(
            service_account=d.service_account_email,
            oauth_scopes=list(VM_SCOPES),
            workload_metadata_config=(
                GoogleContainerClusterNodeConfigWorkloadMetadataConfig(mode="GKE_METADATA")),
            shielded_instance_config=GoogleContainerClusterNodeConfigShieldedInstanceConfig(
                enable_secure_boot=True, enable_integrity_monitoring=True),
        ),
        # IAM (gcloud credentials) is the only way in: no client certificate is issued.
        master_auth=GoogleContainerClusterMasterAuth(
            client_certificate_config=GoogleContainerClusterMasterAuthClientCertificateConfig(
                issue_client_certificate=False)),
        # Pod-to-pod traffic on a node shows in the subnet's (sampled) flow logs too.
        enable_intranode_visibility=True,
        # A disposable serving stack: `cdktf destroy fleet` must work (the long-lived
        # state is the base's).
        deletion_protection=False,
        release_channel=GoogleContainerClusterReleaseChannel(channel=f.release_channel),
        # Read at create only (provider 6.50.0 never reads it back: no drift); the channel
        # upgrades from there.
        min_master_version=MIN_MASTER_VERSION,
        networking_mode="VPC_NATIVE",
        ip_allocation_policy=GoogleContainerClusterIpAllocationPolicy(
            cluster_ipv4_cidr_block=f.pods_cidr,
            services_ipv4_cidr_block=f.services_cidr,
        ),
        datapath_provider="ADVANCED_DATAPATH",  # Dataplane V2: NetworkPolicy enforced
        enable_shielded_nodes=True,
        gateway_api_config=GoogleContainerClusterGatewayApiConfig(
            channel="CHANNEL_STANDARD"),
        addons_config=GoogleContainerClusterAddonsConfig(
            http_load_balancing=GoogleContainerClusterAddonsConfigHttpLoadBalancing(
                disabled=False),
            horizontal_pod_autoscaling=(
                GoogleContainerClusterAddonsConfigHorizontalPodAutoscaling(disabled=False)),
            gcs_fuse_csi_driver_config=(
                GoogleContainerClusterAddonsConfigGcsFuseCsiDriverConfig(enabled=True)),
        ),
        workload_identity_config=GoogleContainerClusterWorkloadIdentityConfig(
            workload_pool=workload_pool(d)),
        monitoring_config=GoogleContainerClusterMonitoringConfig(
            enable_components=["SYSTEM_COMPONENTS", "HPA", "POD", "DEPLOYMENT"],
            managed_prometheus=GoogleContainerClusterMonitoringConfigManagedPrometheus(
                enabled=True),
        ),
        logging_config=GoogleContainerClusterLoggingConfig(
            enable_components=["SYSTEM_COMPONENTS", "WORKLOADS"]),
        secret_manager_config=GoogleContainerClusterSecretManagerConfig(enabled=True),
        pod_autoscaling=GoogleContainerClusterPodAutoscaling(hpa_profile="PERFORMANCE"),
        resource_labels=d.labels,
        # GKE reports the FIRST node pool's config as the cluster's nodeConfig once the
        # default pool is gone, and provider 6.50.0 reads it into this block (Read:
        # flattenNodeConfig(cluster.NodeConfig), resource_container_cluster.go:3359), which
        # is ForceNew (node_config.go:141): a second plan would diff tags, taints and the
        # ForceNew spot/flex_start/max_run_duration of whichever pool GKE lists first, and
        # replace the cluster. The block only shapes the transient default pool at create.
        lifecycle=TerraformResourceLifecycle(ignore_changes=["node_config"]),
        depends_on=depends_on,
    )
    cluster.override_logical_id("cluster")
    return cluster
