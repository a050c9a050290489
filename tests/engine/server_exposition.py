"""Stand-ins for vLLM's and SGLang's `/metrics`, made the way the servers make theirs: families
registered with prometheus_client under the servers' names, documentation and label sets, children
created at start (so counters are present at 0), exposed by `generate_latest` (HELP and TYPE lines,
`_created` samples where the server runs prometheus_client in one process). Helpers only.

vLLM V1 (vllm/v1/metrics/loggers.py, perf.py): labels model_name and engine; the byte and FLOP
counters are registered whether or not --enable-mfu-metrics is given (they only move with it); the
speculative-decoding counters only with a speculative config; the default registry's process
collector gives process_start_time_seconds. SGLang (srt/metrics/collector.py): scheduler gauges
and counters labelled model_name, engine_type, tp_rank, pp_rank (dp_rank with data parallelism),
repeated by every tensor-parallel rank; with --enable-priority-scheduling a priority label, the
total being the priority="" series; spec_accept_rate and spec_accept_length set to 0 while it does
not speculate; the tokenizer's histograms labelled model_name and is_streaming; the multiprocess
collector it runs under publishes no process_start_time_seconds and no `_created` samples."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)


def _text(registry: CollectorRegistry, created: bool = True) -> str:
    text = generate_latest(registry).decode()
    if created:
        return text
    # a multiprocess collector writes no `_created` families
    lines, skip = [], False
    for line in text.splitlines():
        if line.startswith("# HELP "):
            skip = line.split()[2].endswith("_created")
        if not skip:
            lines.append(line)
    return "\n".join(lines) + "\n"


class VllmMetrics:
    """vLLM V1's families for one model over `engines` (data-parallel engine indexes)."""

    def __init__(self, model: str = "m", engines=(0,), mfu: bool = False, speculative: bool = False):
        self.model, self.engines, self.mfu = model, [str(e) for e in engines], mfu
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)  # process_start_time_seconds, as vLLM's default registry has
        labels = ["model_name", "engine"]

        def per_engine(metric):
            return {e: metric.labels(model, e) for e in self.engines}
        self.running = per_engine(Gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                                        labels, registry=r))
        self.waiting = per_engine(Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                                        labels, registry=r))
        self.kv = per_engine(Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                                   labels, registry=r))
        self.prompt = per_engine(Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels,
                                         registry=r))
        self.generation = per_engine(Counter("vllm:generation_tokens", "Number of generation tokens processed.",
                                             labels, registry=r))
        self.preemptions = per_engine(Counter("vllm:num_preemptions", "Cumulative number of preemption from the "
                                              "engine.", labels, registry=r))
        self.ttft = per_engine(Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token "
                                         "in seconds.", labels, buckets=TTFT_BUCKETS, registry=r))
        self.itl = per_engine(Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency "
                                        "in seconds.", labels, buckets=TTFT_BUCKETS, registry=r))
        doc = "(for Model Flops Utilization calculations)."
        self.flops = per_engine(Counter("vllm:estimated_flops_per_gpu", "Estimated number of floating point "
                                        f"operations per GPU {doc}", labels, registry=r))
        self.read = per_engine(Counter("vllm:estimated_read_bytes_per_gpu", "Estimated number of bytes read from "
                                       f"memory per GPU {doc}", labels, registry=r))
        self.write = per_engine(Counter("vllm:estimated_write_bytes_per_gpu", "Estimated number of bytes written "
                                        f"to memory per GPU {doc}", labels, registry=r))
        self.drafts = self.accepted = None
        if speculative:
            self.drafts = per_engine(Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", labels,
                                             registry=r))
            self.accepted = per_engine(Counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted "
                                               "tokens.", labels, registry=r))

    def decode(self, tokens: int, engine: int = 0, read_bytes_per_token: float = 1e9, running: int = 1,
               prompt: int = 0) -> None:
        e = str(engine)
        self.running[e].set(running)
        self.generation[e].inc(tokens)
        self.prompt[e].inc(prompt)
        if self.mfu:  # the perf stats are computed (and counted) only with --enable-mfu-metrics
            self.read[e].inc(tokens * read_bytes_per_token)
            self.write[e].inc(tokens * 1e6)
            self.flops[e].inc(tokens * 2e9)

    def text(self) -> str:
        return _text(self.registry)


