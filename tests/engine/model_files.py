"""Tiny model files for tests: random models made by transformers' own classes, saved as an HF
folder, and the same weights written as GGUF with the `gguf` package the way llama.cpp's converter
writes them (Q/K rows interleaved for llama-arch files, RoPE-scaling keys, the rope_freqs tensor of
a Llama 3.x model, 1-D tensors kept in F32). Helpers only (no tests here)."""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import torch

VOCAB = 300  # the test tokenizer spells 258 of them; the rest are never produced by encoding
SPECIALS = ["<|im_start|>", "<|im_end|>"]
FAMILIES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3", "gemma2": "Gemma2",
            "gemma3": "Gemma3", "phi3": "Phi3"}
GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
             "gemma3": "gemma3", "phi3": "phi3"}  # as the converter names them
CONFIG_CLASSES = {"gemma3": "Gemma3TextConfig"}  # the text model's config (Gemma3Config is the multimodal one)


def byte_alphabet() -> list[str]:
    from tokenizers.pre_tokenizers import ByteLevel
    return sorted(ByteLevel.alphabet())


def tiny_tokenizer_json(path):
    """A byte-level BPE tokenizer.json with no merges, written with the tokenizers library."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(byte_alphabet())}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    tok.save(str(path))


def tiny_hf(family: str = "llama", seed: int = 0, **config):
    """A random `<Family>ForCausalLM` (fp32, eval), weights large enough that a wrong RoPE, bias or
    norm changes the text; biases and norm weights random too (transformers starts them at 0 and 1)."""
    import transformers

    name = FAMILIES[family]
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.2,
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if family == "mistral":
        base["sliding_window"] = 4096  # wider than the context: full attention, as HF runs it too
    if family in ("gemma2", "gemma3"):  # Gemma ties its head; windows of 5 keys so a 17-token test slides
        base.update(tie_word_embeddings=True, sliding_window=5, query_pre_attn_scalar=16)
    if family == "phi3":
        base.update(pad_token_id=0, sliding_window=None)
        base.pop("head_dim")
    base.update(config)
    torch.manual_seed(seed)
    config_class = getattr(transformers, CONFIG_CLASSES.get(family, f"{name}Config"))
    model = getattr(transformers, f"{name}ForCausalLM")(config_class(**base))
    if family == "gemma2":
        model.config._attn_implementation = "eager"  # its soft-capped scores: transformers' eager path
    model.eval()
    init_random(model, gemma=family in ("gemma2", "gemma3"))
    return model


def init_random(model, gemma: bool = False) -> None:
    """Biases and norm weights random too (transformers starts them at 0 and 1; Gemma's norms scale
    by 1 + w, so theirs are drawn around 0)."""
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("bias"):
                p.normal_(0.0, 0.5)
            elif "norm" in pname:
                p.copy_((0.0 if gemma else 1.0) + 0.1 * torch.randn_like(p))


def tiny_gemma3_multimodal(seed: int = 0, **text):
    """A random Gemma3ForConditionalGeneration: a tiny SigLIP vision tower and projector beside the
    language model (what the multimodal Gemma 3 checkpoints hold); membound runs its text part."""
    import transformers

    text_config = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                       rms_norm_eps=1e-5, sliding_window=5, query_pre_attn_scalar=24, initializer_range=0.2, **text)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    config = transformers.Gemma3Config(text_config=text_config, vision_config=vision, mm_tokens_per_image=4,
                                       image_token_index=VOCAB - 1, boi_token_index=VOCAB - 2,
                                       eoi_token_index=VOCAB - 3)
    torch.manual_seed(seed)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    init_random(model, gemma=True)
    return model


def rounded(model, dtype):
    """A copy of `model` whose weights are rounded to `dtype` and back (its RoPE buffers untouched)."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            p.copy_(p.to(dtype).float())
    return out


def tiny_llama(seed=0, **config):
    return tiny_hf("llama", seed, **config)


