"""Attach mode's parsing and rates, over exposition text written here in each server's documented
format (vLLM V1, SGLang, llama.cpp): kinds, rates, counter resets, missing metrics, histograms."""
from __future__ import annotations

import json
import math

import pytest

from engine.attach.client import Scraper, normalise_url
from engine.attach.exposition import MetricsError, bucket_counts, histogram_quantile, parse_metrics
from engine.attach.headless import summary_line
from engine.attach.peak import resolve_peak
from engine.attach.series import SeriesBuilder
from engine.attach.servers import SERVERS

TTFT_BOUNDS = (0.01, 0.05, 0.1, 0.5, 1.0)


def histogram(name: str, labels: str, counts: tuple[int, ...], total_s: float) -> str:
    """A Prometheus histogram: cumulative `counts` per bound of TTFT_BOUNDS, then +Inf (= the last)."""
    lines = [f"# HELP {name} test histogram", f"# TYPE {name} histogram"]
    sep = "," if labels else ""
    for bound, count in zip(TTFT_BOUNDS, counts):
        lines.append(f'{name}_bucket{{{labels}{sep}le="{bound}"}} {count}.0')
    lines.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {counts[-1]}.0')
    lines.append(f"{name}_count{{{labels}}} {counts[-1]}.0")
    lines.append(f"{name}_sum{{{labels}}} {total_s}")
    return "\n".join(lines)


def vllm_text(generated: float, prompt: float, *, engines=("0",), running=1, waiting=0, kv=0.25,
              ttft=(0, 0, 0, 0, 0), itl=(0, 0, 0, 0, 0), mfu: tuple[float, float, float] | None = None,
              start: float = 1.7e9, spec: tuple[float, float] | None = None) -> str:
    """vLLM V1's names and labels (model_name, engine), one series per engine, counters as `_total`."""
    out = [f"process_start_time_seconds {start}"]
    for family, kind, value in (("vllm:num_requests_running", "gauge", running),
                                ("vllm:num_requests_waiting", "gauge", waiting),
                                ("vllm:kv_cache_usage_perc", "gauge", kv),
                                ("vllm:generation_tokens", "counter", generated),
                                ("vllm:prompt_tokens", "counter", prompt),
                                ("vllm:num_preemptions", "counter", 0.0)):
        out += [f"# HELP {family} x", f"# TYPE {family} {kind}"]
        suffix = "_total" if kind == "counter" else ""
        out += [f'{family}{suffix}{{engine="{e}",model_name="m"}} {value}' for e in engines]
    if spec is not None:
        for family, value in (("vllm:spec_decode_num_draft_tokens", spec[0]),
                              ("vllm:spec_decode_num_accepted_tokens", spec[1])):
            out += [f"# TYPE {family} counter", f'{family}_total{{engine="0",model_name="m"}} {value}']
    if mfu is not None:
        for family, value in zip(("vllm:estimated_flops_per_gpu", "vllm:estimated_read_bytes_per_gpu",
                                  "vllm:estimated_write_bytes_per_gpu"), mfu):
            out += [f"# TYPE {family} counter"]
            out += [f'{family}_total{{engine="{e}",model_name="m"}} {value}' for e in engines]
    out.append(histogram("vllm:time_to_first_token_seconds", 'engine="0",model_name="m"', ttft, 0.1))
    out.append(histogram("vllm:inter_token_latency_seconds", 'engine="0",model_name="m"', itl, 0.1))
    return "\n".join(out) + "\n"


def sglang_text(decode: float, prefill: float, finished_tokens: float) -> str:
    """SGLang: scheduler figures per rank (tp_rank repeats them), tokenizer counters per model."""
    out = []
    for tp in ("0", "1"):
        labels = f'dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="{tp}"'
        out += [f"sglang:num_running_reqs{{{labels}}} 3.0", f"sglang:num_queue_reqs{{{labels}}} 2.0",
                f"sglang:token_usage{{{labels}}} 0.5", f"sglang:gen_throughput{{{labels}}} 99.0"]
        out += [f'sglang:realtime_tokens_total{{{labels},mode="decode"}} {decode}',
                f'sglang:realtime_tokens_total{{{labels},mode="prefill_compute"}} {prefill}',
                f'sglang:realtime_tokens_total{{{labels},mode="prefill_cache"}} 1000.0']
    out.insert(0, "# TYPE sglang:realtime_tokens counter")
    out.insert(0, "# TYPE sglang:token_usage gauge")
    out += ["# TYPE sglang:generation_tokens counter",
            f'sglang:generation_tokens_total{{model_name="m"}} {finished_tokens}']
    return "\n".join(out) + "\n"


