"""From successive scrapes to the series the dashboard plots: one `ScrapeRecord` per scrape, with
counters turned into rates over the scrape interval, histogram percentiles over the last minute,
and byte/FLOP counters into GB/s, TFLOP/s, MBU and MFU against the GPU's peak.

A counter that goes down means the server restarted: that record has no rates (never a negative or
a spike) and the next interval starts from the new counters. A failed scrape is a gap (nan), and
the scrape after it only sets the baseline."""
from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field

from engine.attach.exposition import Labels, Scrape, bucket_counts, histogram_quantile
from engine.attach.peak import GpuPeak
from engine.attach.servers import SERVERS, UNKNOWN_SERVER, ServerMetrics, split_ref

LATENCY_WINDOW_S = 60.0  # percentiles cover the requests seen in the last minute
NAN = math.nan
RESTARTED = "the server restarted (its counters began again): rates resume at the next scrape"


@dataclass(frozen=True)
class ScrapeRecord:
    """One scrape's figures; nan where the server does not say or the interval has no rate."""
    t_s: float  # time.monotonic() of the scrape
    status: str  # "ok" | "baseline" (first answer: gauges only) | "restarted" | "down" | "bad answer"
    message: str = ""  # one line when status is not ok
    kind: str = ""  # "vllm" | "sglang" | "llamacpp"
    interval_s: float = NAN
    generation_tokens: float = NAN  # generated in the interval, every request together
    generation_tokens_per_s: float = NAN
    prompt_tokens_per_s: float = NAN
    prompt_tokens_meaning: str = ""  # what the server's prompt counter counts (cache hits or not)
    running: float = NAN
    waiting: float = NAN
    kv_cache_usage: float = NAN  # fraction of the KV cache in use
    ttft_p50_s: float = NAN
    ttft_p95_s: float = NAN
    itl_p50_s: float = NAN
    itl_p95_s: float = NAN
    e2e_p50_s: float = NAN
    e2e_p95_s: float = NAN
    preemptions: float = NAN  # in the interval
    spec_acceptance: float = NAN  # accepted / proposed draft tokens
    gbs: float = NAN  # per GPU, the server's estimate
    tflops: float = NAN
    mbu: float = NAN  # gbs over the GPU's peak bandwidth
    mfu: float = NAN
    ceiling_tokens_per_s: float = NAN  # peak bandwidth / the server's bytes per generated token (decode-only intervals)
    engines: dict[str, dict[str, float]] = field(default_factory=dict)  # per data-parallel engine
    gpus: dict[str, dict[str, float]] = field(default_factory=dict)  # per GPU series of the byte counters

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self, t0_s: float = 0.0) -> dict:
        """JSON-ready (nan becomes None); t_s relative to t0_s."""
        def clean(value):
            if isinstance(value, float) and not math.isfinite(value):
                return None
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items()}
            return value
        out = {k: clean(v) for k, v in asdict(self).items()}
        out["t_s"] = round(self.t_s - t0_s, 4)
        return out


def _engine_key(labels: Labels, engine_label: str | None) -> str:
    return dict(labels).get(engine_label, "") if engine_label else ""


class SeriesBuilder:
    """Feed it every scrape (`add`) and every failure (`gap`); it keeps what the rates need."""

    def __init__(self, peak: GpuPeak | None = None):
        self.peak = peak
        self.previous: Scrape | None = None
        self._history: deque[Scrape] = deque()  # scrapes of the last LATENCY_WINDOW_S

    def gap(self, t_s: float, status: str, message: str) -> ScrapeRecord:
        """A scrape that failed: nothing is known for it, and the next one only sets a baseline."""
        self.previous = None
        self._history.clear()
        return ScrapeRecord(t_s=t_s, status=status, message=message)

    def add(self, scrape: Scrape) -> ScrapeRecord:
        server = SERVERS.get(scrape.kind)
        if server is None:
            return self.gap(scrape.t_s, "bad answer", UNKNOWN_SERVER)
        previous = self.previous
        if previous is not None and (previous.kind != scrape.kind or _restarted(previous, scrape)):
            self.previous = None
            self._history.clear()
            status, message, previous = "restarted", RESTARTED, None
        else:
            status, message = ("baseline", "first answer: rates start at the next scrape") if previous is None \
                else ("ok", "")
        self.previous = scrape
        self._history.append(scrape)
        while self._history and self._history[0].t_s < scrape.t_s - LATENCY_WINDOW_S:
            self._history.popleft()
        figures = _gauges(server, scrape)
        figures.update(_latencies(server, self._history[0], scrape))
        if previous is not None:
            rates = _rates(server, previous, scrape, self.peak)
            for key, per_engine in rates.pop("engines", {}).items():
                figures.setdefault("engines", {}).setdefault(key, {}).update(per_engine)
            figures.update(rates)
        return ScrapeRecord(t_s=scrape.t_s, status=status, message=message, kind=scrape.kind, **figures)


