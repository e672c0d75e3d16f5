"""Every google_* resource and data source is bound to the google-beta provider.

Terraform picks a resource's provider by its type's prefix unless `provider` says otherwise:
a `google_tpu_v2_vm` without it would need `hashicorp/google` (not in required_providers) and
an unconfigured instance of it, with no project, region or labels. cdktf writes `provider`
only for a resource given one, so this aspect gives every google_* element ours, in one place.
"""

from __future__ import annotations

import jsii

from .cdk import (
    IAspect,
    IConstruct,
    TerraformDataSource,
    TerraformProvider,
    TerraformResource,
)


@jsii.implements(IAspect)
class BindGoogleProvider:
    def __init__(self, provider: TerraformProvider) -> None:
        self._provider = provider

    def visit(self, node: IConstruct) -> None:
        if (isinstance(node, TerraformResource | TerraformDataSource)
                and node.terraform_resource_type.startswith("google_")
                and node.provider is None):
            node.provider = self._provider
