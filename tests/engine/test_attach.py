"""Attach mode's parsing and rates, over exposition text written here in each server's documented
format (vLLM V1, SGLang, llama.cpp): kinds, rates, counter resets, missing metrics, histograms."""
from __future__ import annotations

import json
import math

import pytest
from server_exposition import SglangMetrics, VllmMetrics

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


# ---- as the servers ship: exposition made with prometheus_client, as vLLM and SGLang make it ----

def scrape_twice(make_text, step, t=(0.0, 2.0), peak=None):
    """A baseline scrape, `step()` (what the server did meanwhile), a second scrape: its record."""
    builder = SeriesBuilder(peak)
    builder.add(parse_metrics(make_text(), t[0]))
    step()
    return builder.add(parse_metrics(make_text(), t[1]))


def test_vllm_byte_counters_present_at_zero_without_the_flag_give_the_hint_not_zero():
    """vLLM registers estimated_*_per_gpu_total without --enable-mfu-metrics: present, at 0, forever."""
    server = VllmMetrics(mfu=False)
    text = server.text()
    assert 'vllm:estimated_read_bytes_per_gpu_total{engine="0",model_name="m"} 0.0' in text
    assert "# TYPE vllm:generation_tokens_created gauge" in text and "process_start_time_seconds" in text
    peak, _ = resolve_peak("http://10.0.0.5:8000", "H100 SXM")
    record = scrape_twice(server.text, lambda: server.decode(200), peak=peak)
    assert record.ok and record.generation_tokens_per_s == pytest.approx(100.0)
    assert math.isnan(record.gbs) and math.isnan(record.mbu) and math.isnan(record.mfu)
    assert math.isnan(record.tflops) and math.isnan(record.ceiling_tokens_per_s)
    assert "0 GB/s" not in summary_line(record, 0.0)


def test_vllm_with_the_flag_gives_the_servers_bytes():
    server = VllmMetrics(mfu=True)
    peak, _ = resolve_peak("http://10.0.0.5:8000", "H100 SXM")
    record = scrape_twice(server.text, lambda: server.decode(200, read_bytes_per_token=1e9), peak=peak)
    assert record.gbs == pytest.approx((200 * 1e9 + 200 * 1e6) / 2 / 1e9)
    assert record.mbu == pytest.approx(record.gbs / 3350.0)


def test_headless_says_the_flag_when_vllms_counters_stay_at_zero(tmp_path, capsys, monkeypatch):
    """The terminal ends with the hint, and the JSON has no GB/s (not 0) for a flag-off server."""
    from types import SimpleNamespace

    from engine.attach import client, headless

    server = VllmMetrics(mfu=False)

    def fetch_metrics(url, timeout_s, api_key, clock):
        server.decode(50)  # the server keeps decoding between scrapes
        return parse_metrics(server.text(), clock())
    monkeypatch.setattr(client, "fetch_metrics", fetch_metrics)
    args = SimpleNamespace(url="http://10.0.0.5:8000", gpu="H100 SXM", interval=0.02, api_key=None, seconds=0.1,
                           json=str(tmp_path / "s.json"))
    assert headless.run_headless(args) == 0
    err = capsys.readouterr().err
    assert "start vLLM with --enable-mfu-metrics" in err
    records = json.loads((tmp_path / "s.json").read_text())["records"]
    assert len(records) >= 2 and any(r["generation_tokens_per_s"] for r in records)
    assert all(r["gbs"] is None and r["mbu"] is None for r in records)


def test_sglang_priority_scheduling_counts_the_total_series_once():
    """--enable-priority-scheduling: a series per priority beside the total (priority="")."""
    server = SglangMetrics(priorities=("0", "1"))
    server.log_stats(running={"": 5, "0": 2, "1": 3}, queue={"": 4, "0": 1, "1": 3})
    text = server.text()
    assert 'sglang:num_running_reqs{engine_type="unified",model_name="m",pp_rank="0",priority="",tp_rank="0"} 5.0' \
        in text and "_created" not in text and "process_start_time_seconds" not in text
    record = scrape_twice(server.text, lambda: server.decode(300, prompt=100))
    assert record.running == 5 and record.waiting == 4  # not 10 and 8, and tp_rank 1 counted once
    assert record.generation_tokens_per_s == pytest.approx(150.0)


