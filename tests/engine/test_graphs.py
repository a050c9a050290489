"""engine/graphs.py's bookkeeping, on a CPU with torch.compile replaced by the eager function: which
steps count as captures and replays, compiled steps kept per model and dropped with the cache, and
any failure (a compile error, a graph Inductor skipped) switching graphs off with the reason kept.
The compile itself runs on the GPU machine (scripts/gpu_smoke.py)."""
import pytest
import torch

from engine import dispatch
from engine.graphs import CAPTURE_CALLS, CPU_CAPTURE_REFUSAL, NOT_ON_GPU, GraphDecoder
from engine.io.loader import synthetic_weights
from engine.kv.cache import ContiguousKVCache
from engine.model.config import ModelConfig
from engine.model.transformer import Transformer
from engine.context import EngineContext
from engine.options import EngineOptions

CFG = ModelConfig(name="tiny", dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, vocab_size=97, max_seq_len=64)


@pytest.fixture
def compiles(monkeypatch):
    """torch.compile -> the function itself; returns the list of functions 'compiled'."""
    calls = []

    def fake_compile(fn, **kwargs):
        calls.append(fn)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    return calls


def model(seed=0):
    return Transformer(CFG, synthetic_weights(CFG, torch.float32, "cpu", seed=seed))


def decode(decoder, m, cache, pos):
    tok = torch.tensor([[pos % CFG.vocab_size]])
    with torch.inference_mode():
        return decoder.decode(m, cache, tok, pos, "flash")


def test_steps_count_as_captures_then_replays_and_match_eager(compiles):
    m, decoder = model(), GraphDecoder("cuda")
    m.bind(EngineContext(EngineOptions(cpu_step=False)))  # the reference is PyTorch's eager step
    cache = ContiguousKVCache(CFG, 1, CFG.max_seq_len, torch.float32, "cpu")
    eager = ContiguousKVCache(CFG, 1, CFG.max_seq_len, torch.float32, "cpu")
    before = dispatch.counts()
    for pos in range(5):
        got = decode(decoder, m, cache, pos)
        with torch.inference_mode():
            want = m(torch.tensor([[pos % CFG.vocab_size]]), start_pos=pos, cache=eager)
        torch.testing.assert_close(got, want)
    assert not decoder.unavailable and decoder.replays == 5 and decoder.captures == 1 and len(compiles) == 1
    assert cache.length == 5
    torch.testing.assert_close(cache.k[:, :, :, :5], eager.k[:, :, :, :5])
    ran = dispatch.since(before)
    assert ran["decode step"] == {"compiled, capturing the cuda graph": CAPTURE_CALLS, "cuda graph": 5 - CAPTURE_CALLS}
    # as on a GPU with the flash kernel: its loop reads the live keys (these CPU tensors take the op's CPU branch)
    assert ran["attention decode"]["triton flash_decode (in the CUDA graph)"] == 5 * CFG.n_layers
    assert decoder.kv_read_tokens(m, 4, cache.max_len, "flash") is None
    assert decoder.kv_read_tokens(m, 4, cache.max_len, "naive") == cache.max_len  # naive: the whole buffer, masked


def test_compiled_steps_are_kept_per_model_and_dropped_with_the_cache(compiles):
    a, b, decoder = model(0), model(1), GraphDecoder("cuda")
    cache = ContiguousKVCache(CFG, 1, CFG.max_seq_len, torch.float32, "cpu")
    for m in (a, b, a, b):  # switching weights back and forth compiles each model once
        decode(decoder, m, cache, 0)
    assert len(compiles) == 2 and decoder.captures == 2
    cache = ContiguousKVCache(CFG, 1, CFG.max_seq_len, torch.float32, "cpu")
    decode(decoder, a, cache, 0)  # a new cache
    assert len(compiles) == 3 and decoder.captures == 3
    # the same cache object with new K/V (as a paged cache's precision switch gives): the captured step
    # wrote the old buffers' addresses, so it is dropped too (an id of a freed cache can come back)
    old_kv = cache.k, cache.v  # (still alive: the check is by identity, never by value)
    cache.k, cache.v = cache.k.clone(), cache.v.clone()
    decode(decoder, a, cache, 0)
    assert len(compiles) == 4 and decoder.captures == 4


