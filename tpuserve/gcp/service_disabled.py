"""When "API not enabled" proves that nothing of that API exists in a project.

Google answers 403 with an ErrorInfo {reason: SERVICE_DISABLED, domain: googleapis.com,
metadata: {service, consumer: "projects/<number>", ...}} when the API is off in the CONSUMER
project: the project the call is billed to, which is the resource's project unless the caller
set a quota project (gcloud's billing/quota_project, the application-default credentials'
quota_project_id, X-Goog-User-Project), in which case it is that one. So the answer proves
"nothing of this API in project P" only when its ErrorInfo (domain googleapis.com) names
`service` and its consumer is P: by id, or by number as Cloud Resource Manager v1
`projects.get` reads it (Project.projectId and Project.projectNumber, cloudresourcemanager.v1
discovery document). Anything less is not proof.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tpuserve.gcp.api import GoogleApi, UnprovenAnswer
from tpuserve.gcp.errors import ApiError

CRM_API = "https://cloudresourcemanager.googleapis.com/"  # ..._OVERRIDES_CLOUDRESOURCEMANAGER
CRM_SERVICE = "cloudresourcemanager"
# ErrorInfo.domain of Google's own reasons (google.rpc.ErrorInfo: "The reason is unique within
# the domain"; SERVICE_DISABLED is googleapis.com's).
GOOGLE_DOMAIN = "googleapis.com"
_NUMBER_CONSUMER = re.compile(r"projects/(\d{1,20})")


def says_disabled(exc: ApiError) -> bool:
    """A 403 that claims the API is not enabled (by ErrorInfo or by its words): not a missing
    permission. What it proves is `disabled_in` 's to say."""
    return exc.code == 403 and (
        exc.reason == "SERVICE_DISABLED" or "has not been used in project" in exc.message
        or "SERVICE_DISABLED" in exc.message)


@dataclass(frozen=True)
class Verdict:
    proven: bool  # the API is off in `project` itself: nothing of it can exist there
    consumer: str  # ErrorInfo metadata.consumer ("" when the answer names none)
    why: str  # when not proven: what is missing, one clause


def disabled_in(exc: ApiError, project: str, service: str, crm: GoogleApi | None) -> Verdict:
    """Does this SERVICE_DISABLED answer prove that `service` is off in `project`?"""
    meta = exc.details.metadata
    consumer = meta.get("consumer", "")
    if exc.reason != "SERVICE_DISABLED":
        return Verdict(False, consumer, "the answer carries no ErrorInfo SERVICE_DISABLED "
                       "naming its consumer")
    if exc.details.domain != GOOGLE_DOMAIN:  # a reason means what it does only in its domain
        return Verdict(False, consumer, f"its ErrorInfo's domain is "
                       f"'{exc.details.domain}', not {GOOGLE_DOMAIN}")
    api = f"{service}.googleapis.com"
    if meta.get("service") != api:
        return Verdict(False, consumer, f"its ErrorInfo names service "
                       f"'{meta.get('service', '')}', not {api}")
    if consumer == f"projects/{project}":
        return Verdict(True, consumer, "")
    m = _NUMBER_CONSUMER.fullmatch(consumer)
    if not m:
        return Verdict(False, consumer, "its ErrorInfo names no consumer project"
                       if not consumer else f"consumer '{consumer}' is not project '{project}'")
    if crm is None:
        return Verdict(False, consumer, f"project '{project}''s number is unknown")
    try:
        number = project_number(crm, project)
    except ApiError as err:
        return Verdict(False, consumer, f"project '{project}''s number could not be read "
                       f"({err.code} {err.status} from Cloud Resource Manager)")
    if number != m.group(1):
        return Verdict(False, consumer, f"project '{project}' is number {number}")
    return Verdict(True, consumer, "")


def project_number(crm: GoogleApi, project: str) -> str:
    """The project's number (Cloud Resource Manager v1 projects.get), from an answer that is
    that very project (its projectId), or ApiError."""
    action = f"get project {project}"
    data = crm.request("GET", f"v1/projects/{project}", action=action)
    number = data.get("projectNumber")
    if data.get("projectId") != project or not (isinstance(number, str) and number.isdigit()):
        raise ApiError(200, "OK", f"the answer is not project {project} with a number",
                       action=action, service=crm.service, hint="")
    return number


def unproven_line(project: str, service: str, verdict: Verdict) -> str:
    """What a refusal says about a SERVICE_DISABLED that proves nothing (one line's clause)."""
    consumer = verdict.consumer or "none named"
    return (f"{service}.googleapis.com says it is not enabled (SERVICE_DISABLED) for "
            f"consumer {consumer}, which is not provably project '{project}' ({verdict.why}); "
            "that consumer may be the caller's quota project (gcloud config get "
            "billing/quota_project, or the application-default credentials' quota project), "
            f"so it proves nothing about project '{project}'")


def proves_off(exc: ApiError, project: str, crm: GoogleApi | None) -> bool:
    """True when `exc` proves its API is off in `project` itself (nothing of it exists there);
    False when it does not claim so; UnprovenAnswer (one line) when it claims so without proof."""
    if not says_disabled(exc):
        return False
    verdict = disabled_in(exc, project, exc.service, crm)
    if verdict.proven:
        return True
    raise UnprovenAnswer(exc.code, unproven_line(project, exc.service, verdict),
                         action=exc.action, service=exc.service, status=exc.status)