def save_hf_folder(model, path: Path, dtype=torch.float32, max_shard_size=None) -> Path:
    path = Path(path)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    copy.deepcopy(model).to(dtype).save_pretrained(path, safe_serialization=True, **kwargs)
    tiny_tokenizer_json(path / "tokenizer.json")
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return path


# ---- GGUF, the converter's way -------------------------------------------------------------
def interleave_qk(t: np.ndarray, n_heads: int) -> np.ndarray:
    """The converter's row order for llama-arch Q and K: each head's two halves interleaved."""
    rows = t.shape[0]
    return t.reshape(n_heads, 2, rows // n_heads // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)


def llama3_rope_factors(head_dim: int, theta: float, rope: dict) -> np.ndarray:
    """rope_freqs for a Llama 3.x model: per frequency, what its inverse frequency is divided by."""
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    original, factor = rope["original_max_position_embeddings"], rope["factor"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    out = []
    for wavelen in 2 * math.pi / inv:
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def sentencepiece_vocab(size: int) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocabulary of `size` pieces as llama.cpp stores Llama 2's: <unk>, <s>,
    </s>, the 256 <0xNN> byte pieces, then "▁"-spaced pieces with falling scores."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    words = ["▁", *"abcdefghijklmnopqrstuvwxyz", "▁t", "he", "▁the", "▁a", "in", "er", "▁w", "or", "▁h", "ll",
             "llo", "▁hello", "orld", "▁world", "▁m", "em", "▁mem", "ory", "▁memory", "▁wa", "▁wall", "é", "ca",
             "▁ca", "▁café", "▁▁", "▁▁▁", "ing", "▁d", "ec", "ode", "▁decode", "ead", "▁r", "▁read", "[INST]"]
    tokens += words
    types += [1] * (len(words) - 1) + [3]
    tokens += [f"[PAD{i}]" for i in range(size - len(tokens))]
    types += [5] * (size - len(types))
    scores = [0.0] * 259 + [-float(i) for i in range(size - 259)]
    return tokens, scores, types


QUANTISABLE = ()  # the types gguf.quants.quantize makes (filled below, from the installed package)
# a chat template in Gemma's turn format (written for these tests): user and model turns, no system role
GEMMA_STYLE_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('no system turns') }}{% endif %}"
    "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] | trim }}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def write_gguf(model, path: Path, qtype=None, raw_blocks=None, file_type=None, sentencepiece=False) -> Path:
    """`model`'s weights as a GGUF file. qtype: the type of every 2-D weight (default F32), or a
    function (tensor name, shape) -> type (a mixed file: Q4_K_M's Q6_K head and FFN-down layers);
    made with gguf.quants.quantize, or, where gguf has no quantiser (K-quants), by `raw_blocks(shape,
    type)`. sentencepiece: a Llama 2 style vocabulary (tokenizer model "llama") instead of byte-level
    BPE; Gemma's (no space prefix, its turn tokens) for a Gemma model."""
    import gguf
    from gguf import GGMLQuantizationType as Q

    qtype = Q.F32 if qtype is None else qtype
    c = model.config
    family = {"gemma3_text": "gemma3"}.get(c.model_type, c.model_type)
    arch = GGUF_ARCH[family]
    rope = dict(c.rope_parameters or {})
    if "full_attention" in rope:  # per layer type (Gemma 3): the global layers' base and scaling
        rope = dict(rope["full_attention"])
    theta = float(rope.get("rope_theta", 10000.0))
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    gemma = family in ("gemma2", "gemma3")
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny {family}")
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_freq_base(theta)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_vocab_size(c.vocab_size)
    writer.add_file_type(file_type if file_type is not None else gguf.LlamaFileType.ALL_F32)
    if family == "gemma2":
        writer.add_attn_logit_softcapping(c.attn_logit_softcapping)
        writer.add_final_logit_softcapping(c.final_logit_softcapping)
    if gemma:
        writer.add_sliding_window(c.sliding_window)
    if family == "phi3":  # partial rotary, the window (0: none), longrope's original context
        rotary = int(head_dim * rope.get("partial_rotary_factor", 1.0))
        writer.add_rope_dimension_count(rotary)
        writer.add_sliding_window(c.sliding_window or 0)
        if rope.get("original_max_position_embeddings"):
            writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    kind = rope.get("rope_type", "default")
    if kind == "longrope":
        scale = c.max_position_embeddings / rope["original_max_position_embeddings"]
        writer.add_rope_scaling_attn_factors(
            math.sqrt(1 + math.log(scale) / math.log(rope["original_max_position_embeddings"])) if scale > 1 else 1.0)
        writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
    if kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    elif kind == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        if rope.get("attention_factor") is not None:
            writer.add_rope_scaling_yarn_attn_factor(rope["attention_factor"])
        if rope.get("beta_fast") is not None:
            writer.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        if rope.get("beta_slow") is not None:
            writer.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    if sentencepiece:
        tokens, scores, types = sentencepiece_vocab(c.vocab_size)
        if gemma:  # Gemma's SentencePiece vocabulary: no space prefix, turns marked by its own tokens
            writer.add_add_space_prefix(False)
            tokens[-3:] = ["<start_of_turn>", "<end_of_turn>", "<pad>"]
            types[-3:] = [3, 3, 3]
            writer.add_chat_template(GEMMA_STYLE_TEMPLATE)
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_unk_token_id(0)
    else:
        n_pad = c.vocab_size - 256 - len(SPECIALS)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(byte_alphabet() + SPECIALS + [f"[PAD{i}]" for i in range(n_pad)])
        writer.add_token_types([1] * 256 + [3] * len(SPECIALS) + [5] * n_pad)
        writer.add_token_merges([])
        writer.add_eos_token_id(256 + SPECIALS.index("<|im_end|>"))

    def add(name: str, t: torch.Tensor) -> None:
        a = t.detach().float().numpy()
        if gemma and name.endswith("norm.weight"):  # the converter stores Gemma's norms as 1 + w
            a = a + 1.0
        kind = qtype if not callable(qtype) else qtype(name, a.shape)
        if a.ndim == 1 or kind == Q.F32:
            writer.add_tensor(name, a)
        elif raw_blocks is not None and kind not in QUANTISABLE:
            writer.add_tensor(name, raw_blocks(a.shape), raw_dtype=kind)
        elif kind not in QUANTISABLE:  # Q4_K, Q6_K: our encoders (gguf dequantises them, cannot quantise)
            from kquants import ENCODERS
            writer.add_tensor(name, ENCODERS[kind.name](a), raw_dtype=kind)
        else:
            writer.add_tensor(name, gguf.quants.quantize(a, kind), raw_dtype=kind)

    if kind == "llama3" and arch == "llama":
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(head_dim, theta, rope))
    sd = model.state_dict()
    add("token_embd.weight", sd["model.embed_tokens.weight"])
    add("output_norm.weight", sd["model.norm.weight"])
    if not c.tie_word_embeddings:
        add("output.weight", sd["lm_head.weight"])
    norms = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight"}
    if gemma:  # Gemma's four norms: "post_attention_layernorm" is the attention's output norm
        norms = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
                 "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                 "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}
    parts = {**norms,
             "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
             "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
             "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
             "mlp.down_proj.weight": "ffn_down.weight", "self_attn.q_proj.bias": "attn_q.bias",
             "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
             "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
             "self_attn.qkv_proj.weight": "attn_qkv.weight", "mlp.gate_up_proj.weight": "ffn_up.weight"}  # Phi-3
    for i in range(c.num_hidden_layers):
        for hf_name, gguf_name in parts.items():
            t = sd.get(f"model.layers.{i}.{hf_name}")
            if t is None:
                continue
            if arch == "llama" and gguf_name.startswith(("attn_q.", "attn_k.")):
                heads = c.num_attention_heads if gguf_name.startswith("attn_q.") else c.num_key_value_heads
                t = torch.from_numpy(interleave_qk(t.numpy(), heads))
            add(f"blk.{i}.{gguf_name}", t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


# ---- running both --------------------------------------------------------------------------
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


@torch.no_grad()
def assert_logits_match(loaded, hf, n_prompt: int = 9, n_decode: int = 8, seed: int = 0, tol: float = 1e-4):
    """Our prefill logits, then `n_decode` single-token steps on the KV cache, against transformers'
    logits of the whole sequence at each position (fp32)."""
    from engine.kv.cache import ContiguousKVCache
    from engine.model.transformer import Transformer

    cfg = loaded.cfg
    tokens = torch.randint(0, cfg.vocab_size, (1, n_prompt + n_decode), generator=torch.Generator().manual_seed(seed))
    expect = hf(tokens).logits
    model = Transformer(cfg, loaded.weights)
    cache = ContiguousKVCache(cfg, 1, cfg.max_seq_len, torch.float32, "cpu")
    prefill = model(tokens[:, :n_prompt], 0, cache, last_only=False)
    torch.testing.assert_close(prefill, expect[:, :n_prompt], rtol=tol, atol=tol)
    for pos in range(n_prompt, n_prompt + n_decode):
        step = model(tokens[:, pos:pos + 1], pos, cache)
        torch.testing.assert_close(step[:, 0], expect[:, pos], rtol=tol, atol=tol)


def _quantisable() -> tuple:
    import gguf
    from gguf.quants import _type_traits

    out = []
    for qtype, traits in _type_traits.items():
        try:
            traits.quantize(np.zeros((1, 256), dtype=np.float32))
            out.append(qtype)
        except NotImplementedError:
            pass
    return tuple(out) + (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)


QUANTISABLE = _quantisable()


def q4_k_m(tied: bool = False):
    """write_gguf's qtype for llama.cpp's Q4_K_M mix, in small: Q6_K for the head (the embeddings
    where they are tied) and layer 0's FFN-down, Q4_K for every other matrix."""
    from gguf import GGMLQuantizationType as Q

    head = "token_embd.weight" if tied else "output.weight"
    return lambda name, shape: Q.Q6_K if name in (head, "blk.0.ffn_down.weight") else Q.Q4_K


@torch.no_grad()
def hf_with_gguf_weights(model, path: Path):
    """A copy of `model` running the matrices a GGUF file holds, dequantised by gguf (the oracle for
    a quantised file: transformers on the very weights membound loads)."""
    from gguf.quants import dequantize

    from engine.io.gguf_file import open_gguf

    out = copy.deepcopy(model)
    c = out.config
    family = {"gemma3_text": "gemma3"}.get(c.model_type, c.model_type)
    names = {"attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
             "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
             "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
             "ffn_down.weight": "mlp.down_proj.weight", "attn_qkv.weight": "self_attn.qkv_proj.weight"}
    if family == "phi3":
        names["ffn_up.weight"] = "mlp.gate_up_proj.weight"
    params = dict(out.named_parameters())
    for t in open_gguf(path).tensors:
        if len(t.shape) != 2:
            continue  # norms stay F32: their values are the model's
        w = torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32))
        if t.name == "token_embd.weight":
            target = "model.embed_tokens.weight"
        elif t.name == "output.weight":
            target = "lm_head.weight"
        else:
            _, idx, rest = t.name.split(".", 2)
            target = f"model.layers.{idx}.{names[rest]}"
            if GGUF_ARCH[family] == "llama" and rest in ("attn_q.weight", "attn_k.weight"):
                from engine.io.loader import unpermute_qk
                w = unpermute_qk(w, c.num_attention_heads if rest == "attn_q.weight" else c.num_key_value_heads)
        params[target].copy_(w)
    return out