def test_a_failed_compile_switches_graphs_off_with_the_reason(monkeypatch):
    def broken(fn, **kwargs):
        raise RuntimeError("Triton is missing\nmore lines")

    monkeypatch.setattr(torch, "compile", broken)
    m, decoder = model(), GraphDecoder("cuda")
    cache = ContiguousKVCache(CFG, 1, CFG.max_seq_len, torch.float32, "cpu")
    logits = decode(decoder, m, cache, 0)  # still answered, eagerly
    assert logits.shape == (1, 1, CFG.vocab_size) and cache.length == 1
    assert decoder.unavailable == "capture failed: RuntimeError: Triton is missing" and decoder.replays == 0
    assert not decoder.active(True)  # eager from now on


def test_a_graph_inductor_skipped_switches_graphs_off(compiles, monkeypatch):
    from torch._dynamo.utils import counters

    m, decoder = model(), GraphDecoder("cuda")
    cache = ContiguousKVCache(CFG, 1, CFG.max_seq_len, torch.float32, "cpu")
    step = m.forward_decode_static

    def skipping(*args):  # what a compile that leaves the graph out does: it counts a skip
        counters["inductor"]["cudagraph_skips"] += 1
        return step(*args)

    monkeypatch.setattr(m, "forward_decode_static", skipping)
    decode(decoder, m, cache, 0)
    assert decoder.unavailable.startswith("capture failed: RuntimeError: Inductor skipped the CUDA graph")
    assert decoder.replays == 0 and GraphDecoder("cpu").unavailable == NOT_ON_GPU
    assert GraphDecoder("cpu").refusal == CPU_CAPTURE_REFUSAL and decoder.refusal == decoder.unavailable


def test_the_cpu_compiled_step_for_the_overhead_sweep(compiles, monkeypatch):
    def no_cuda(*args):
        raise AssertionError("a CPU step must not touch CUDA")

    monkeypatch.setattr(torch.cuda, "synchronize", no_cuda)
    m, decoder = model(), GraphDecoder("cpu", cpu_compile=True)
    assert decoder.kind == "compiled step" and not decoder.unavailable and GraphDecoder("cpu").kind == ""
    cache = ContiguousKVCache(CFG, 1, CFG.max_seq_len, torch.float32, "cpu")
    before = dispatch.counts()
    for pos in range(3):
        decode(decoder, m, cache, pos)
    assert decoder.replays == 3 and not decoder.unavailable and len(compiles) == 1
    assert dispatch.since(before)["decode step"] == {"compiled step (Inductor C++)": 3}


@pytest.mark.parametrize("on_gpu", [False, True])
def test_the_captured_step_keeps_each_layers_attention_options(monkeypatch, on_gpu):
    """Gemma 2's soft-capped scores and 8-key window on every other layer, through the capturable step
    over the whole buffer: the same logits as eager decoding, token by token, on the CPU's branch (the
    live keys sliced) and the GPU's (the buffer masked, as no kernel takes these options: the cost
    model is told the whole buffer is read)."""
    from engine.model import attention
    monkeypatch.setattr(attention, "_on_gpu", lambda q: on_gpu)
    cfg = ModelConfig.from_gguf_metadata({
        "general.architecture": "gemma2", "gemma2.embedding_length": 64, "gemma2.attention.head_count": 4,
        "gemma2.block_count": 2, "gemma2.feed_forward_length": 96, "gemma2.vocab_size": 97,
        "gemma2.attention.key_length": 16, "gemma2.attention.sliding_window": 8, "gemma2.context_length": 64,
        "gemma2.attn_logit_softcapping": 50.0, "gemma2.final_logit_softcapping": 30.0})
    m = Transformer(cfg, synthetic_weights(cfg, torch.float32, "cpu", seed=4),
                    EngineContext(EngineOptions(cpu_step=False)))  # the reference is PyTorch's eager step
    tokens = torch.randint(0, cfg.vocab_size, (1, 30), generator=torch.Generator().manual_seed(4))
    eager = ContiguousKVCache(cfg, 1, cfg.max_seq_len, torch.float32, "cpu")
    static = ContiguousKVCache(cfg, 1, cfg.max_seq_len, torch.float32, "cpu")
    with torch.inference_mode():
        m(tokens[:, :10], 0, eager)
        m(tokens[:, :10], 0, static)
        for pos in range(10, 30):  # past the window: it slides
            want = m(tokens[:, pos:pos + 1], pos, eager)
            got = m.forward_decode_static(tokens[:, pos:pos + 1], torch.tensor([pos]), static)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert GraphDecoder("cuda").kv_read_tokens(m, 29, cfg.max_seq_len, "flash") == cfg.max_seq_len
    assert GraphDecoder("cuda").kv_read_tokens(model(), 29, CFG.max_seq_len, "flash") is None  # Llama: the kernel
