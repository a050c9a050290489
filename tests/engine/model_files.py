"""Tiny model files for tests: random models made by transformers' own classes, saved as an HF
folder, and the same weights written as GGUF with the `gguf` package the way llama.cpp's converter
writes them. Helpers only (no tests here)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

VOCAB = 300  # the test tokenizer spells 258 of them; the rest are never produced by encoding


def tiny_tokenizer_json(path, vocab_size=VOCAB):
    """A byte-level BPE tokenizer.json with no merges, written with the tokenizers library."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tok.save(str(path))


def tiny_llama(seed=0, **config):
    """A random LlamaForCausalLM (fp32, eval) with weights large enough that RoPE mistakes show."""
    from transformers import LlamaConfig, LlamaForCausalLM

    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.2,
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    base.update(config)
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**base)).eval()


def save_hf_folder(model, path: Path, dtype=torch.float32, max_shard_size=None) -> Path:
    path = Path(path)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.to(dtype).save_pretrained(path, safe_serialization=True, **kwargs)
    model.float()
    tiny_tokenizer_json(path / "tokenizer.json")
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return path


@torch.no_grad()
def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@torch.no_grad()
def our_greedy(loaded, prompt: list[int], n: int) -> list[int]:
    from engine.kv.cache import ContiguousKVCache
    from engine.model.transformer import Transformer

    model = Transformer(loaded.cfg, loaded.weights)
    cache = ContiguousKVCache(loaded.cfg, 1, loaded.cfg.max_seq_len, torch.float32, "cpu")
    logits = model(torch.tensor([prompt]), 0, cache)
    got, pos = [], len(prompt)
    for _ in range(n):
        got.append(int(logits[0, -1].argmax()))
        logits = model(torch.tensor([[got[-1]]]), pos, cache)
        pos += 1
    return got