def llamacpp_text(predicted: float, n_decode: float, busy_per_decode: float, prompt: float = 12.0,
                  processing: float = 1.0) -> str:
    """llama.cpp server's /metrics (with --metrics): counters then gauges, no labels."""
    items = (("prompt_tokens_total", "counter", prompt), ("prompt_seconds_total", "counter", 0.05),
             ("tokens_predicted_total", "counter", predicted), ("tokens_predicted_seconds_total", "counter", 1.5),
             ("n_decode_total", "counter", n_decode), ("n_tokens_max", "counter", 80),
             ("prompt_tokens_seconds", "gauge", 240.0), ("predicted_tokens_seconds", "gauge", 0.0),
             ("requests_processing", "gauge", processing), ("requests_deferred", "gauge", 0.0),
             ("n_busy_slots_per_decode", "gauge", busy_per_decode))
    return "".join(f"# HELP llamacpp:{n} x\n# TYPE llamacpp:{n} {kind}\nllamacpp:{n} {v:g}\n" for n, kind, v in items)


def feed(builder: SeriesBuilder, *texts_at: tuple[float, str], start=None):
    return [builder.add(parse_metrics(text, t, start)) for t, text in texts_at]


# ---- kinds and parsing ------------------------------------------------------------------------

def test_kind_is_detected_from_each_servers_prefix():
    assert parse_metrics(vllm_text(0, 0), 0.0).kind == "vllm"
    assert parse_metrics(sglang_text(0, 0, 0), 0.0).kind == "sglang"
    assert parse_metrics(llamacpp_text(0, 0, 0), 0.0).kind == "llamacpp"
    assert parse_metrics("# TYPE up gauge\nup 1\n", 0.0).kind == "unknown"


@pytest.mark.parametrize("text", ["<!DOCTYPE html><html><body>Login</body></html>", "vllm:x{ 1", "", "x 1\nx abc"])
def test_malformed_or_html_answers_are_one_line_errors(text):
    with pytest.raises(MetricsError) as error:
        parse_metrics(text, 0.0)
    assert "\n" not in str(error.value)


def test_unknown_server_is_a_bad_answer_not_a_crash():
    record = SeriesBuilder().add(parse_metrics("# TYPE up gauge\nup 1\n", 1.0))
    assert record.status == "bad answer" and "vLLM, SGLang or llama.cpp" in record.message


# ---- histograms --------------------------------------------------------------------------------

def test_quantile_interpolates_inside_its_bucket_and_skips_empty_buckets():
    # 10 observations: 4 in (0, 0.1], none in (0.1, 0.5], 6 in (0.5, 1]
    counts = {0.1: 4.0, 0.5: 4.0, 1.0: 10.0, math.inf: 10.0}
    assert histogram_quantile(0.2, counts) == pytest.approx(0.05)
    assert histogram_quantile(0.5, counts) == pytest.approx(0.5 + 0.5 * (1 / 6))  # not in the empty bucket
    assert histogram_quantile(0.95, counts) == pytest.approx(0.5 + 0.5 * (5.5 / 6))


def test_quantile_of_nothing_is_nan_and_of_the_inf_bucket_is_the_last_bound():
    assert math.isnan(histogram_quantile(0.5, {0.1: 0.0, math.inf: 0.0}))
    assert math.isnan(histogram_quantile(0.5, {}))
    assert histogram_quantile(0.99, {0.1: 1.0, 1.0: 1.0, math.inf: 5.0}) == 1.0


def test_bucket_counts_sum_over_engines():
    scrape = parse_metrics(histogram("h", 'engine="0"', (1, 1, 2, 2, 2), 0.1) + "\n"
                           + histogram("h", 'engine="1"', (0, 3, 3, 3, 3), 0.1).replace("# TYPE h histogram", ""),
                           0.0)
    assert bucket_counts(scrape.series("h_bucket"))[0.05] == 4.0


# ---- rates -------------------------------------------------------------------------------------

