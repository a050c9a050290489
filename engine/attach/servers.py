"""What each serving engine calls the figures the dashboard shows, the labels that split them per
engine, and the server flags that turn them on (see docs/attach.md for where each comes from)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerMetrics:
    """Sample names per figure; the first one a scrape has is used. A name may carry one label
    filter, `name{label=value}`. Counters are rated over the scrape interval; gauges are read;
    histograms (base names) give percentiles."""
    label: str  # "vLLM"
    generation_tokens: tuple[str, ...]  # counters
    prompt_tokens: tuple[str, ...]
    running: tuple[str, ...]  # gauges
    waiting: tuple[str, ...]
    kv_cache_usage: tuple[str, ...]  # gauges, fraction 0..1 of the KV cache in use
    ttft: tuple[str, ...] = ()  # histograms, seconds
    itl: tuple[str, ...] = ()
    e2e: tuple[str, ...] = ()
    preemptions: tuple[str, ...] = ()  # counter
    spec_draft_tokens: tuple[str, ...] = ()  # counters: proposed and accepted draft tokens
    spec_accepted_tokens: tuple[str, ...] = ()
    spec_acceptance_gauge: tuple[str, ...] = ()  # where the server publishes the rate itself
    spec_active_gauge: tuple[str, ...] = ()  # above 0 only while it speculates (the rate reads 0 when off)
    flops: tuple[str, ...] = ()  # counters, per GPU: the server's own estimate
    read_bytes: tuple[str, ...] = ()
    write_bytes: tuple[str, ...] = ()
    engine_label: str | None = None  # splits a data-parallel server into its engines
    replica_labels: tuple[str, ...] = ()  # ranks that repeat one engine's scheduler figures
    metrics_flag: str = ""  # how to start the server so that /metrics answers
    bytes_flag: str | None = None  # what adds the byte and FLOP counters; None: the server has none
    live_note: str = ""  # how live its token counter is, where it matters
    prompt_meaning: tuple[tuple[str, str], ...] = ()  # prompt_tokens ref -> what its tok/s counts

    @property
    def bytes_hint(self) -> str:
        """What to do for GB/s, TFLOP/s, MBU and MFU when the counters are missing."""
        if self.bytes_flag is None:
            return f"{self.label} publishes no byte or FLOP counters: no GB/s, MBU or MFU"
        return f"start {self.label} with {self.bytes_flag} for GB/s, TFLOP/s, MBU and MFU (server's estimate)"

    def prompt_label(self, ref: str) -> str:
        """What 'prompt tok/s' counts on this server when read from `ref` ("" if unknown)."""
        return dict(self.prompt_meaning).get(ref, "")


SERVERS: dict[str, ServerMetrics] = {
    "vllm": ServerMetrics(
        label="vLLM",
        generation_tokens=("vllm:generation_tokens_total",),
        prompt_tokens=("vllm:prompt_tokens_total",),
        running=("vllm:num_requests_running",),
        waiting=("vllm:num_requests_waiting",),
        kv_cache_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        ttft=("vllm:time_to_first_token_seconds",),
        itl=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        e2e=("vllm:e2e_request_latency_seconds",),
        preemptions=("vllm:num_preemptions_total",),
        spec_draft_tokens=("vllm:spec_decode_num_draft_tokens_total",),
        spec_accepted_tokens=("vllm:spec_decode_num_accepted_tokens_total",),
        flops=("vllm:estimated_flops_per_gpu_total",),
        read_bytes=("vllm:estimated_read_bytes_per_gpu_total",),
        write_bytes=("vllm:estimated_write_bytes_per_gpu_total",),
        engine_label="engine",
        metrics_flag="(on by default: /metrics on the API port)",
        bytes_flag="--enable-mfu-metrics",  # (the counters are there without it, at 0)
        prompt_meaning=(("vllm:prompt_tokens_total", "prefix-cache hits included"),),
    ),
    "sglang": ServerMetrics(
        label="SGLang",
        # realtime_tokens_total moves every scheduler log interval; generation_tokens_total only
        # when a request finishes
        generation_tokens=("sglang:realtime_tokens_total{mode=decode}", "sglang:generation_tokens_total"),
        prompt_tokens=("sglang:realtime_tokens_total{mode=prefill_compute}", "sglang:prompt_tokens_total"),
        running=("sglang:num_running_reqs",),
        waiting=("sglang:num_queue_reqs",),
        kv_cache_usage=("sglang:token_usage",),
        ttft=("sglang:time_to_first_token_seconds",),
        itl=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        e2e=("sglang:e2e_request_latency_seconds",),
        spec_acceptance_gauge=("sglang:spec_accept_rate",),
        spec_active_gauge=("sglang:spec_accept_length",),  # tokens per step: >= 1 while speculating, else 0
        flops=("sglang:estimated_flops_per_gpu_total",),
        read_bytes=("sglang:estimated_read_bytes_per_gpu_total",),
        write_bytes=("sglang:estimated_write_bytes_per_gpu_total",),
        engine_label="dp_rank",
        replica_labels=("tp_rank", "pp_rank", "moe_ep_rank"),
        metrics_flag="--enable-metrics",
        bytes_flag="--enable-mfu-metrics",
        prompt_meaning=(("sglang:realtime_tokens_total{mode=prefill_compute}", "computed: cache hits excluded"),
                        ("sglang:prompt_tokens_total", "per finished request, cache hits included")),
    ),
    "llamacpp": ServerMetrics(
        label="llama.cpp",
        # tokens_predicted_total grows only when a request ends; the decode calls move live (see
        # add_derived)
        generation_tokens=("llamacpp:slot_decode_steps_total", "llamacpp:tokens_predicted_total"),
        prompt_tokens=("llamacpp:prompt_tokens_total",),
        running=("llamacpp:requests_processing",),
        waiting=("llamacpp:requests_deferred",),
        kv_cache_usage=("llamacpp:kv_cache_usage_ratio",),
        spec_draft_tokens=("llamacpp:spec_decode_num_draft_tokens_total",),
        spec_accepted_tokens=("llamacpp:spec_decode_num_accepted_tokens_total",),
        metrics_flag="--metrics",
        prompt_meaning=(("llamacpp:prompt_tokens_total", "evaluated: reused cache excluded"),),
        live_note="tokens/s from decode calls x busy slots (llama.cpp counts a reply's tokens when it ends)",
    ),
}

UNKNOWN_SERVER = "no vLLM, SGLang or llama.cpp metrics in the answer"


def add_derived(kind: str, values: dict[str, dict]) -> None:
    """Counters a server implies but does not print. llama.cpp: busy slots summed over decode
    calls (its per-call average times the call count), which grows by one per generated token of
    each running request while it streams (a prompt that fits one batch yields the first token)."""
    if kind != "llamacpp":
        return
    calls = values.get("llamacpp:n_decode_total", {}).get(())
    per_call = values.get("llamacpp:n_busy_slots_per_decode", {}).get(())
    if calls is not None and per_call is not None:
        values["llamacpp:slot_decode_steps_total"] = {(): float(round(calls * per_call))}


def split_ref(ref: str) -> tuple[str, tuple[str, str] | None]:
    """'name{label=value}' -> ('name', ('label', 'value')); 'name' -> ('name', None)."""
    if not ref.endswith("}"):
        return ref, None
    name, _, selector = ref[:-1].partition("{")
    label, _, value = selector.partition("=")
    return name, (label, value)
