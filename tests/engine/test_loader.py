"""Loaders: HF safetensors folders, GGUF files (round trip through gguf's writer), synthetic
shapes, and the one-line errors for bad files."""
import json

import pytest
import torch
from model_files import tiny_tokenizer_json

from engine.bench.hf_compare import build_hf_model
from engine.io.gguf_file import ModelFileError
from engine.io.loader import fuse_layers, load_model, synthetic_weights, unpermute_qk
from engine.model.config import ConfigError, ModelConfig
from engine.model.transformer import Transformer

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models (tests/conftest.py)


CFG = ModelConfig(name="tiny", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=300,
                  tied_embeddings=False, max_seq_len=128)


def save_hf_folder(tmp_path, cfg, weights, dtype=torch.float32):
    model = build_hf_model(cfg, weights, dtype)
    model.save_pretrained(tmp_path, safe_serialization=True)
    tiny_tokenizer_json(tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hf_folder_loads_and_matches_transformers(tmp_path, dtype):
    weights = synthetic_weights(CFG, torch.float32, "cpu", seed=1)
    hf = save_hf_folder(tmp_path, CFG, weights, dtype)
    loaded = load_model(tmp_path, dtype=torch.float32)
    assert loaded.cfg.n_kv_heads == 2 and loaded.cfg.vocab_size == 300 and not loaded.cfg.tied_embeddings
    assert loaded.source == "hf"
    ours = Transformer(loaded.cfg, loaded.weights)
    tokens = torch.randint(0, 300, (1, 9))
    with torch.no_grad():
        expect = hf.float()(tokens).logits
        got = ours(tokens, last_only=False)
    torch.testing.assert_close(got, expect, rtol=1e-4, atol=1e-4)
    assert loaded.tokenizer.encode("ab") == [loaded.tokenizer.encode("a")[0], loaded.tokenizer.encode("b")[0]]


def test_gguf_written_by_gguf_writer_loads_with_unpermuted_qk(tmp_path):
    """Write a GGUF the way llama.cpp's converter does (Q/K rows permuted, F32 tensors) and
    check the loader recovers the HF-order weights exactly."""
    import gguf

    cfg = ModelConfig(name="g", dim=64, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=300,
                      tied_embeddings=True, max_seq_len=64)
    w = synthetic_weights(cfg, torch.float32, "cpu", seed=3)
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(96)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    from tokenizers.pre_tokenizers import ByteLevel
    alphabet = sorted(ByteLevel.alphabet())
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(alphabet + [f"<x{i}>" for i in range(300 - len(alphabet))])
    writer.add_token_types([1] * len(alphabet) + [3] * (300 - len(alphabet)))
    writer.add_token_merges([])
    writer.add_eos_token_id(299)

    def permute(t, n_heads):  # what the converter does: halves of each head → interleaved pairs
        rows, cols = t.shape
        return t.reshape(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)

    assert torch.equal(unpermute_qk(permute(w["layers.0.wq"], 4), 4), w["layers.0.wq"])
    names = {"attn_norm": "attn_norm", "ffn_norm": "ffn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v",
             "wo": "attn_output", "w_gate": "ffn_gate", "w_up": "ffn_up", "w_down": "ffn_down"}
    writer.add_tensor("token_embd.weight", w["embed"].numpy())
    writer.add_tensor("output_norm.weight", w["norm"].numpy())
    for key, gname in names.items():
        t = w[f"layers.0.{key}"]
        if key == "wq":
            t = permute(t, 4)
        if key == "wk":
            t = permute(t, 2)
        writer.add_tensor(f"blk.0.{gname}.weight", t.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    loaded = load_model(path)
    assert loaded.cfg.tied_embeddings and loaded.cfg.n_kv_heads == 2 and loaded.cfg.dim == 64
    fuse_layers(w, cfg)  # the loader hands q/k/v and gate/up over fused
    assert set(loaded.weights) == set(w)
    for key in w:
        torch.testing.assert_close(loaded.weights[key], w[key], rtol=0, atol=0)


def test_missing_file_gives_one_line(tmp_path):
    with pytest.raises(ModelFileError, match="not found"):
        load_model(tmp_path / "nope.gguf")


def test_corrupt_gguf_gives_one_line(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 40)
    with pytest.raises(ModelFileError) as e:
        load_model(bad)
    assert "\n" not in str(e.value) and "bad.gguf" in str(e.value)
    notgguf = tmp_path / "x.gguf"
    notgguf.write_text("hello")
    with pytest.raises(ModelFileError, match="not a GGUF"):
        load_model(notgguf)


def test_truncated_default_model_gives_one_line(tmp_path):
    from engine.io.default_model import find_default_model
    src = find_default_model()
    cut = tmp_path / "cut.gguf"
    with open(src, "rb") as f:
        cut.write_bytes(f.read(5_000_000))
    with pytest.raises(ModelFileError) as e:
        load_model(cut)
    assert "\n" not in str(e.value)


def test_unsupported_architecture_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "n_embd": 8}))
    with pytest.raises(ConfigError, match="unsupported architecture 'GPT2LMHeadModel'"):
        load_model(tmp_path)
    with pytest.raises(ConfigError, match="unsupported architecture 'gpt2'"):
        ModelConfig.from_gguf_metadata({"general.architecture": "gpt2"})


