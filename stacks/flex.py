"""The flex-start stack (issue 3). Placeholder until the queued-resource client lands."""

from __future__ import annotations

from tpuserve.config import Deployment

from .base import ServingStack
from .cdk import Construct


class FlexStack(ServingStack):
    def __init__(self, scope: Construct, deployment: Deployment) -> None:
        super().__init__(scope, deployment)