def test_sglang_without_priority_scheduling_reads_its_plain_series():
    server = SglangMetrics()
    server.log_stats(running={"": 3}, queue={"": 2})
    record = scrape_twice(server.text, lambda: server.decode(10))
    assert record.running == 3 and record.waiting == 2


def test_sglang_acceptance_is_shown_only_while_it_speculates():
    """SGLang sets spec_accept_rate (and spec_accept_length) to 0 when speculation is off."""
    off = SglangMetrics()
    off.log_stats(running={"": 1}, queue={"": 0})
    record = scrape_twice(off.text, lambda: off.decode(10))
    assert 'sglang:spec_accept_rate{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 0.0' in off.text()
    assert math.isnan(record.spec_acceptance)
    on = SglangMetrics(speculative=True)
    on.log_stats(running={"": 1}, queue={"": 0}, accept_length=2.6, accept_rate=0.4)
    record = scrape_twice(on.text, lambda: on.decode(10))
    assert record.spec_acceptance == pytest.approx(0.4)


def test_prompt_rate_says_what_each_server_counts():
    vllm = VllmMetrics()
    record = scrape_twice(vllm.text, lambda: vllm.decode(10, prompt=40))
    assert record.prompt_tokens_per_s == pytest.approx(20.0)
    assert record.prompt_tokens_meaning == "prefix-cache hits included"
    assert "prompt 20.0 tok/s (prefix-cache hits included)" in summary_line(record, 0.0)
    sglang = SglangMetrics()
    record = scrape_twice(sglang.text, lambda: sglang.decode(10, prompt=40))
    assert record.prompt_tokens_meaning == "computed: cache hits excluded"
    builder = SeriesBuilder()
    _, record = feed(builder, (0.0, llamacpp_text(0, 0, 0, prompt=0)), (1.0, llamacpp_text(0, 0, 0, prompt=12)))
    assert record.prompt_tokens_meaning == "evaluated: reused cache excluded"


class FakeStream:
    """An HTTP response streaming OpenAI chunks, each at its own time on `clock` (set as it is read)."""

    def __init__(self, chunks: list[tuple[float, dict]], clock: list[float]):
        self.status, self.reason, self.chunks, self.clock = 200, "OK", chunks, clock

    def __iter__(self):
        for t, chunk in self.chunks:
            self.clock[0] = t
            yield f"data: {json.dumps(chunk)}\n".encode()
            yield b"\n"
        yield b"data: [DONE]\n"


@pytest.mark.parametrize("server,field", [("vllm", "reasoning"), ("sglang", "reasoning_content")])
def test_a_reasoning_models_thinking_is_timed_for_ttft_and_tokens_per_s(monkeypatch, server, field):
    """vLLM streams thinking as delta.reasoning, SGLang as delta.reasoning_content, before the
    answer's delta.content: the first token is the first thought, and tok/s spans all of them."""
    from engine.attach import client

    clock = [0.0]
    role = {"role": "assistant", "content": ""} if server == "vllm" else {"role": "assistant", "content": None}
    chunks = [(0.5, {"choices": [{"index": 0, "delta": role, "finish_reason": None}]})]
    chunks += [(0.5 + 0.1 * i, {"choices": [{"index": 0, "delta": {field: f"think {i} "}, "finish_reason": None}]})
               for i in range(1, 21)]  # 20 thoughts, 0.6 .. 2.5 s
    chunks += [(2.5 + 0.1 * i, {"choices": [{"index": 0, "delta": {"content": f"word{i} "}, "finish_reason": None}]})
               for i in range(1, 6)]  # 5 answer tokens, 2.6 .. 3.0 s
    chunks.append((3.0, {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 25}}))

    class Connection:
        def request(self, *args, **kwargs):
            pass

        def getresponse(self):
            return FakeStream(chunks, clock)

        def close(self):
            pass
    monkeypatch.setattr(client, "_connection", lambda url, timeout: (Connection(), ""))
    *pieces, done = client.stream_chat("http://x:1", [{"role": "user", "content": "why?"}], clock=lambda: clock[0])
    assert "".join(pieces) == done.text == "word1 word2 word3 word4 word5 "  # the answer alone is the reply
    assert done.ttft_s == pytest.approx(0.6)  # the first thought, not the answer's first word (2.6 s)
    assert done.stream_s == pytest.approx(2.4) and done.n_tokens == 25 and done.reasoning_chunks == 20
    assert done.tokens_per_s == pytest.approx(24 / 2.4)