def test_corrupt_safetensors_gives_one_line(tmp_path):
    save_hf_folder(tmp_path, CFG, synthetic_weights(CFG, torch.float32, "cpu"))
    f = next(tmp_path.glob("*.safetensors"))
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError, match="truncated"):
        load_model(tmp_path)


def test_named_shapes_and_synthetic_weights():
    cfg = ModelConfig.from_name("llama3-8b")
    assert (cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim) == (4096, 32, 32, 8, 14336)
    assert abs(cfg.n_params - 8.03e9) < 0.01e9
    assert abs(ModelConfig.from_name("smollm2-135m").n_params - 134.5e6) < 0.1e6
    with pytest.raises(ConfigError, match="unknown model shape"):
        ModelConfig.from_name("gpt-5")
    loaded = load_model("synthetic:smollm2-135m", max_context=256)
    assert loaded.cfg.max_seq_len == 256 and "random" in loaded.label
    with pytest.raises(ModelFileError, match="out of memory"):
        load_model("synthetic:llama3-70b")  # 280 GB in fp32: never fits here


def _mapped_file(address: int) -> str:
    """The file a process address is mapped from ("" for anonymous memory), from /proc/self/maps."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if low <= address < high:
                return fields[5] if len(fields) > 5 else ""
    return ""


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_sharded_hf_folder_is_memory_mapped_not_copied(tmp_path, dtype):
    from model_files import assert_logits_match, rounded, tiny_hf
    from model_files import save_hf_folder as save_tiny

    hf = tiny_hf("qwen2", seed=3)
    save_tiny(hf, tmp_path, dtype=dtype, max_shard_size="40KB")
    shards = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "model.safetensors.index.json").exists()
    loaded = load_model(tmp_path, dtype=dtype)
    name = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    assert loaded.file_format == name and f"{name} → {name}" in loaded.label
    # tensors kept in the file's dtype are views of the shards' mappings: no copy in memory
    for key in ("embed", "layers.0.wo", "layers.1.w_down", "layers.0.attn_norm", "norm"):
        assert _mapped_file(loaded.weights[key].data_ptr()).endswith(tuple(shards)), key
    # q/k/v and gate/up are fused once at load; the model takes those very tensors
    model = Transformer(loaded.cfg, loaded.weights)
    assert model.layers[0].wqkv.weight.data_ptr() == loaded.weights["layers.0.wqkv"].data_ptr()
    assert model.layers[1].w_down.weight.data_ptr() == loaded.weights["layers.1.w_down"].data_ptr()
    if dtype == torch.float32:
        assert_logits_match(loaded, hf)
    else:  # the half-precision file read into fp32 runs as transformers does on the same rounded weights
        assert_logits_match(load_model(tmp_path, dtype=torch.float32), rounded(hf, dtype))


def test_half_downloaded_sharded_folder_names_the_missing_shard(tmp_path):
    from model_files import save_hf_folder as save_tiny
    from model_files import tiny_hf

    save_tiny(tiny_hf("llama"), tmp_path, max_shard_size="40KB")
    last = sorted(tmp_path.glob("*.safetensors"))[-1]
    last.unlink()
    with pytest.raises(ModelFileError, match=f"weight shards missing \\(first: {last.name}\\)") as e:
        load_model(tmp_path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_progress_comes_per_tensor_and_raising_from_it_cancels_the_load(tmp_path, fmt):
    """The loader reports each tensor; a front end cancels a load by raising from the callback
    (the engine host does so when told to quit), and the load stops there."""
    from model_files import save_hf_folder as save_tiny, tiny_hf, write_gguf

    hf = tiny_hf("qwen3")
    path = save_tiny(hf, tmp_path / "hf") if fmt == "hf" else write_gguf(hf, tmp_path / "m.gguf")
    messages = []
    load_model(path, progress=lambda fraction, message: messages.append((fraction, message)))
    n_tensors = len(hf.state_dict())
    assert len(messages) >= n_tensors and messages[-1][0] == 1.0
    assert [f for f, _ in messages] == sorted(f for f, _ in messages)

    class Cancel(Exception):
        pass

    def cancel_at_third(fraction, message):
        if len(seen) == 3:
            raise Cancel()
        seen.append(message)

    seen = []
    with pytest.raises(Cancel):
        load_model(path, progress=cancel_at_third)
    assert len(seen) == 3


def test_the_ggml_tables_agree_with_the_gguf_package():
    """engine/io/file_headers.py keeps ggml's type and file-type tables as data (the app reads
    headers without importing gguf): every entry is gguf's."""
    import gguf

    from engine.io.file_headers import FILE_TYPES, GGML_TYPES
    for type_id, (name, block, block_bytes) in GGML_TYPES.items():
        qtype = gguf.GGMLQuantizationType(type_id)
        assert (qtype.name, *gguf.GGML_QUANT_SIZES[qtype]) == (name, block, block_bytes)
    for file_type, name in FILE_TYPES.items():
        assert gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_") == name
