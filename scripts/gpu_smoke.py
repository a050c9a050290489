"""GPU smoke check: the CUDA-graph decode step gives the eager step's tokens, the figures it
reports are finite and under the peak, and a batched plan (the Triton paged decode kernel over
ragged rows, chunked prefill, pre-emption) gives every request the tokens it gets alone. Run by
scripts/gpu_check.sh; `python scripts/gpu_smoke.py --device cpu` runs the batched check here."""
import argparse
import math

import torch

from engine.engine import Engine
from engine.events import TokenEvent
from engine.io.byte_tokenizer import ByteTokenizer
from engine.io.loader import LoadedWeights, synthetic_weights
from engine.kv.cache import ContiguousKVCache
from engine.metrics import StepMetrics
from engine.model.config import ModelConfig
from engine.model.transformer import Transformer
from engine.serving.batch_forward import BatchRunner
from engine.serving.scheduler import Request
from engine.settings import SamplingParams, Settings


def graphs_match_eager() -> None:
    cfg = ModelConfig.from_name("llama3.2-1b").with_max_seq_len(2048)
    weights = synthetic_weights(cfg, torch.bfloat16, "cuda", seed=0)
    loaded = LoadedWeights(cfg, weights, ByteTokenizer(cfg.vocab_size), "synthetic", "llama3.2-1b", "bf16")
    greedy = SamplingParams(greedy=True, temperature=0.0)
    prompt = list(range(1, 100))
    runs = {}
    for graphs in (False, True):
        eng = Engine(loaded, device="cuda", settings=Settings(dtype="bf16", max_new_tokens=48, sampling=greedy,
                                                              cuda_graphs=graphs))
        events = list(eng.generate(prompt))
        tokens = [e.token_id for e in events if isinstance(e, TokenEvent)]
        steps = [e for e in events if isinstance(e, StepMetrics) and e.phase == "decode"]
        mbu = [s.mbu for s in steps[10:]]
        print(f"cuda_graphs={graphs}: graphs={eng.graphs.unavailable or 'used'} decode tok/s "
              f"{len(steps) / sum(s.step_s for s in steps):.1f}, MBU median {sorted(mbu)[len(mbu) // 2]:.2%}")
        assert all(math.isfinite(s.achieved_gbs) and s.mbu < 1.05 for s in steps), "MBU above peak: a wrong figure"
        runs[graphs] = tokens
    same = sum(a == b for a, b in zip(runs[False], runs[True]))
    print(f"tokens equal eager vs graph: {same}/{len(runs[False])}")
    assert same >= len(runs[False]) - 2, "graph decode diverges from eager"  # bf16 near-ties may flip late tokens


def batched_matches_solo(device: str) -> None:
    """Five ragged requests through BatchRunner on a pool small enough to pre-empt, against each
    run alone through the model's contiguous cache (fp32, weights scaled up: sharp logits, so
    TF32 rounding cannot flip a greedy token)."""
    cfg = ModelConfig(name="tiny", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=256,
                      tied_embeddings=True, max_seq_len=200)
    w = synthetic_weights(cfg, torch.float32, device, seed=3)
    model = Transformer(cfg, {k: v * 20 if "norm" not in k else v for k, v in w.items()})
    gen = torch.Generator().manual_seed(0)
    lengths = [(5, 8), (17, 6), (1, 9), (11, 7), (3, 5)]  # (prompt, new tokens)
    requests = [Request(i, torch.randint(1, cfg.vocab_size, (p,), generator=gen).tolist(), n)
                for i, (p, n) in enumerate(lengths)]
    runner = BatchRunner(model, num_blocks=12, block_size=4, max_batch_size=4, token_budget=10, chunk_size=6)
    pending, steps = list(requests), 0
    while pending or runner.scheduler.has_unfinished:
        if pending and steps % 2 == 0:
            runner.scheduler.add_request(pending.pop(0))
        runner.step()
        steps += 1
    assert runner.scheduler.num_preemptions > 0 and runner.cache.manager.pool.num_free == 12
    for req in requests:
        cache = ContiguousKVCache(cfg, 1, len(req.prompt_ids) + req.max_new_tokens, torch.float32, device)
        with torch.inference_mode():
            logits = model(torch.tensor([req.prompt_ids], device=device), 0, cache)[0, -1]
            alone = []
            for _ in range(req.max_new_tokens):
                alone.append(int(logits.argmax()))
                logits = model(torch.tensor([[alone[-1]]], device=device), cache.length, cache)[0, -1]
        assert req.output_ids == alone, f"request {req.request_id}: batched {req.output_ids} != alone {alone}"
    print(f"batched == alone on {device}: {len(requests)} requests, {steps} steps, "
          f"{runner.scheduler.num_preemptions} pre-emptions")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    device = p.parse_args().device
    if device == "cuda":
        graphs_match_eager()
    batched_matches_solo(device)
    print("smoke ok")
