"""Gemma 2, Gemma 3 and Phi-3 beyond the float files: the K-quant mix real GGUF files hold, the
SentencePiece vocabulary Gemma ships, what each setting does with them, and the cost model's count
of what their layers read."""
import pytest
import torch
from model_files import (
    assert_logits_match,
    hf_greedy,
    hf_with_gguf_weights,
    our_greedy,
    q4_k_m,
    tiny_hf,
    write_gguf,
)

from engine.io.loader import load_model

KQ = dict(hidden_size=256, intermediate_size=256, head_dim=64, num_attention_heads=4, num_key_value_heads=2)
FAMILIES = {
    "gemma2": dict(KQ, query_pre_attn_scalar=64),
    "gemma3": dict(KQ, query_pre_attn_scalar=64, num_hidden_layers=6),
    "phi3": {k: v for k, v in KQ.items() if k != "head_dim"} | dict(
        original_max_position_embeddings=64,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                         "short_factor": [1.0 + 0.02 * i for i in range(24)], "long_factor": [2.0] * 24}),
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models (tests/conftest.py)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_q4_k_m_file_matches_transformers_on_its_weights(tmp_path, family):
    """Q4_K matrices with a Q6_K head (Gemma: its tied embeddings) and FFN-down, as llama.cpp's
    Q4_K_M mixes them, encoded from the model's weights: the loaded file against transformers run on
    the same dequantised weights, at fp32 tolerance, and the greedy tokens."""
    import gguf

    hf = tiny_hf(family, seed=7, **FAMILIES[family])
    tied = hf.config.tie_word_embeddings
    path = write_gguf(hf, tmp_path / f"tiny-{family}.Q4_K_M.gguf", qtype=q4_k_m(tied),
                      file_type=gguf.LlamaFileType.MOSTLY_Q4_K_M)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    head = "token_embd.weight" if tied else "output.weight"
    assert types["blk.0.ffn_down.weight"] == types[head] == "Q6_K" and types["blk.1.ffn_down.weight"] == "Q4_K"
    assert types["blk.0.attn_norm.weight"] == "F32"
    loaded = load_model(path)
    assert f"{loaded.cfg.family}, Q4_K_M → fp32" in loaded.label
    oracle = hf_with_gguf_weights(hf, path)
    assert not torch.equal(oracle.model.layers[0].mlp.down_proj.weight, hf.model.layers[0].mlp.down_proj.weight)
    assert_logits_match(loaded, oracle)
    prompt = loaded.tokenizer.encode("Decode reads every weight")
    assert our_greedy(loaded, prompt, 12) == hf_greedy(oracle, prompt, 12)


# ---- the cost model ----------------------------------------------------------------------------

def gemma_like(**changes):
    from dataclasses import replace

    from engine.model.config import ModelConfig
    cfg = ModelConfig(name="g", dim=64, n_layers=6, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=96, vocab_size=300,
                      max_seq_len=4096, arch="gemma3", qk_norm=True, activation="gelu_tanh", embed_scale=8.0,
                      post_norms=True, sliding_window=5, layer_types=("sliding",) * 5 + ("full",),
                      rope_local_theta=10000.0)
    return replace(cfg, **changes)


@pytest.mark.parametrize("context,new", [(0, 1), (0, 17), (3, 1), (4, 1), (100, 1), (2, 9), (100, 7), (4, 3)])
def test_sliding_layers_read_and_attend_within_their_window(context, new):
    """A sliding layer's queries see at most the window's keys (its W - 1 cached ones beside the new
    token): the bytes and FLOPs counted are those, checked against a count key by key."""
    from engine.metrics import step_cost

    cfg = gemma_like()
    cost = step_cost(cfg, batch_size=1, new_tokens=new, context_len=context, weight_bytes=0, kv_elem_bytes=2)
    W = cfg.sliding_window
    seen = cached = 0
    for layer in range(cfg.n_layers):
        window = cfg.layer_window(layer)
        for p in range(context, context + new):  # the query at position p sees keys max(0, p - W + 1) .. p
            seen += min(p + 1, window) if window else p + 1
        cached += min(context, W - 1) if window else context  # earliest query's cached keys
    assert cost.kv_read_bytes == cached * 2 * cfg.kv_dim * 2
    assert cost.attention_flops == 2 * 2 * cfg.q_dim * seen
    full = step_cost(gemma_like(layer_types=(), sliding_window=0), batch_size=1, new_tokens=new, context_len=context,
                     weight_bytes=0, kv_elem_bytes=2)
    assert cost.kv_read_bytes <= full.kv_read_bytes and (context < W or cost.kv_read_bytes < full.kv_read_bytes)


