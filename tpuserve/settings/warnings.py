"""Soft rules: settings that synth accepts but that a user should hear about (printed at synth)."""

from __future__ import annotations

import ipaddress

from tpuserve.facts import HOURS_PER_MONTH
from tpuserve.prices import CATALOG_MAX_AGE_DAYS, catalog_age_days, default_catalog_file
from tpuserve.settings import measured_rules
from tpuserve.settings.deployment import Deployment
from tpuserve.settings.fleet import PLACEHOLDER_DIGEST
from tpuserve.zones import Offer, stack_zones


def _unpriced(d: Deployment) -> list[str]:
    """A provisioning model no source prices for this accelerator in this region: its figures
    stand on [pricing]'s default, SPEC 2's v5e us-west4 price, until [pricing] sets one. A
    warning, not a refusal: no public source prices flex-start outside SPEC 2, and a stack
    that can be deployed is not refused for a missing price (the guard bounds its hours)."""
    out = []
    accel = d.tpu.accelerator_type
    for key in d.price_keys:
        if key in d.pricing.model_fields_set or d.book_price(key) is not None:
            continue
        out.append(
            f"pricing.{key} = {getattr(d.pricing, key)}: no source prices {accel} {key} in "
            f"{d.region} (the refreshed Catalog file, the shipped snapshot and SPEC 2 name "
            f"none); this is SPEC 2's v5e us-west4 figure standing in, so every $/hour and "
            f"$/M-token figure of the stack is a stand-in until [pricing] {key} is set "
            f"(or `tpuserve prices refresh` finds a price)")
    return out


def _stale_catalog(d: Deployment) -> list[str]:
    """A refreshed file past its 30 days is not used: say so, and which prices stand."""
    age = catalog_age_days(d.pricing.catalog_path)
    if age is None or age < CATALOG_MAX_AGE_DAYS:
        return []
    path = d.pricing.catalog_path or default_catalog_file()
    return [(f"pricing.catalog_file = {str(path)!r}: read from the Catalog {age:.0f} days ago "
             f"(over {CATALOG_MAX_AGE_DAYS}): not used; the shipped snapshot prices the "
             "stack until `tpuserve prices refresh` rewrites it")]


def deployment_warnings(d: Deployment) -> list[str]:
    """Soft rules of the settings themselves (capacity ones: tpuserve.settings.loader)."""
    # The measured ones first (settings/measured_rules.py), then the rest below.
    out = measured_rules.warnings_of("vllm", dict(d.vllm))
    if d.kind.billing_guard and d.stack.max_run_hours == 0:
        monthly = d.usd_per_hour * HOURS_PER_MONTH
        out.append(
            f"stack.max_run_hours = 0: the billing guard is off; {d.stack.provisioning_model} "
            f"bills ${d.usd_per_hour:.4f}/h until deleted, ${monthly:,.0f} a month (SPEC 7)"
        )
    if d.has_billing_guard and d.gcp.tpu_api_endpoint is not None:
        out.append(
            f"gcp.tpu_api_endpoint = {d.gcp.tpu_api_endpoint!r}: the billing guard's task calls "
            "it, but Cloud Tasks dispatches HTTP targets to endpoints with a public IP address "
            "(cloud.google.com/tasks/docs/creating-http-target-tasks) and a Private Service "
            "Connect endpoint's address and name are internal to its VPC (cloud.google.com/vpc/"
            "docs/about-accessing-google-apis-endpoints): not verified here; check that the "
            "guard deletes a test node before relying on it, or unset it for "
            "https://tpu.googleapis.com/"
        )
    out += _unpriced(d) + _stale_catalog(d)
    if d.gcp.network is not None and d.gcp.network.rsplit("/", 1)[-1] == "default":
        out.append(
            "gcp.network = 'default': its pre-made rules (default-allow-ssh, -rdp, -icmp from "
            "0.0.0.0/0) apply to the node and its external IP next to tpuserve's own; unset "
            "gcp.network to let tpuserve create a network whose only rules are its own"
        )
    if not d.access.api_key_proxy and any(
        ipaddress.ip_network(r).prefixlen == 0 for r in d.access.api_source_ranges
    ):
        out.append(
            "access.api_key_proxy = false with port "
            f"{d.vllm.port} open to {d.access.api_source_ranges}: /metrics, /tokenize and /v1 "
            "are reachable by anyone; keep the proxy or front the node with your own gateway"
        )
    if d.access.api_source_ranges and not d.access.tls_on:
        why = ("access.tls = 'off'" if d.access.api_key_proxy
               else "access.api_key_proxy = false (the proxy terminates TLS)")
        out.append(
            f"{why} with port {d.vllm.port} open to {d.access.api_source_ranges}: the API key "
            "and every prompt and answer cross the network in clear text; keep the proxy and "
            "access.tls = 'self-signed' (the default)"
        )
    out += zone_warnings(d)
    out += measured_rules.warnings_of("tpu", dict(d.tpu))
    return out + fleet_warnings(d)


def zone_warnings(d: Deployment) -> list[str]:
    """A zone no source says offers what the stack asks of it (tpuserve/zones.py: a TPU VM's
    provisioning model, or each fleet node pool's): it may work, and a refused create fails
    only at deploy."""
    accel, out = d.tpu.accelerator_type, []
    pools = d.fleet.provisioning if d.fleet is not None else ()
    for need in stack_zones(d.kind, accel, d.gcp.zone, pools):
        if need.fact.state is not Offer.UNKNOWN:
            continue
        by_source: dict[str, list[str]] = {}
        for zone, why in need.known_good.items():
            by_source.setdefault(why, []).append(zone)
        good = "; ".join(f"{', '.join(zones)} ({why})" for why, zones in by_source.items()) or (
            "none in tpuserve/zones.py")
        out.append(
            f"gcp.zone = {d.gcp.zone!r}: {need.what} acceptance of {accel} is unknown there "
            f"(known good: {good}); a create that is refused fails at deploy (SPEC 2: quota in "
            "a zone says nothing about whether a provisioning model is accepted); "
            f"[stacks.{d.name}] enabled = false leaves this stack out"
        )
    return out


def fleet_warnings(d: Deployment) -> list[str]:
    """The fleet's soft rules: an image without its real digest, a Gateway without TLS."""
    if not d.kind.on_gke:
        return []
    out = []
    if "@sha256:" not in d.vllm.image or d.vllm.image.endswith(PLACEHOLDER_DIGEST):
        out.append(
            f"vllm.image = {d.vllm.image!r}: the fleet runs an image pinned by its real digest "
            "(repo@sha256:...; the compile-cache key must change with the image's content, "
            "and a pod cannot know a tag's digest before it starts); `cdktf deploy fleet` "
            "refuses it until you set one (`docker buildx imagetools inspect IMAGE`)"
        )
    if d.fleet.domain is None:
        out.append(
            "fleet.domain is unset: the Gateway serves plain HTTP on its address, so the API "
            "key and every prompt cross the network in clear text; set a domain you control "
            "for a Google-managed certificate (HTTPS on 443)"
        )
    return out
