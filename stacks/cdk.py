"""The ONE module that imports cdktf, constructs and provider classes.

cdktf is archived upstream; its community fork is CDK Terrain (cdktn). Keeping every import
here makes that move a change to this file alone.

Why the import dance: the prebuilt google-beta package's `__init__` imports all ~1,600
resource modules (seconds of Python, mostly typing, and ~0.5 GB) before jsii even loads the
assembly. We use a dozen. `_register_lean_package` puts a bare package object in
sys.modules so that importing a submodule runs only that submodule and `_jsii` (which loads
the assembly). The ordinary import stays as a fallback (TPUSERVE_CDK_IMPORT=full, or when the
lean path fails), and tests assert both paths synthesize identical JSON.
"""

# ruff: noqa: E402  (provider imports must follow _register_lean_package, below)
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path

from tpuserve.contracts import CDK_IMPORT_ENV

# The provider version that the prebuilt package pins (cdktf-cdktf-provider-google-beta 16.12.1).
GOOGLE_BETA_PROVIDER_VERSION = "6.50.0"
_PKG = "cdktf_cdktf_provider_google_beta"
REPO_ROOT = Path(__file__).resolve().parent.parent


def _register_lean_package() -> str:
    if _PKG in sys.modules:
        return "full" if hasattr(sys.modules[_PKG], "google_tpu_v2_vm") else "lean"
    spec = importlib.util.find_spec(_PKG)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{_PKG} is not installed")
    pkg = types.ModuleType(_PKG)
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__spec__ = spec
    pkg.__file__ = spec.origin
    pkg.__package__ = _PKG
    sys.modules[_PKG] = pkg
    return "lean"


def _import_mode() -> str:
    if os.environ.get(CDK_IMPORT_ENV) == "full":
        importlib.import_module(_PKG)
        return "full"
    _lazy_node_provider()
    try:
        return _register_lean_package()
    except ImportError:
        sys.modules.pop(_PKG, None)
        importlib.import_module(_PKG)
        return "full"


def _pin_node() -> None:
    """jsii runs on the Node 22 that package.json pins (Node 20 is end-of-life)."""
    node = REPO_ROOT / "node_modules" / ".bin" / "node"
    if "JSII_NODE" not in os.environ and node.exists():
        os.environ["JSII_NODE"] = str(node)


def _lazy_node_provider() -> None:
    """The same trick on the Node side: lazy exports for the provider's lib/index.js."""
    hook = f'--require="{Path(__file__).with_name("lazy_provider.cjs")}"'  # quoted: spaces
    options = os.environ.get("NODE_OPTIONS", "")
    if hook not in options:
        os.environ["NODE_OPTIONS"] = f"{options} {hook}".strip()


_pin_node()
IMPORT_MODE = _import_mode()


