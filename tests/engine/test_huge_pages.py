"""Weights on 2 MiB pages: the `membound` command asks PyTorch's CPU allocator for them before torch
loads (engine/options.py huge_page_tensors), and the bench says how much of a model's memory got them."""
import os
import subprocess
import sys
from pathlib import Path

import app.launcher as launcher
import engine.cli

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
SHARE = ("import sys; from engine.options import huge_page_tensors; huge_page_tensors(); import torch; "
         "from engine.bench.record import weight_pages; m = torch.nn.Linear(2048, 2048); m.weight.data.fill_(1); "
         "print(weight_pages(m))")


def thp_mode() -> str:  # "always", "madvise" or "never": the bracketed word
    return THP_MODE.read_text().split("[")[1].split("]")[0]


def share_in_a_fresh_process(**env) -> float:
    environ = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"} | env
    out = subprocess.run([sys.executable, "-c", SHARE], env=environ, capture_output=True, text=True, check=True)
    return eval(out.stdout.strip())["share"]  # the dict weight_pages printed


def test_the_command_asks_for_huge_pages_before_torch_loads_and_a_user_s_choice_wins(monkeypatch):
    seen = []
    monkeypatch.setattr(engine.cli, "main", lambda argv: seen.append(os.environ.get("THP_MEM_ALLOC_ENABLE")) or 0)
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    assert launcher.main(["bench"]) == 0
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "0")
    assert launcher.main(["bench"]) == 0
    assert seen == ["1", "0"]


def test_a_16_mib_weight_sits_on_huge_pages_where_the_kernel_grants_them_on_advice():
    mode = thp_mode()
    asked, refused = share_in_a_fresh_process(), share_in_a_fresh_process(THP_MEM_ALLOC_ENABLE="0")
    if mode == "never":
        assert asked == refused == 0.0
    else:  # madvise or always: the advice is granted (most of the mapping: its unaligned ends are 4 KiB pages)
        assert asked > 0.8  # 7 of its 8 huge pages at least (PyTorch aligns it to 4 KiB, not 2 MiB)
        assert refused == 0.0 if mode == "madvise" else refused > 0.5


def test_a_model_s_weights_are_packed_onto_huge_pages_with_their_values_and_aliases():
    import torch

    from engine.io.loader import synthetic_weights
    from engine.model import huge_pages
    from engine.model.config import ModelConfig
    from engine.model.quant import quantize_model
    from engine.model.transformer import Transformer

    cfg = ModelConfig(name="packed", dim=256, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=768, vocab_size=1024,
                      max_seq_len=64)
    weights = synthetic_weights(cfg, torch.float32, "cpu", seed=3)
    before = {k: v.clone() for k, v in weights.items()}
    model = Transformer(cfg, weights)
    tensors = huge_pages.model_tensors(model)
    buffer = {t.untyped_storage().data_ptr() for t in tensors}
    assert len(buffer) == 1  # every weight, norm and table in one buffer
    for name, value in weights.items():  # the loaded table points there too: the old memory is freed
        assert value.untyped_storage().data_ptr() in buffer and torch.equal(value, before[name]), name
    assert model.layers[0].wqkv.weight.data_ptr() == weights["layers.0.wq"].data_ptr()  # still the fused view
    assert model.head.weight is model.embed or torch.equal(model.head.weight, before.get("head", before["embed"]))
    tokens = torch.arange(8)[None]
    fresh = Transformer(cfg, {k: v.clone() for k, v in before.items()})
    huge_pages.pack([])  # nothing asked: nothing moved
    assert torch.equal(model(tokens, 0, None), fresh(tokens, 0, None))
    int4 = quantize_model(model, "int4", 32)
    moved = {t.untyped_storage().data_ptr() for layer in int4.layers for t in huge_pages.model_tensors(layer.wqkv)}
    assert len(moved) == 1 and not moved & buffer  # the new layers in a buffer of their own; the shared ones stay
    assert int4.embed is model.embed


def test_the_bench_counts_the_tensors_a_layer_keeps_as_plain_attributes():
    """A quantised layer keeps its CPU tiles as plain attributes, not parameters: the bench's page share
    covers them too (engine/model/huge_pages.py model_tensors is its one walk over a model)."""
    import torch

    from engine.bench.record import weight_pages

    class Tiles(torch.nn.Module):  # nothing registered: what an INT4 layer's CPU tiles look like to .parameters()
        def __init__(self):
            super().__init__()
            self.tiles = torch.ones(1 << 20, dtype=torch.uint8)

    found = weight_pages(Tiles())
    assert found is not None and 0.0 <= found["share"] <= 1.0