def test_vllm_rates_gauges_and_latency_percentiles_over_the_interval():
    builder = SeriesBuilder()
    first, second = feed(builder, (10.0, vllm_text(100, 50, ttft=(1, 1, 1, 1, 1), itl=(2, 2, 2, 2, 2))),
                         (12.0, vllm_text(300, 90, ttft=(1, 1, 3, 3, 3), itl=(2, 6, 6, 6, 6), kv=0.5)))
    assert first.status == "baseline" and math.isnan(first.generation_tokens_per_s)
    assert first.running == 1 and first.kv_cache_usage == 0.25  # gauges are known at once
    assert second.ok and second.interval_s == pytest.approx(2.0)
    assert second.generation_tokens == 200 and second.generation_tokens_per_s == pytest.approx(100.0)
    assert second.prompt_tokens_per_s == pytest.approx(20.0)
    assert second.kv_cache_usage == 0.5 and second.waiting == 0
    # the interval's two TTFTs both fell in (0.05, 0.1]; the first (before the interval) is left out
    assert 0.05 < second.ttft_p50_s <= 0.1 and 0.05 < second.ttft_p95_s <= 0.1
    assert 0.01 < second.itl_p95_s <= 0.05
    assert math.isnan(second.gbs) and math.isnan(second.mbu)  # no --enable-mfu-metrics: nothing invented


def test_counter_reset_gives_no_rate_then_resumes_never_negative_or_spiking():
    builder = SeriesBuilder()
    records = feed(builder, (0.0, vllm_text(5000, 100)), (1.0, vllm_text(5050, 100)),
                   (2.0, vllm_text(30, 10)),  # restarted (same start time reported: the drop tells)
                   (3.0, vllm_text(80, 10)))
    rates = [r.generation_tokens_per_s for r in records]
    assert records[2].status == "restarted" and math.isnan(rates[2])
    assert rates[1] == pytest.approx(50.0) and rates[3] == pytest.approx(50.0)
    assert all(not r < 0 for r in rates)


def test_restart_seen_from_the_process_start_time_even_when_counters_grew():
    builder = SeriesBuilder()
    _, after = feed(builder, (0.0, vllm_text(10, 5, start=1.7e9)), (1.0, vllm_text(20, 5, start=1.7e9 + 60)))
    assert after.status == "restarted" and math.isnan(after.generation_tokens_per_s)


def test_a_gap_shows_nan_and_the_next_answer_is_only_a_baseline():
    builder = SeriesBuilder()
    feed(builder, (0.0, vllm_text(0, 0)))
    gap = builder.gap(1.0, "down", "connection refused")
    (back,) = feed(builder, (5.0, vllm_text(400, 0)))
    assert math.isnan(gap.generation_tokens_per_s) and math.isnan(gap.running)
    # 400 tokens over 5 s spanning the outage would be a guess: the baseline has no rate
    assert back.status == "baseline" and math.isnan(back.generation_tokens_per_s)


def test_per_engine_series_and_their_sum():
    builder = SeriesBuilder()
    text = lambda g: vllm_text(g, 0, engines=("0", "1"), running=2)
    _, record = feed(builder, (0.0, text(100)), (1.0, text(160)))
    assert set(record.engines) == {"0", "1"}
    assert record.engines["0"]["generation_tokens_per_s"] == pytest.approx(60.0)
    assert record.generation_tokens_per_s == pytest.approx(120.0) and record.running == 4


def test_mfu_counters_give_gbs_tflops_mbu_mfu_against_the_datasheet_peak():
    peak, note = resolve_peak("http://10.0.0.5:8000", "H100 SXM")
    assert peak is not None and "datasheet" in note
    builder = SeriesBuilder(peak)
    _, record = feed(builder, (0.0, vllm_text(0, 0, mfu=(0.0, 0.0, 0.0))),
                     (2.0, vllm_text(100, 0, mfu=(2e14, 5e12, 1e12))))
    assert record.gbs == pytest.approx(3000.0)  # (5e12 + 1e12) B / 2 s
    assert record.tflops == pytest.approx(100.0)
    assert record.mbu == pytest.approx(3000.0 / 3350.0)
    assert record.mfu == pytest.approx(100e12 / 989.4e12)


def test_without_a_known_gpu_there_is_gbs_but_no_mbu():
    peak, note = resolve_peak("http://192.0.2.1:8000", None)
    assert peak is None and "--gpu" in note
    builder = SeriesBuilder(peak)
    _, record = feed(builder, (0.0, vllm_text(0, 0, mfu=(0, 0, 0))), (1.0, vllm_text(0, 0, mfu=(1e12, 2e9, 0))))
    assert record.gbs == pytest.approx(2.0) and math.isnan(record.mbu) and math.isnan(record.mfu)