class SglangMetrics:
    """SGLang's scheduler families (one series set per tensor-parallel rank) and tokenizer ones."""

    def __init__(self, model: str = "m", tp_ranks=(0, 1), priorities: tuple[str, ...] = (),
                 speculative: bool = False):
        self.model, self.tp_ranks, self.priorities, self.speculative = model, [str(t) for t in tp_ranks], \
            priorities, speculative
        r = self.registry = CollectorRegistry()
        labels = ["model_name", "engine_type", "tp_rank", "pp_rank"]
        queue_labels = labels + (["priority"] if priorities else [])

        def gauge(name, doc, names=labels):
            return Gauge(name, doc, names, registry=r, multiprocess_mode="mostrecent")
        self.running = gauge("sglang:num_running_reqs", "The number of running requests.", queue_labels)
        self.queue = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", queue_labels)
        self.token_usage = gauge("sglang:token_usage", "The token usage.")
        self.accept_length = gauge("sglang:spec_accept_length", "The average acceptance length of speculative "
                                   "decoding.")
        self.accept_rate = gauge("sglang:spec_accept_rate", "The average acceptance rate of speculative decoding "
                                 "(`accepted tokens / total draft tokens` in batch).")
        self.realtime = Counter("sglang:realtime_tokens", "Total number of tokens processed (updated on each log "
                                "interval). mode: prefill_compute, prefill_cache, decode.", labels + ["mode"],
                                registry=r)
        self.prompt_total = Counter("sglang:prompt_tokens", "Number of prefill tokens processed.", ["model_name"],
                                    registry=r)
        self.generation_total = Counter("sglang:generation_tokens", "Number of generation tokens processed.",
                                        ["model_name"], registry=r)
        self.prompt_total.labels(model)
        self.generation_total.labels(model)
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              ["model_name", "is_streaming"], buckets=TTFT_BUCKETS, registry=r)
        for rank in self.tp_ranks:
            for mode in ("prefill_compute", "prefill_cache", "decode"):
                self.realtime.labels(*self._labels(rank), mode)
        self.log_stats(running={"": 0}, queue={"": 0})

    def _labels(self, rank: str) -> list[str]:
        return [self.model, "unified", rank, "0"]

    def log_stats(self, running: dict[str, int], queue: dict[str, int], token_usage: float = 0.1,
                  accept_length: float = 0.0, accept_rate: float = 0.0) -> None:
        """One scheduler log interval, written by every rank. `running`/`queue`: priority -> count
        ("" the total; without priority scheduling only it is written, unlabelled)."""
        if not self.speculative:
            accept_length = accept_rate = 0.0  # what SGLang sets while it does not speculate
        for rank in self.tp_ranks:
            base = self._labels(rank)
            for gauge, values in ((self.running, running), (self.queue, queue)):
                for priority, value in values.items():
                    if self.priorities:
                        gauge.labels(*base, priority).set(value)
                    elif priority == "":
                        gauge.labels(*base).set(value)
            self.token_usage.labels(*base).set(token_usage)
            self.accept_length.labels(*base).set(accept_length)
            self.accept_rate.labels(*base).set(accept_rate)

    def decode(self, tokens: int, prompt: int = 0) -> None:
        for rank in self.tp_ranks:
            self.realtime.labels(*self._labels(rank), "decode").inc(tokens)
            self.realtime.labels(*self._labels(rank), "prefill_compute").inc(prompt)

    def text(self) -> str:
        return _text(self.registry, created=False)
