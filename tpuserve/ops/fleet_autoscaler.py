"""The fleet's HorizontalPodAutoscaler as the CLI shows it: replicas and each metric against
its target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .kube_fields import as_int as _int
from .kube_fields import dig as _d
from .kube_fields import dig_list as _list
from .kube_fields import parse_quantity


@dataclass(frozen=True)
class MetricView:
    name: str
    kind: str  # Pods, External, Object, Resource
    current: float | None
    target: float | None
    target_type: str  # AverageValue, Value, Utilization

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.kind, "current": self.current,
                "target": self.target, "target_type": self.target_type}


@dataclass(frozen=True)
class HpaView:
    min_replicas: int
    max_replicas: int
    current_replicas: int
    desired_replicas: int
    metrics: list[MetricView]

    def to_json(self) -> dict[str, Any]:
        return {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                "current_replicas": self.current_replicas,
                "desired_replicas": self.desired_replicas,
                "metrics": [m.to_json() for m in self.metrics]}


def _metric_source(m: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    kind = str(m.get("type") or "")
    key = kind[:1].lower() + kind[1:]  # Pods -> pods, ContainerResource -> containerResource
    src = m.get(key) if isinstance(m.get(key), dict) else {}
    name = _d(src, "metric", "name") or src.get("name") or "?"
    return kind, str(name), src


def _value(block: Any) -> tuple[float | None, str]:
    if not isinstance(block, dict):
        return None, ""
    if "averageUtilization" in block:
        return parse_quantity(block.get("averageUtilization")), "Utilization"
    for key, label in (("averageValue", "AverageValue"), ("value", "Value")):
        if key in block:
            return parse_quantity(block.get(key)), label
    return None, str(block.get("type") or "")


def hpa_view(obj: dict[str, Any]) -> HpaView:
    current = {}
    for m in _list(obj, "status", "currentMetrics"):
        if isinstance(m, dict):
            kind, name, src = _metric_source(m)
            current[(kind, name)] = _value(src.get("current"))[0]
    metrics = []
    for m in _list(obj, "spec", "metrics")[:10]:
        if isinstance(m, dict):
            kind, name, src = _metric_source(m)
            target, ttype = _value(src.get("target"))
            metrics.append(MetricView(name, kind, current.get((kind, name)), target, ttype))
    return HpaView(
        min_replicas=_int(_d(obj, "spec", "minReplicas")) or 1,
        max_replicas=_int(_d(obj, "spec", "maxReplicas")),
        current_replicas=_int(_d(obj, "status", "currentReplicas")),
        desired_replicas=_int(_d(obj, "status", "desiredReplicas")),
        metrics=metrics,
    )