def _restarted(previous: Scrape, scrape: Scrape) -> bool:
    """The process start changed, or a counter went down."""
    if previous.start_marker is not None and scrape.start_marker is not None \
            and previous.start_marker != scrape.start_marker:
        return True
    for name, series in scrape.values.items():
        if not name.endswith(("_total", "_count", "_bucket")) or name == "llamacpp:slot_decode_steps_total":
            continue  # (the derived llama.cpp count is a product of rounded figures: it may dip by one)
        before = previous.values.get(name, {})
        if any(value < before.get(labels, 0.0) for labels, value in series.items()):
            return True
    return False


def _pick(scrape: Scrape, refs: tuple[str, ...], replica_labels: tuple[str, ...] = ()) -> dict[Labels, float] | None:
    """The series of the first ref the scrape has (label filter applied; of ranks that repeat one
    engine's figures, the lowest only; of per-priority series, the total), or None."""
    return _pick_ref(scrape, refs, replica_labels)[1]


def _pick_ref(scrape: Scrape, refs: tuple[str, ...],
              replica_labels: tuple[str, ...] = ()) -> tuple[str, dict[Labels, float] | None]:
    """(the ref, its series) as `_pick` chooses them; ("", None) when the scrape has none."""
    for ref in refs:
        name, selector = split_ref(ref)
        series = scrape.series(name)
        if selector is not None:
            series = {labels: v for labels, v in series.items() if dict(labels).get(selector[0]) == selector[1]}
        if series:
            return ref, _dedupe(totals_only(series), replica_labels)
    return "", None


def totals_only(series: dict[Labels, float]) -> dict[Labels, float]:
    """SGLang with --enable-priority-scheduling publishes a series per request priority beside their
    total, the `priority=""` series: the total alone, so nothing is counted twice."""
    total = {labels: v for labels, v in series.items() if dict(labels).get("priority", None) == ""}
    return total or series


def _dedupe(series: dict[Labels, float], replica_labels: tuple[str, ...]) -> dict[Labels, float]:
    if not replica_labels:
        return series
    kept: dict[Labels, tuple[tuple, Labels]] = {}
    for labels in series:
        rest = tuple((k, v) for k, v in labels if k not in replica_labels)
        rank = tuple(_as_rank(v) for k, v in labels if k in replica_labels)
        if rest not in kept or rank < kept[rest][0]:
            kept[rest] = (rank, labels)
    return {labels: series[labels] for _, labels in kept.values()}


def _as_rank(value: str) -> tuple[int, str]:
    return (int(value), "") if value.isdigit() else (1 << 30, value)


def _by_engine(series: dict[Labels, float], engine_label: str | None) -> dict[str, float]:
    totals: dict[str, float] = {}
    for labels, value in series.items():
        key = _engine_key(labels, engine_label)
        totals[key] = totals.get(key, 0.0) + value
    return totals


def _gauges(server: ServerMetrics, scrape: Scrape) -> dict:
    out: dict = {}
    engines: dict[str, dict[str, float]] = {}
    speculating = _pick(scrape, server.spec_active_gauge, server.replica_labels)
    acceptance = server.spec_acceptance_gauge if not server.spec_active_gauge or \
        (speculating and any(v > 0 for v in speculating.values())) else ()  # SGLang's rate reads 0 when off
    for figure, refs, combine in (("running", server.running, sum), ("waiting", server.waiting, sum),
                                  ("kv_cache_usage", server.kv_cache_usage, _mean),
                                  ("spec_acceptance", acceptance, _mean)):
        series = _pick(scrape, refs, server.replica_labels)
        if series is None:
            continue
        per_engine: dict[str, list[float]] = {}
        for labels, value in series.items():
            per_engine.setdefault(_engine_key(labels, server.engine_label), []).append(value)
        for key, values in per_engine.items():
            engines.setdefault(key, {})[figure] = combine(values)
        out[figure] = combine([engines[key][figure] for key in per_engine])
    if server.engine_label and engines:
        out["engines"] = engines
    return out


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else NAN


def _latencies(server: ServerMetrics, oldest: Scrape, scrape: Scrape) -> dict:
    """p50/p95 of what the histograms observed since `oldest` (or since the server started, when
    `oldest` is this scrape: the first answer)."""
    out = {}
    for figure, refs in (("ttft", server.ttft), ("itl", server.itl), ("e2e", server.e2e)):
        for base in refs:
            now = bucket_counts(totals_only(scrape.series(f"{base}_bucket")))
            if not now:
                continue
            if oldest is not scrape:
                before = bucket_counts(totals_only(oldest.series(f"{base}_bucket")))
                now = {bound: count - before.get(bound, 0.0) for bound, count in now.items()}
            out[f"{figure}_p50_s"] = histogram_quantile(0.50, now)
            out[f"{figure}_p95_s"] = histogram_quantile(0.95, now)
            break
    return out


