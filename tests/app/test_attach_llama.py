"""Attach mode against a real llama.cpp server on loopback (built from llama-cpp-python's vendored
source, serving the default model with --metrics): the tokens/s plotted agrees with the server's own
counters and with the streamed reply; a stopped and restarted server is reported and recovered from;
the headless CLI writes the series; the window keeps its event loop running while attached."""
from __future__ import annotations

import json
import math
import threading
import time

import numpy as np
import pytest
from llama_peer import LlamaServer

from app.gui_bench import LatenessProbe
from engine.attach.client import ChatDone, Scraper, fetch_metrics, stream_chat
from engine.io.default_model import find_default_model

PROMPT = "Explain, at length, why generating text one token at a time is limited by memory bandwidth."


@pytest.fixture(scope="module")
def llama_server():
    server = LlamaServer(find_default_model())
    server.start()
    yield server
    server.stop()


def predicted_total(url: str) -> float:
    return fetch_metrics(url).series("llamacpp:tokens_predicted_total")[()]


def test_plotted_tokens_per_s_agrees_with_the_counters_and_the_stream(llama_server):
    url = llama_server.url
    scraper = Scraper(url, interval_s=0.25)
    records, stop = [], threading.Event()
    before = predicted_total(url)
    thread = threading.Thread(target=scraper.run, args=(120.0, records.append, stop))
    thread.start()
    try:
        while not records:
            time.sleep(0.05)
        arrivals, done = [], None
        for piece in stream_chat(url, [{"role": "user", "content": PROMPT}], max_tokens=120, temperature=0.0,
                                 extra={"ignore_eos": True}):
            if isinstance(piece, ChatDone):
                done = piece
            else:
                arrivals.append(time.monotonic())
        time.sleep(1.0)  # a few scrapes after the reply's end
    finally:
        stop.set()
        thread.join()
    counted = predicted_total(url) - before
    assert done is not None and done.counted_from == "usage" and done.n_tokens == 120
    assert counted == done.n_tokens  # the server's token counter (it adds a reply when it ends)
    ok = [r for r in records if r.ok]
    assert len(ok) >= 4 and all(r.kind == "llamacpp" for r in ok)
    plotted = sum(r.generation_tokens_per_s * r.interval_s for r in ok)  # what the tokens/s plot integrates to
    assert plotted == pytest.approx(done.n_tokens, abs=1)
    assert len(arrivals) == pytest.approx(done.n_tokens, abs=2)  # one streamed chunk per token
    # scrape by scrape: the live rate counts what the stream delivered in that interval, to within
    # the tokens in flight when the server took its snapshot
    for r in ok:
        streamed = sum(1 for t in arrivals if r.t_s - r.interval_s < t <= r.t_s)
        assert abs(r.generation_tokens - streamed) <= 3, (r.t_s, r.generation_tokens, streamed)
    busy = [r for r in ok if r.generation_tokens > 0]
    assert max(r.generation_tokens_per_s for r in busy) > 0 and all(r.generation_tokens_per_s >= 0 for r in ok)
    assert math.isfinite(done.tokens_per_s) and done.tokens_per_s > 0