def test_unknown_gpu_name_is_a_one_line_error_listing_the_table():
    with pytest.raises(ValueError, match="not in the datasheet table.*H100"):
        resolve_peak("http://x:1", "Voodoo 2")


def test_spec_decode_acceptance_from_the_counters():
    builder = SeriesBuilder()
    _, record = feed(builder, (0.0, vllm_text(0, 0, spec=(100, 60))), (1.0, vllm_text(0, 0, spec=(140, 90))))
    assert record.spec_acceptance == pytest.approx(30 / 40)


def test_sglang_live_counter_and_ranks_counted_once():
    builder = SeriesBuilder()
    _, record = feed(builder, (0.0, sglang_text(1000, 500, 0)), (2.0, sglang_text(1300, 700, 0)))
    # tp_rank 1 repeats tp_rank 0's figures: counted once; realtime_tokens_total{mode=decode} used
    assert record.generation_tokens_per_s == pytest.approx(150.0)
    assert record.prompt_tokens_per_s == pytest.approx(100.0)
    assert record.running == 3 and record.waiting == 2 and record.kv_cache_usage == 0.5
    assert math.isnan(record.ttft_p50_s)  # no histograms in this answer: missing, not zero
    assert "--enable-mfu-metrics" in SERVERS["sglang"].bytes_hint


def test_llamacpp_generation_rate_is_live_from_decode_calls_and_busy_slots():
    builder = SeriesBuilder()
    # mid-reply: tokens_predicted_total has not moved (it grows when the reply ends), the calls have
    _, mid = feed(builder, (0.0, llamacpp_text(0, 10, 1.0)), (1.0, llamacpp_text(0, 60, 1.0)))
    assert mid.generation_tokens_per_s == pytest.approx(50.0)
    # two slots busy for the last 40 calls: busy-slot sum 60 + 80
    (two,) = feed(builder, (2.0, llamacpp_text(0, 100, 140 / 100)))
    assert two.generation_tokens_per_s == pytest.approx(80.0)
    assert two.running == 1 and math.isnan(two.kv_cache_usage) and math.isnan(two.ttft_p50_s)
    assert SERVERS["llamacpp"].bytes_flag is None and "no byte" in SERVERS["llamacpp"].bytes_hint


def test_llamacpp_restart_from_its_start_header():
    builder = SeriesBuilder()
    records = feed(builder, (0.0, llamacpp_text(5, 10, 1.0)), start=111.0) + \
        feed(builder, (1.0, llamacpp_text(5, 12, 1.0)), start=222.0)
    assert records[1].status == "restarted"


# ---- urls, scraper, headless -------------------------------------------------------------------

@pytest.mark.parametrize("given, base", [("localhost:8000", "http://localhost:8000"),
                                         ("http://h:1/metrics", "http://h:1"), ("https://h/api/v1/", "https://h/api")])
def test_urls_are_normalised(given, base):
    assert normalise_url(given) == base


@pytest.mark.parametrize("bad", ["ftp://x", "http://", "http://h:notaport"])
def test_bad_urls_are_one_line_errors(bad):
    with pytest.raises(ValueError, match="not a server address"):
        normalise_url(bad)


def test_a_dead_server_is_a_down_record_with_backoff():
    import socket

    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    scraper = Scraper(f"127.0.0.1:{port}", interval_s=0.5, timeout_s=1.0)
    first, second = scraper.poll(), scraper.poll()
    assert first.status == "down" and "refused" in first.message and "\n" not in first.message
    assert scraper.next_delay_s == pytest.approx(2.0) and second.status == "down"  # 0.5 s, doubled twice
    assert summary_line(first, 0.0).strip().startswith(f"{first.t_s:.1f} s  down:")


def test_records_are_json_ready():
    builder = SeriesBuilder()
    _, record = feed(builder, (0.0, vllm_text(0, 0)), (1.0, vllm_text(10, 0)))
    data = json.loads(json.dumps(record.to_dict(0.0)))
    assert data["generation_tokens_per_s"] == 10.0 and data["gbs"] is None and data["t_s"] == 1.0



def test_attach_imports_neither_torch_nor_qt():
    import subprocess
    import sys

    code = ("import sys, engine.attach.headless, engine.attach.client; "
            "print(sorted(m for m in ('torch', 'PySide6', 'gguf') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
