"""How often the engine host sends a reply's events (engine/host.py): on a CPU, where the window's
work per batch is taken from the engine's own cores, at most BATCH_INTERVAL_S_CPU apart."""
import time
from dataclasses import replace

import torch

from engine.host import BATCH_INTERVAL_S, BATCH_INTERVAL_S_CPU, EngineHost
from engine.io.byte_tokenizer import ByteTokenizer
from engine.io.loader import LoadedWeights, synthetic_weights
from engine.protocol import Chat, Load
from tests.engine.test_engine import CFG, GREEDY, fake_cpu


def test_a_cpu_engine_sends_its_events_five_times_a_second(monkeypatch):
    monkeypatch.setenv("MEMBOUND_CPU_STEP", "0")  # PyTorch's step: the tiny model's reply outlasts a second
    sent = []
    host = EngineHost(lambda kind, *args: sent.append((time.monotonic(), kind)))
    cfg = replace(CFG, max_seq_len=32768)  # (a reply that runs until it is stopped)
    loaded = LoadedWeights(cfg, synthetic_weights(cfg, torch.float32, "cpu"), ByteTokenizer(cfg.vocab_size),
                           "synthetic", "tiny", "fp32")
    host.execute(Load(loaded, device="cpu", settings=replace(GREEDY, max_new_tokens=30_000), hardware=fake_cpu()))
    assert host.batch_interval_s() == BATCH_INTERVAL_S_CPU > BATCH_INTERVAL_S
    start = time.monotonic()

    def stop_after_a_while(kind, *args):  # the reply stops itself 1.5 s in (the budget is far)
        sent.append((time.monotonic(), kind))
        if time.monotonic() - start > 1.5:
            host.engine.stop()
    host.emit = stop_after_a_while
    host.execute(Chat("hello", ignore_eos=True))
    batches = [t for t, kind in sent if kind == "events"]
    assert len(batches) >= 5, batches
    gaps = [b - a for a, b in zip(batches, batches[1:-1])]  # (the last leaves with the reply's end)
    assert min(gaps) >= 0.95 * BATCH_INTERVAL_S_CPU, gaps