def test_soft_capped_scores_are_counted_in_memory_and_four_norms_a_layer():
    from engine.metrics import step_cost

    capped = gemma_like(attn_softcap=50.0, layer_types=(), sliding_window=0)
    flash = step_cost(capped, batch_size=1, new_tokens=1, context_len=63, weight_bytes=0, kv_elem_bytes=4)
    assert flash.attention_bytes == 2 * capped.n_layers * capped.n_heads * 64 * 4  # written, then read back
    plain = step_cost(gemma_like(layer_types=(), sliding_window=0), batch_size=1, new_tokens=1, context_len=63,
                      weight_bytes=0, kv_elem_bytes=4)
    assert plain.attention_bytes == 0
    cfg = gemma_like()
    assert cfg.layer_vector_params == 4 * cfg.dim + 2 * cfg.head_dim  # four norms, q and k norms


def test_a_decode_step_reads_only_the_window_it_counts():
    """flash attention at decode hands SDPA the window's keys alone (what the cost model counts)."""
    from engine.model.attention import attend, naive_attention

    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 40, 16), torch.randn(1, 2, 40, 16)
    windowed = attend(q, k, v, "flash", window=5)
    assert torch.allclose(windowed, attend(q, k[:, :, -5:], v[:, :, -5:], "flash"), atol=1e-6)
    assert torch.allclose(windowed, naive_attention(q, k, v, window=5), atol=1e-5)
    assert not torch.allclose(windowed, attend(q, k, v, "flash"), atol=1e-3)


# ---- every setting, on each family ------------------------------------------------------------

SETTINGS_CASES = {"gemma2": dict(), "gemma3": dict(num_hidden_layers=6),
                  "phi3": dict(sliding_window=7)}  # (Phi-3-mini: a window on every layer)


@pytest.mark.parametrize("family", SETTINGS_CASES)
def test_each_setting_runs_the_family_and_lossless_ones_keep_its_reply(tmp_path, family):
    """Paged KV, no cache, naive attention, batching beside simulated users and speculative decoding
    (prompt lookup, an fp draft) leave the greedy reply token for token; INT8 and INT4 run (their
    own reply); the CPU step declines the family with its reason and PyTorch's step decodes."""
    from dataclasses import replace

    from model_files import save_hf_folder
    from test_engine import fake_cpu

    from engine.engine import Engine
    from engine.events import TokenEvent
    from engine.model import cpu_step
    from engine.settings import SamplingParams, Settings

    folder = save_hf_folder(tiny_hf(family, seed=2, **SETTINGS_CASES[family]), tmp_path / family)
    greedy = Settings(max_new_tokens=10, sampling=SamplingParams(greedy=True, temperature=0.0))

    def reply(settings) -> list[int]:
        engine = Engine(str(folder), hardware=fake_cpu(), settings=settings)
        assert engine.refusal(engine.settings) == ""
        return [e.token_id for e in engine.chat("hello there, how are you") if isinstance(e, TokenEvent)
                and e.token_id >= 0]
    base = reply(greedy)
    assert len(base) == 10
    for change in (dict(kv_layout="paged"), dict(kv_layout="off"), dict(attention="naive"), dict(users=2),
                   dict(speculate="ngram"), dict(speculate="draft", draft_weights="fp")):
        assert reply(replace(greedy, **change)) == base, change
    for weights in ("int8", "int4"):
        assert len(reply(replace(greedy, weights=weights))) > 0
    cfg = load_model(folder).cfg
    why = cpu_step.model_refusal(cfg)
    assert why.startswith(f"{cfg.family}'s ") and "PyTorch's step decodes" in why and "\n" not in why


# ---- Gemma's vocabulary and turns ---------------------------------------------------------------

def test_gemma_sentencepiece_vocabulary_and_turns_as_transformers_reads_them(tmp_path):
    """A Gemma GGUF's SentencePiece vocabulary (no space prefix, byte fallback, its turn tokens):
    ids as transformers' GGUF tokenizer gives them, the file's chat template rendered as it renders
    it, and a reply ending at <end_of_turn>."""
    from transformers import AutoTokenizer

    from engine.io.gguf_file import read_gguf_metadata
    from engine.io.tokenizer import Tokenizer

    path = write_gguf(tiny_hf("gemma3", vocab_size=400, num_hidden_layers=6), tmp_path / "g.gguf", sentencepiece=True)
    ours = Tokenizer.from_gguf_metadata(read_gguf_metadata(path))
    theirs = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in ["hello world", " hello", "  two  spaces and\nnewlines\n", "café 😀 décodé",
                 "<start_of_turn>user\nhi<end_of_turn>"]:
        assert ours.encode(text) == theirs.encode(text), text
    assert ours.decode(ours.encode("café 😀"), skip_special_tokens=True) == "café 😀"  # byte pieces
    messages = [{"role": "user", "content": "Why is decode slow?"}, {"role": "assistant", "content": "Memory."},
                {"role": "user", "content": "And prefill?"}]
    rendered = ours.render_chat(messages)
    assert rendered == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<start_of_turn>model\n") and ours.chat_format == "template"
    ids = ours.encode_chat(messages)
    assert ids[0] == ours.bos_id and ids.count(ours.bos_id) == 1  # the template writes BOS: not twice
    assert ours.backend.token_to_id("<end_of_turn>") in ours.eos_ids