def test_stop_and_restart_are_reported_and_recovered(llama_server):
    scraper = Scraper(llama_server.url, interval_s=0.2, timeout_s=2.0)
    assert scraper.poll().status in ("baseline", "ok")
    for _ in stream_chat(llama_server.url, [{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0.0):
        pass
    assert scraper.poll().ok
    # restarted between two scrapes: its counters began again, so no rate (never negative)
    llama_server.stop()
    llama_server.start()
    restarted = scraper.poll()
    assert restarted.status == "restarted" and math.isnan(restarted.generation_tokens_per_s)
    assert scraper.poll().ok
    # down: one line, then back off; back: a baseline, then rates
    llama_server.stop()
    down = scraper.poll()
    assert down.status == "down" and "refused" in down.message and "\n" not in down.message
    assert scraper.next_delay_s > scraper.interval_s
    llama_server.start()
    back = scraper.poll()
    assert back.status == "baseline" and math.isnan(back.generation_tokens_per_s) and back.running == 0
    again = scraper.poll()
    assert again.ok and again.generation_tokens_per_s == 0


def test_headless_attach_writes_one_record_per_scrape(llama_server, tmp_path, capsys):
    from engine.cli import main

    out = tmp_path / "series.json"
    assert main(["attach", llama_server.url, "--headless", "--seconds", "1.2", "--interval", "0.4",
                 "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["server"] == "llamacpp" and len(document["records"]) >= 3
    assert document["records"][0]["status"] == "baseline" and document["records"][1]["status"] == "ok"
    assert document["records"][1]["generation_tokens_per_s"] == 0 and document["records"][1]["gbs"] is None
    assert "no byte or FLOP counters" in document["bytes_note"]
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(document["records"]) and "gen 0.0 tok/s" in lines[1]


def test_headless_attach_to_nothing_is_one_line_and_exit_1(capsys):
    from llama_peer import free_port

    from engine.cli import main

    assert main(["attach", f"127.0.0.1:{free_port()}", "--headless", "--seconds", "0.3"]) == 1
    err = capsys.readouterr().err
    assert "no metrics from" in err and "refused" in err and "Traceback" not in err


def test_window_attached_plots_the_server_and_survives_its_restart(qtbot, tiny_model, llama_server):
    from app_test_helpers import fake_cpu

    from app.window import MainWindow

    window = MainWindow(model=tiny_model, hardware=fake_cpu(), autoload=False)
    qtbot.addWidget(window)
    window.show()
    assert window.attach.button.text() == "Attach to server…"
    controls = window.controls.extra
    assert controls.indexOf(window.attach.button) == controls.indexOf(window.model_button) + 1
    probe = LatenessProbe(window)  # the GUI event loop's lateness while attached, as app/gui_bench.py measures it
    probe.start()
    try:
        assert window.attach.attach(llama_server.url, interval_s=0.25)
        qtbot.waitUntil(lambda: window.attach.state == "up", timeout=15_000)
        with qtbot.waitSignal(window.attach.reply_finished, timeout=120_000) as reply:
            window.chat.send_requested.emit("Say hello in one short sentence.")
        done = reply.args[0]
        assert isinstance(done, ChatDone) and done.n_tokens > 0
        qtbot.wait(800)  # the scrapes after its end
        # and enough of the probe's ticks to judge by (under load a short reply left exactly 100)
        qtbot.waitUntil(lambda: len(probe.lateness_ms) > 150, timeout=30_000)
        probe.stop()  # (what follows stops and starts the server from this thread: the test's own waits)
        # what the tokens/s plot draws: one row per scrape; over the reply it adds up to its tokens
        steps = window.data.steps
        rates, step_ms = steps.column("tokens_per_s"), steps.column("step_ms")
        assert np.nansum(rates * step_ms / 1e3) == pytest.approx(done.n_tokens, abs=1)
        text = window.chat.plain_text()
        assert "(this reply, from the stream)" in text and "server:" in text
        window.plots.refresh(force=True)
        window.plots._readout_version = -1
        window.plots.update_readouts()
        assert "no byte or FLOP counters" in window.plots.views["memory"].title_label.text()
        assert "server's counters" in window.plots.views["tokens"].title_label.text()
        assert "llama.cpp at" in window.attach.status_label.text()

        llama_server.stop()
        qtbot.waitUntil(lambda: window.attach.state == "down", timeout=15_000)
        assert "refused" in window.attach.status_label.text()
        assert "stopped answering" in window.chat.plain_text()
        rows_down = steps.total
        qtbot.wait(500)
        assert math.isnan(steps.last("tokens_per_s"))  # the gap, not a made-up value
        llama_server.start()
        qtbot.waitUntil(lambda: window.attach.state == "up", timeout=30_000)  # after the back-off
        assert steps.total > rows_down and "answers again" in window.chat.plain_text()
    finally:
        probe.stop()
        window.attach.detach()
        if llama_server.process is None:
            llama_server.start()
    assert window.data.source == "model" and window.chat.send_requested  # the window is its own again
    late = np.array(probe.lateness_ms)
    assert len(late) > 100
    print(f"attached: GUI timer lateness p50 {np.percentile(late, 50):.1f} ms, p95 {np.percentile(late, 95):.1f} ms, "
          f"max {late.max():.1f} ms over {len(late)} ticks")
    # no scrape or chat read ran on the GUI thread (one waits up to seconds for a slow server)
    assert late.max() < 1000