def _delta(server: ServerMetrics, refs: tuple[str, ...], previous: Scrape, scrape: Scrape) -> dict[Labels, float] | None:
    """Per series, how much a counter grew between two scrapes of one server run (a series new
    since the previous scrape started from 0)."""
    now = _pick(scrape, refs, server.replica_labels)
    if now is None:
        return None
    before = _pick(previous, refs, server.replica_labels) or {}
    return {labels: max(value - before.get(labels, 0.0), 0.0) for labels, value in now.items()}


def _rates(server: ServerMetrics, previous: Scrape, scrape: Scrape, peak: GpuPeak | None) -> dict:
    interval_s = scrape.t_s - previous.t_s
    out: dict = {"interval_s": interval_s}
    if not interval_s > 0:
        return out
    generated = _delta(server, server.generation_tokens, previous, scrape)
    if generated is not None:
        out["generation_tokens"] = sum(generated.values())
        out["generation_tokens_per_s"] = out["generation_tokens"] / interval_s
        if server.engine_label:
            out["engines"] = {key: {"generation_tokens_per_s": tokens / interval_s}
                              for key, tokens in _by_engine(generated, server.engine_label).items()}
    prompt = _delta(server, server.prompt_tokens, previous, scrape)
    if prompt is not None:
        out["prompt_tokens_per_s"] = sum(prompt.values()) / interval_s
        out["prompt_tokens_meaning"] = server.prompt_label(_pick_ref(scrape, server.prompt_tokens)[0])
    preempted = _delta(server, server.preemptions, previous, scrape)
    if preempted is not None:
        out["preemptions"] = sum(preempted.values())
    drafted = _delta(server, server.spec_draft_tokens, previous, scrape)
    accepted = _delta(server, server.spec_accepted_tokens, previous, scrape)
    if drafted is not None and accepted is not None and sum(drafted.values()) > 0:
        out["spec_acceptance"] = sum(accepted.values()) / sum(drafted.values())
    out.update(_bandwidth(server, previous, scrape, interval_s, peak))
    tokens = out.get("generation_tokens", 0.0)
    # the seed formula, where the interval only decoded and one GPU series carries the bytes
    if peak is not None and "gbs" in out and "gpus" not in out and tokens > 0 and prompt is not None \
            and sum(prompt.values()) == 0 and out["gbs"] > 0:
        bytes_per_token = out["gbs"] * 1e9 * interval_s / tokens
        out["ceiling_tokens_per_s"] = peak.bandwidth_bps / bytes_per_token
    return out


def _ever_counted(server: ServerMetrics, scrape: Scrape) -> bool:
    """Whether the server's byte or FLOP counters have counted anything since it started: present at
    0 they are switched off (or nothing ran yet), and 0 GB/s would be a figure the server never gave."""
    for refs in (server.read_bytes, server.write_bytes, server.flops):
        series = _pick(scrape, refs, server.replica_labels)
        if series and any(value > 0 for value in series.values()):
            return True
    return False


def _bandwidth(server: ServerMetrics, previous: Scrape, scrape: Scrape, interval_s: float,
               peak: GpuPeak | None) -> dict:
    """GB/s and TFLOP/s per GPU from the server's estimated byte and FLOP counters (one series per
    GPU, or per engine of per-GPU figures); MBU and MFU against the peak where one is known."""
    if not _ever_counted(server, scrape):
        return {}  # vLLM registers them without --enable-mfu-metrics too, and they stay at 0: no figure
    read = _delta(server, server.read_bytes, previous, scrape)
    write = _delta(server, server.write_bytes, previous, scrape)
    flops = _delta(server, server.flops, previous, scrape)
    gpus: dict[str, dict[str, float]] = {}
    for labels in set(read or {}) | set(write or {}) | set(flops or {}):
        key = ",".join(f"{k}={v}" for k, v in labels if k != "model_name") or "gpu"
        gpu = gpus.setdefault(key, {})
        if read is not None or write is not None:
            moved = (read or {}).get(labels, 0.0) + (write or {}).get(labels, 0.0)
            gpu["gbs"] = moved / interval_s / 1e9
        if flops is not None:
            gpu["tflops"] = flops.get(labels, 0.0) / interval_s / 1e12
    if not gpus:
        return {}
    out: dict = {"gpus": gpus} if len(gpus) > 1 else {}
    gbs = [g["gbs"] for g in gpus.values() if "gbs" in g]
    tflops = [g["tflops"] for g in gpus.values() if "tflops" in g]
    if gbs:
        out["gbs"] = _mean(gbs)
        if peak is not None:
            out["mbu"] = out["gbs"] / peak.bandwidth_gbs
    if tflops:
        out["tflops"] = _mean(tflops)
        if peak is not None and peak.flops:
            out["mfu"] = out["tflops"] * 1e12 / peak.flops
    return out
