"""The window attached to a stand-in vLLM server (a loopback HTTP server written here, in vLLM's
documented metric names, with --enable-mfu-metrics's byte and FLOP counters): the plots get the
server's GB/s and MBU against the datasheet peak, the chat streams, Detach gives the window back."""
from __future__ import annotations

import json
import math
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from app_test_helpers import fake_cpu

from engine.attach.client import ChatDone

GEN_TPS = 50.0  # the stand-in generates this many tokens/s, reading 1 GB per token (per GPU)
BYTES_PER_TOKEN = 1e9
FLOPS_PER_TOKEN = 2e12


class FakeVllm(BaseHTTPRequestHandler):
    t0 = time.monotonic()
    api_key = "secret"  # required on /keyed/metrics, as a server started with --api-key does
    mfu = True  # --enable-mfu-metrics; without it vLLM still has the byte and FLOP counters, at 0

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            return self._send(200, "application/json", json.dumps({"data": [{"id": "fake-model"}]}))
        if self.path.startswith("/keyed/"):
            if self.headers.get("Authorization") != f"Bearer {self.api_key}":
                return self._send(401, "application/json", json.dumps({"error": {"message": "Unauthorized"}}))
            self.path = self.path.removeprefix("/keyed")
        if self.path == "/login/metrics":  # a proxy's sign-in page
            return self._send(200, "text/html", "<!DOCTYPE html><html><body>Sign in</body></html>")
        if self.path != "/metrics":
            return self._send(404, "text/plain", "not found")
        tokens = GEN_TPS * (time.monotonic() - self.t0)
        counted = tokens if self.mfu else 0.0
        lines = []
        for family, kind, value in (
                ("vllm:num_requests_running", "gauge", 3), ("vllm:num_requests_waiting", "gauge", 1),
                ("vllm:kv_cache_usage_perc", "gauge", 0.4), ("vllm:generation_tokens", "counter", tokens),
                ("vllm:prompt_tokens", "counter", 0.0),
                ("vllm:estimated_flops_per_gpu", "counter", counted * FLOPS_PER_TOKEN),
                ("vllm:estimated_read_bytes_per_gpu", "counter", counted * BYTES_PER_TOKEN),
                ("vllm:estimated_write_bytes_per_gpu", "counter", 0.0)):
            suffix = "_total" if kind == "counter" else ""
            lines += [f"# TYPE {family} {kind}", f'{family}{suffix}{{engine="0",model_name="fake-model"}} {value}']
        self._send(200, "text/plain; version=0.0.4", "\n".join(lines) + "\n")

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert request["model"] == "fake-model" and request["stream"] is True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for word in ("Memory ", "bandwidth ", "bounds ", "decode."):
            chunk = {"choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.02)
        final = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}
        self.wfile.write(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())

    def _send(self, status: int, content_type: str, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class FakeVllmWithoutMfu(FakeVllm):
    mfu = False


@pytest.fixture
def fake_vllm(request):
    server = ThreadingHTTPServer(("127.0.0.1", 0), getattr(request, "param", FakeVllm))
    thread = threading.Thread(target=server.serve_forever, name="fake-vllm")
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def test_attached_window_plots_the_servers_bytes_against_the_datasheet_peak(qtbot, tiny_model, fake_vllm):
    from app.window import MainWindow

    window = MainWindow(model=tiny_model, hardware=fake_cpu(), autoload=False)
    qtbot.addWidget(window)
    window.show()
    assert window.attach.attach(fake_vllm, gpu="H100 SXM", interval_s=0.2)
    qtbot.waitUntil(lambda: window.data.steps.total >= 4 and np.isfinite(window.data.steps.column("gbs")).any(),
                    timeout=10_000)
    steps = window.data.steps
    gbs = steps.column("gbs")
    gbs = gbs[np.isfinite(gbs)]
    # 50 tok/s x 1 GB per token, within a scrape's timing (the arrival times bound each interval)
    assert np.median(gbs) == pytest.approx(GEN_TPS * BYTES_PER_TOKEN / 1e9, rel=0.15)
    assert steps.last("peak_bps") == pytest.approx(3350e9) and steps.last("ai") == pytest.approx(2000.0)
    assert np.nanmedian(steps.column("mfu_pct")) == pytest.approx(100 * 100e12 / 989.4e12, rel=0.15)
    # a decode-only interval: ceiling = peak bandwidth / bytes per token
    assert np.nanmedian(steps.column("ceiling_tps")) == pytest.approx(3350.0, rel=0.01)
    window.plots.refresh(force=True)
    window.plots._readout_version = -1
    window.plots.update_readouts()
    assert re.search(r"GB/s per GPU \(server's estimate\) · MBU [12]%", window.plots.views["memory"].title_label.text())
    assert "server's estimate" in window.plots.views["roofline"].title_label.text()
    assert window.serving_panel.refresh(force=True)
    assert "KV cache 40% used" in window.attach.status_label.text()

    with qtbot.waitSignal(window.attach.reply_finished, timeout=10_000) as reply:
        window.chat.send_requested.emit("Why is decode slow?")
    done = reply.args[0]
    assert isinstance(done, ChatDone) and done.n_tokens == 4 and done.counted_from == "usage"
    assert "Memory bandwidth bounds decode." in window.chat.plain_text()
    assert window.attach.messages[-1] == {"role": "assistant", "content": "Memory bandwidth bounds decode."}

    window.attach.detach()
    assert window.data.source == "model" and window.data.steps.total == 0
    assert not window.attach.bar.isVisible() and window.model_button.isEnabled()


def test_attach_refuses_a_bad_address_or_gpu_with_one_line(qtbot, tiny_model):
    from app.window import MainWindow

    window = MainWindow(model=tiny_model, hardware=fake_cpu(), autoload=False)
    qtbot.addWidget(window)
    assert not window.attach.attach("ftp://nowhere")
    assert "not a server address" in window.last_error
    assert not window.attach.attach("http://127.0.0.1:9", gpu="Voodoo 2")
    assert "not in the datasheet table" in window.last_error and "\n" not in window.last_error
    assert not window.attach.attached and math.isnan(window.data.steps.last("tokens_per_s"))


def test_wrong_path_or_an_html_page_is_a_bad_answer_in_one_line(fake_vllm):
    from engine.attach.client import Scraper

    missing = Scraper(fake_vllm + "/nope").poll()
    assert missing.status == "bad answer" and "HTTP 404" in missing.message and "--enable-metrics" in missing.message
    html = Scraper(fake_vllm + "/login").poll()
    assert html.status == "bad answer" and "not Prometheus metrics (an HTML page" in html.message
    assert "\n" not in missing.message + html.message


def test_status_line_names_each_engine_of_a_data_parallel_server():
    from app.attach_source import status_line
    from engine.attach.exposition import parse_metrics
    from engine.attach.series import SeriesBuilder

    def text(tokens: float) -> str:
        lines = ["# TYPE vllm:num_requests_running gauge", "# TYPE vllm:generation_tokens counter",
                 "# TYPE vllm:estimated_read_bytes_per_gpu counter"]
        for engine in ("0", "1"):
            labels = f'engine="{engine}",model_name="m"'
            lines += [f"vllm:num_requests_running{{{labels}}} 1", f"vllm:generation_tokens_total{{{labels}}} {tokens}",
                      f"vllm:estimated_read_bytes_per_gpu_total{{{labels}}} {tokens * 1e9}"]
        return "\n".join(lines) + "\n"

    builder = SeriesBuilder()
    builder.add(parse_metrics(text(100), 0.0))
    line = status_line(builder.add(parse_metrics(text(160), 1.0)), "http://h:1")
    assert line.startswith("vLLM at http://h:1 · running 2") and "engines 0: 60 tok/s, 1: 60 tok/s" in line
    assert "GPUs engine=0: 60 GB/s, engine=1: 60 GB/s" in line


def test_api_key_is_sent_as_a_bearer_token(fake_vllm):
    from engine.attach.client import Scraper

    refused = Scraper(fake_vllm + "/keyed").poll()
    assert refused.status == "bad answer" and "HTTP 401 Unauthorized: Unauthorized" in refused.message
    assert Scraper(fake_vllm + "/keyed", api_key="secret").poll().status == "baseline"


@pytest.mark.parametrize("fake_vllm", [FakeVllmWithoutMfu], indirect=True)
def test_a_vllm_started_without_the_flag_shows_the_hint_not_zero_gbs(qtbot, tiny_model, fake_vllm):
    """vLLM's byte and FLOP counters are there without --enable-mfu-metrics, at 0: the memory,
    compute and roofline plots say which flag fills them, and show no 0 GB/s or MBU 0%."""
    from app.window import MainWindow

    window = MainWindow(model=tiny_model, hardware=fake_cpu(), autoload=False)
    qtbot.addWidget(window)
    assert window.attach.attach(fake_vllm, gpu="H100 SXM", interval_s=0.2)
    qtbot.waitUntil(lambda: np.isfinite(window.data.steps.column("tokens_per_s")).sum() >= 2, timeout=10_000)
    assert not np.isfinite(window.data.steps.column("gbs")).any()
    assert not np.isfinite(window.data.steps.column("mfu_pct")).any()
    assert "--enable-mfu-metrics" in window.data.notes["memory"] and "--enable-mfu-metrics" in window.data.notes["roofline"]
    window.attach.detach()


class FakeVllmIdleBetween(FakeVllm):
    """Generates only while it replies: its counter grows by a reply's 4 tokens, nothing in between."""
    generated = 0.0

    def do_GET(self) -> None:
        if self.path != "/metrics":
            return super().do_GET()
        lines = []
        for family, kind, value in (("vllm:num_requests_running", "gauge", 0), ("vllm:generation_tokens", "counter",
                                                                                FakeVllmIdleBetween.generated)):
            suffix = "_total" if kind == "counter" else ""
            lines += [f"# TYPE {family} {kind}", f'{family}{suffix}{{engine="0",model_name="fake-model"}} {value}']
        self._send(200, "text/plain; version=0.0.4", "\n".join(lines) + "\n")

    def do_POST(self) -> None:
        super().do_POST()
        FakeVllmIdleBetween.generated += 4


@pytest.mark.parametrize("fake_vllm", [FakeVllmIdleBetween], indirect=True)
def test_a_reply_shorter_than_a_scrape_interval_has_the_servers_rate_over_its_own_time(qtbot, tiny_model, fake_vllm):
    """A scrape as the reply is sent and one at its end: the summary's "server: … tok/s" is over the reply's
    own time, however short (here ~0.1 s against a scrape every 60 s: none of the periodic ones lands within
    it, and the last one was ~1 s before it, idle)."""
    import time

    from app.window import MainWindow

    window = MainWindow(model=tiny_model, hardware=fake_cpu(), autoload=False)
    qtbot.addWidget(window)
    window.show()
    assert window.attach.attach(fake_vllm, gpu="H100 SXM", interval_s=60)
    qtbot.waitUntil(lambda: window.attach.state == "up", timeout=10_000)
    qtbot.wait(1000)  # (idle: a rate over an interval that began here would read under 4 tokens a second)
    t0 = time.monotonic()
    with qtbot.waitSignal(window.attach.reply_finished, timeout=10_000):
        window.chat.send_requested.emit("Why is decode slow?")
    qtbot.waitUntil(lambda: "(this reply, from the stream)" in window.chat.plain_text(), timeout=5_000)
    took = time.monotonic() - t0
    found = re.search(r"server: ([\d.,]+) tok/s generated", window.chat.plain_text())
    assert found, window.chat.plain_text()
    assert float(found[1].replace(",", "")) >= 4 / took  # its 4 tokens within the reply's own time, or less
    window.attach.detach()