from cdktf import (  # noqa: F401
    App,
    Aspects,
    DataResource,
    GcsBackend,
    IAspect,
    IResolvable,
    IResolveContext,
    LocalBackend,
    LocalExecProvisioner,
    TerraformDataSource,
    TerraformElement,
    TerraformOutput,
    TerraformProvider,
    TerraformResource,
    TerraformResourceLifecycle,
    TerraformStack,
    Token,
)
from cdktf_cdktf_provider_google_beta.data_google_project import (  # noqa: F401
    DataGoogleProject,
)
from cdktf_cdktf_provider_google_beta.google_billing_budget import (  # noqa: F401
    GoogleBillingBudget,
    GoogleBillingBudgetAllUpdatesRule,
    GoogleBillingBudgetAmount,
    GoogleBillingBudgetAmountSpecifiedAmount,
    GoogleBillingBudgetBudgetFilter,
    GoogleBillingBudgetThresholdRules,
)
from cdktf_cdktf_provider_google_beta.google_certificate_manager_certificate import (  # noqa: F401
    GoogleCertificateManagerCertificate,
    GoogleCertificateManagerCertificateManaged,
)
from cdktf_cdktf_provider_google_beta.google_certificate_manager_dns_authorization import (  # noqa: F401
    GoogleCertificateManagerDnsAuthorization,
)
from cdktf_cdktf_provider_google_beta.google_cloud_tasks_queue import (  # noqa: F401
    GoogleCloudTasksQueue,
    GoogleCloudTasksQueueRateLimits,
    GoogleCloudTasksQueueRetryConfig,
    GoogleCloudTasksQueueStackdriverLoggingConfig,
)
from cdktf_cdktf_provider_google_beta.google_compute_address import (  # noqa: F401
    GoogleComputeAddress,
)
from cdktf_cdktf_provider_google_beta.google_compute_firewall import (  # noqa: F401
    GoogleComputeFirewall,
    GoogleComputeFirewallAllow,
    GoogleComputeFirewallDeny,
)
from cdktf_cdktf_provider_google_beta.google_compute_network import (  # noqa: F401
    GoogleComputeNetwork,
)
from cdktf_cdktf_provider_google_beta.google_compute_subnetwork import (  # noqa: F401
    GoogleComputeSubnetwork,
    GoogleComputeSubnetworkLogConfig,
)
from cdktf_cdktf_provider_google_beta.google_container_cluster import (  # noqa: F401
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
)
from cdktf_cdktf_provider_google_beta.google_container_node_pool import (  # noqa: F401
    GoogleContainerNodePool,
    GoogleContainerNodePoolAutoscaling,
    GoogleContainerNodePoolManagement,
    GoogleContainerNodePoolNodeConfig,
    GoogleContainerNodePoolNodeConfigReservationAffinity,
    GoogleContainerNodePoolNodeConfigShieldedInstanceConfig,
    GoogleContainerNodePoolNodeConfigTaint,
    GoogleContainerNodePoolNodeConfigWorkloadMetadataConfig,
)
from cdktf_cdktf_provider_google_beta.google_monitoring_alert_policy import (  # noqa: F401
    GoogleMonitoringAlertPolicy,
    GoogleMonitoringAlertPolicyAlertStrategy,
    GoogleMonitoringAlertPolicyConditions,
    GoogleMonitoringAlertPolicyConditionsConditionPrometheusQueryLanguage,
    GoogleMonitoringAlertPolicyDocumentation,
)
from cdktf_cdktf_provider_google_beta.google_monitoring_dashboard import (  # noqa: F401
    GoogleMonitoringDashboard,
)
from cdktf_cdktf_provider_google_beta.google_monitoring_notification_channel import (  # noqa: F401
    GoogleMonitoringNotificationChannel,
)
from cdktf_cdktf_provider_google_beta.google_project_iam_custom_role import (  # noqa: F401
    GoogleProjectIamCustomRole,
)
from cdktf_cdktf_provider_google_beta.google_project_iam_member import (  # noqa: F401
    GoogleProjectIamMember,
)
from cdktf_cdktf_provider_google_beta.google_secret_manager_secret import (  # noqa: F401
    GoogleSecretManagerSecret,
    GoogleSecretManagerSecretReplication,
    GoogleSecretManagerSecretReplicationUserManaged,
    GoogleSecretManagerSecretReplicationUserManagedReplicas,
)
from cdktf_cdktf_provider_google_beta.google_secret_manager_secret_iam_member import (  # noqa: F401
    GoogleSecretManagerSecretIamMember,
)
from cdktf_cdktf_provider_google_beta.google_service_account import (  # noqa: F401
    GoogleServiceAccount,
)
from cdktf_cdktf_provider_google_beta.google_storage_bucket import (  # noqa: F401
    GoogleStorageBucket,
    GoogleStorageBucketLifecycleRule,
    GoogleStorageBucketLifecycleRuleAction,
    GoogleStorageBucketLifecycleRuleCondition,
)
from cdktf_cdktf_provider_google_beta.google_storage_bucket_iam_member import (  # noqa: F401
    GoogleStorageBucketIamMember,
)
from cdktf_cdktf_provider_google_beta.google_tpu_v2_vm import (  # noqa: F401
    GoogleTpuV2Vm,
    GoogleTpuV2VmNetworkConfig,
    GoogleTpuV2VmSchedulingConfig,
    GoogleTpuV2VmServiceAccount,
    GoogleTpuV2VmShieldedInstanceConfig,
)
from cdktf_cdktf_provider_google_beta.provider import GoogleBetaProvider  # noqa: F401
from constructs import Construct, IConstruct  # noqa: F401
