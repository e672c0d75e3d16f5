"""The fleet pods' least-privilege grants, by Workload Identity principal (no Google service
account to impersonate): the vLLM pods read the base's two secrets and the staged weights and
read/write the compile cache; the weights Job writes the weights; the custom-metrics adapter
reads Cloud Monitoring. Every base resource is found by name: no cross-stack reference."""

from __future__ import annotations

from tpuserve.contracts import ADAPTER_KSA, ADAPTER_NAMESPACE
from tpuserve.render import fleet_bundle
from tpuserve.settings import Deployment

from .cdk import (
    Construct,
    DataGoogleProject,
    GoogleProjectIamMember,
    GoogleSecretManagerSecretIamMember,
    GoogleStorageBucketIamMember,
    TerraformResource,
)


def workload_pool(d: Deployment) -> str:
    """The cluster's Workload Identity pool."""
    return f"{d.gcp.project}.svc.id.goog"


def principal(d: Deployment, number: str, namespace: str, ksa: str) -> str:
    """The IAM principal of one Kubernetes service account of the cluster."""
    return (f"principal://iam.googleapis.com/projects/{number}/locations/global/"
            f"workloadIdentityPools/{workload_pool(d)}/subject/ns/{namespace}/sa/{ksa}")


def workload_identity(scope: Construct, d: Deployment, *, after: list[TerraformResource]
                      ) -> list[TerraformResource]:
    """Each pod's grants, to its Kubernetes service account's principal: nothing else. AFTER:
    the cluster (and the preflights): the pool <project>.svc.id.goog exists only once a
    Workload Identity cluster does; before it, IAM refuses a principal of it ("Identity Pool
    does not exist")."""
    project = DataGoogleProject(scope, "project", project_id=d.gcp.project)
    project.override_logical_id("project")
    ns = fleet_bundle.NAMESPACE
    vllm = principal(d, project.number, ns, fleet_bundle.KSA)
    stager = principal(d, project.number, ns, fleet_bundle.WEIGHTS_JOB)
    # the custom-metrics adapter the HPA reads vllm:num_requests_waiting through
    adapter = principal(d, project.number, ADAPTER_NAMESPACE, ADAPTER_KSA)
    grants: list[TerraformResource] = []

    def keep(res: TerraformResource, id_: str) -> None:
        res.override_logical_id(id_)
        grants.append(res)

    for id_, secret, member in (
        ("vllm_hf_token_accessor", d.hf_token_secret_id, vllm),
        ("vllm_api_key_accessor", d.api_key_secret_id, vllm),
        # The staging Job reads the HF token to download the model, nothing else.
        ("stager_hf_token_accessor", d.hf_token_secret_id, stager),
    ):
        keep(GoogleSecretManagerSecretIamMember(
            scope, id_, project=d.gcp.project, secret_id=secret,
            role="roles/secretmanager.secretAccessor", member=member,
            depends_on=after), id_)
    for id_, bucket, role, member in (
        ("vllm_cache_object_user", d.cache_bucket, "roles/storage.objectUser", vllm),
        ("vllm_weights_object_viewer", d.base.weights_bucket,
         "roles/storage.objectViewer", vllm),
        ("stager_weights_object_user", d.base.weights_bucket,
         "roles/storage.objectUser", stager),
    ):
        keep(GoogleStorageBucketIamMember(scope, id_, bucket=bucket, role=role,
                                          member=member, depends_on=after), id_)
    keep(GoogleProjectIamMember(scope, "adapter_monitoring_viewer", project=d.gcp.project,
                                role="roles/monitoring.viewer", member=adapter,
                                depends_on=after),
         "adapter_monitoring_viewer")
    return grants
