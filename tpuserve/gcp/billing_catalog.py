"""The Cloud Billing Catalog API v1 (cloudbilling.v1 discovery document): every SKU of the
services that price Cloud TPU, page by page, through the project's Google API edge (ADC, one
deadline over every call, one-line errors).

  GET v1/services/{serviceId}/skus?pageSize=N[&pageToken=T] -> ListSkusResponse
      {"skus": [Sku], "nextPageToken": string}

Service ids: Compute Engine 6F81-5844-456A holds the TPU v5e/v6e SKUs and Cloud TPU
E000-3F24-B8AA the older TPUs' (as SkyPilot's catalog fetcher reads them, skypilot-org/
skypilot sky/catalog/data_fetchers/fetch_gcp.py; cloud.google.com/skus lists both).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuserve.gcp.api import GoogleApi, UnprovenAnswer, json_kind, not_a_list_answer
from tpuserve.gcp.endpoints import CLOUDBILLING_API
from tpuserve.prices.skus import Parsed, SkuRefused, parse_skus
from tpuserve.prices.table import write_catalog

SERVICE = "cloudbilling"
TPU_SERVICES = ("services/6F81-5844-456A", "services/E000-3F24-B8AA")
PAGE_SIZE = 5000  # the documented default and the largest page (how-tos/catalog-api)
MAX_PAGES = 100  # ~500,000 SKUs: a server that never stops paging is cut, not followed


def catalog_api(environ: Mapping[str, str] | None = None, **kwargs: Any) -> GoogleApi:
    return GoogleApi(SERVICE, CLOUDBILLING_API, environ=environ, **kwargs)


def skus(api: GoogleApi, parent: str, *, page_size: int = PAGE_SIZE) -> Iterator[Any]:
    """Every SKU of one service, following nextPageToken; an answer that is not a list answer,
    a `skus` that is not a list, a repeated token or too many pages is an UnprovenAnswer."""
    token: str | None = None
    tokens: set[str] = set()
    for page in range(1, MAX_PAGES + 1):
        params: dict[str, Any] = {"pageSize": page_size}
        if token:
            params["pageToken"] = token
        action = f"list the SKUs of {parent} (page {page})"
        answer = api.request("GET", f"v1/{parent}/skus", params=params, action=action)
        why = not_a_list_answer(answer, ("skus", "nextPageToken"))
        items = answer.get("skus", [])
        if why is None and not isinstance(items, list):
            why = f"its skus is {json_kind(items)}, not a list"
        token = answer.get("nextPageToken") or None
        if why is None and token is not None and not isinstance(token, str):
            why = f"its nextPageToken is {json_kind(token)}"
        if why is None and token in tokens:
            why = "its nextPageToken repeats an earlier page's: the pages would never end"
        if why is not None:
            raise UnprovenAnswer(200, why, action=action, service=SERVICE)
        yield from items
        if token is None:
            return
        tokens.add(token)
    raise UnprovenAnswer(200, f"still paging after {MAX_PAGES} pages of {page_size}: cut, the "
                         "list proves nothing", action=f"list the SKUs of {parent}",
                         service=SERVICE)


@dataclass(frozen=True)
class Refreshed:
    """What `tpuserve prices refresh` wrote."""

    path: Path
    prices: int  # entries written: (accelerator type, region, provisioning model)
    skus: int  # SKUs read
    unmatched: int  # SKUs naming no TPU v5e/v6e: skipped
    commitments: int  # TPU v5e/v6e commitment SKUs: skipped
    read_at: dt.datetime

    def as_json(self) -> dict[str, Any]:
        return {"ok": True, "catalog_file": str(self.path), "prices": self.prices,
                "skus": self.skus, "skipped_unmatched": self.unmatched,
                "skipped_commitments": self.commitments,
                "read_at": self.read_at.strftime("%Y-%m-%dT%H:%M:%SZ")}


def refresh(api: GoogleApi, path: Path, *, deadline_s: float,
            now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> Refreshed:
    """Read every TPU SKU within `deadline_s` (every call and retry beneath it), then write the
    dated file atomically. Nothing is written unless every page was read and parsed, and at
    least one TPU v5e/v6e price was found (an answer without one proves nothing)."""
    parsed = Parsed()
    hint = "the Catalog did not answer in time: try again, or give it more --timeout"
    with api.deadline_within(deadline_s, hint=hint):
        for parent in TPU_SERVICES:
            parse_skus(skus(api, parent), parsed)
    if not parsed.prices:
        raise SkuRefused(
            f"no TPU v5e or v6e price among the {parsed.seen} SKUs of "
            f"{' and '.join(TPU_SERVICES)} ({parsed.commitments} commitment SKUs): an answer "
            f"without one proves nothing; {path} is not written")
    read_at = now()
    written = write_catalog(path, [(k, usd, sku) for k, (usd, sku) in parsed.prices.items()],
                            read_at=read_at, services=TPU_SERVICES,
                            skipped=parsed.unmatched + parsed.commitments)
    return Refreshed(path, written, parsed.seen, parsed.unmatched, parsed.commitments, read_at)
