"""GGUF tensor types people download, each round-tripped: a tiny model's matrices stored in the type
(quantised by the `gguf` package; for the K-quants, which it cannot quantise, random blocks with finite
scales), loaded through membound's loader, compared bit-exactly with gguf's own dequantisation."""
import numpy as np
import pytest
import torch
from model_files import tiny_hf, write_gguf

from engine.io.gguf_file import open_gguf
from engine.io.loader import load_model, unpermute_qk


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models (tests/conftest.py)

TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
# byte offsets of the fp16 scales in each K-quant block (ggml's block layouts)
K_SCALE_OFFSETS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_k_blocks(qtype_name: str, seed: int):
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    qtype = GGMLQuantizationType[qtype_name]
    block, type_size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)

    def make(shape):
        rows, cols = shape
        blocks = rng.integers(0, 256, size=(rows, cols // block, type_size), dtype=np.uint8)
        for offset in K_SCALE_OFFSETS[qtype_name]:  # scales of 1e-3 .. 1e-2: finite, weight-sized
            blocks[..., offset:offset + 2] = rng.uniform(1e-3, 1e-2, blocks.shape[:2]).astype(np.float16) \
                .view(np.uint8).reshape(*blocks.shape[:2], 2)
        return blocks.reshape(rows, cols // block * type_size)
    return make


@pytest.mark.parametrize("name", TYPES)
def test_each_type_round_trips_bit_exactly_against_gguf(tmp_path, name):
    import gguf
    from gguf.quants import dequantize

    qtype = gguf.GGMLQuantizationType[name]
    # rows of 256 so every block size divides them (the K-quants need 256)
    hf = tiny_hf("llama", hidden_size=256, intermediate_size=256, head_dim=64, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=300)
    raw = random_k_blocks(name, seed=len(name)) if name in K_SCALE_OFFSETS else None
    path = write_gguf(hf, tmp_path / f"tiny.{name}.gguf", qtype=qtype, raw_blocks=raw)
    loaded = load_model(path)
    assert loaded.file_format == "F32"  # the file says ALL_F32 (write_gguf's default file type)
    reader = open_gguf(path)
    stored = {t.name: t for t in reader.tensors}
    assert stored["blk.0.attn_q.weight"].tensor_type == qtype
    cfg = loaded.cfg
    for gguf_name, key, rows in [("token_embd.weight", "embed", None), ("output.weight", "head", None),
                                 ("blk.1.ffn_down.weight", "layers.1.w_down", None),
                                 ("blk.0.attn_output.weight", "layers.0.wo", None),
                                 ("blk.0.attn_q.weight", "layers.0.wqkv", (0, cfg.q_dim)),
                                 ("blk.0.attn_k.weight", "layers.0.wqkv", (cfg.q_dim, cfg.q_dim + cfg.kv_dim)),
                                 ("blk.1.ffn_up.weight", "layers.1.w_gate_up", (cfg.ffn_dim, 2 * cfg.ffn_dim))]:
        t = stored[gguf_name]
        expect = torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32))
        if gguf_name.startswith("blk.0.attn_q"):
            expect = unpermute_qk(expect, cfg.n_heads)
        elif gguf_name.startswith("blk.0.attn_k"):
            expect = unpermute_qk(expect, cfg.n_kv_heads)
        got = loaded.weights[key] if rows is None else loaded.weights[key][rows[0]:rows[1]]
        assert got.shape == expect.shape and torch.isfinite(got).all()
        assert torch.equal(got, expect), gguf_name
    if name != "F32":  # the values differ from the model's own by the type's rounding, and only by that
        assert not torch.equal(loaded.weights["layers.0.wo"], hf.model.layers[0].self_attn.o_proj.weight)


def test_mixed_file_says_what_it_held(tmp_path):
    """A Q4_K_M file mixes types (llama.cpp keeps some tensors in Q6_K): the model line names the file
    type, then the precision it runs at."""
    import gguf

    hf = tiny_hf("qwen2", hidden_size=256, intermediate_size=256, head_dim=64, num_attention_heads=4,
                 num_key_value_heads=2)
    path = write_gguf(hf, tmp_path / "tiny.Q4_K_M.gguf", qtype=gguf.GGMLQuantizationType.Q4_K,
                      raw_blocks=random_k_blocks("Q4_K", seed=1), file_type=gguf.LlamaFileType.MOSTLY_Q4_K_M)
    loaded = load_model(path, dtype=torch.bfloat16)
    assert loaded.file_format == "Q4_K_M" and "Qwen2, Q4_K_M → bf16" in loaded.label
    assert loaded.weights["layers.0.wqkv"].dtype == torch.bfloat16


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
def test_our_k_quant_encoders_decode_with_gguf_to_the_weights(name):
    """The test files' Q4_K/Q6_K blocks (tests/engine/kquants.py) are real K-quants: gguf's own
    dequantiser reads them back to the weights within the type's step."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    from kquants import ENCODERS

    w = np.random.default_rng(3).normal(0.0, 0.2, size=(8, 512)).astype(np.float32)
    w[0, :256] = 0.0  # an all-zero block
    back = dequantize(ENCODERS[name](w), GGMLQuantizationType[name])
    assert back.shape == w.shape and np.isfinite(back).all()
    step = {"Q4_K": 1 / 15, "Q6_K": 1 / 31}[name]  # one code step of each sub-block's range
    assert np.abs(back - w).max() <= 1.1 * step * 2 * np.abs(w).max()
    assert np.abs(back - w).mean() < 0.25 * step * np.abs(w).max()
    assert np.all(back[0, :256] == 0.0)
