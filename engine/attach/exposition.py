"""One scrape of a server's `/metrics`, parsed with prometheus_client's parser into samples by
name; which server wrote it; and quantiles from cumulative histogram buckets."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from engine.attach.servers import add_derived

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs: a hashable series key


class MetricsError(ValueError):
    """The answer is not Prometheus text exposition (one line for the user)."""


@dataclass(frozen=True)
class Scrape:
    """Every sample of one `/metrics` answer. `values[name][labels]` is a sample's value, for the
    sample's own name (`vllm:generation_tokens_total`, `…_bucket`, `…_count`)."""
    t_s: float  # time.monotonic() when the answer arrived
    values: dict[str, dict[Labels, float]]
    kind: str  # "vllm" | "sglang" | "llamacpp" | "unknown"
    start_marker: float | None = None  # the server process's start time, where it says: a restart changes it
    families: dict[str, str] = field(default_factory=dict)  # family name -> Prometheus type

    def has(self, name: str) -> bool:
        return bool(self.values.get(name))

    def series(self, name: str) -> dict[Labels, float]:
        return self.values.get(name, {})


def parse_metrics(text: str, t_s: float, start_marker: float | None = None) -> Scrape:
    """Parse exposition text; MetricsError when it is not that (an HTML page, a truncated body)."""
    values: dict[str, dict[Labels, float]] = {}
    families: dict[str, str] = {}
    try:
        for family in text_string_to_metric_families(text):
            families[family.name] = family.type
            for sample in family.samples:
                key = tuple(sorted(sample.labels.items()))
                values.setdefault(sample.name, {})[key] = float(sample.value)
    except ValueError as error:
        head = text.lstrip()[:60].splitlines()[0] if text.strip() else ""
        what = "an HTML page" if head.lower().startswith(("<!doctype", "<html")) else f"{head!r}"
        raise MetricsError(f"the answer is not Prometheus metrics ({what}: {error})") from None
    if not values:
        raise MetricsError("the server answered /metrics with no metrics")
    kind = detect_kind(values)
    add_derived(kind, values)
    if start_marker is None:  # prometheus_client's process collector (vLLM, SGLang)
        start = values.get("process_start_time_seconds", {})
        start_marker = next(iter(start.values())) if len(start) == 1 else None
    return Scrape(t_s=t_s, values=values, kind=kind, start_marker=start_marker,
                  families=families)


def detect_kind(values: dict[str, dict]) -> str:
    """The server that wrote these metrics, by the prefix its own metrics carry."""
    prefixes = {name.split(":", 1)[0] for name in values if ":" in name}
    for kind in ("vllm", "sglang", "llamacpp"):
        if kind in prefixes:
            return kind
    return "unknown"


def bucket_counts(series: dict[Labels, float], keep=lambda labels: True) -> dict[float, float]:
    """Cumulative counts by upper bound (`le`) of a `_bucket` sample set, summed over the series
    `keep` accepts (engines, ranks): {0.1: 3, 0.5: 7, inf: 9}."""
    counts: dict[float, float] = {}
    for labels, value in series.items():
        if not keep(labels):
            continue
        le = dict(labels).get("le")
        if le is None:
            continue
        bound = float(le)  # "+Inf" parses to inf
        counts[bound] = counts.get(bound, 0.0) + value
    return counts


def histogram_quantile(q: float, counts: dict[float, float]) -> float:
    """The q-quantile of the observations in cumulative buckets, interpolated linearly inside the
    bucket it falls in (as Prometheus does); nan with no observations. An answer in the +Inf bucket
    is the largest finite bound (all that is known: 'above it')."""
    if not counts:
        return math.nan
    bounds = sorted(counts)
    total = counts[bounds[-1]]
    if not total > 0:
        return math.nan
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound in bounds:
        count = counts[bound]
        if count >= rank and count > lower_count:
            if math.isinf(bound):
                return lower_bound
            if lower_bound == 0.0 and bound <= 0:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = (bound if math.isfinite(bound) else lower_bound), count
    return lower_bound
