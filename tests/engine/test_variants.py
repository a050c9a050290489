"""The model variants (engine/variants.py): one fp model per dtype, shared; quantised copies and the
draft model made in the background, `ready` false until they are, `wait` raising one line when one
could not be made."""
import threading

import pytest
import torch

from engine.io.byte_tokenizer import ByteTokenizer
from engine.io.loader import LoadedWeights, synthetic_weights
from engine.model.config import ModelConfig
from engine.model.quant import Int8Linear
from engine.settings import EngineError, QuantError, Settings
from engine.variants import ModelVariants, draft_key

CFG = ModelConfig(name="tiny", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=256,
                  tied_embeddings=True, max_seq_len=64)


def variants() -> ModelVariants:
    w = synthetic_weights(CFG, torch.float32, "cpu", seed=0)
    return ModelVariants(LoadedWeights(CFG, w, ByteTokenizer(CFG.vocab_size), "synthetic", "tiny", "fp32"),
                         "fp32", "cpu")


def test_each_dtype_is_made_once_and_the_loaded_weights_are_the_first():
    v = variants()
    fp32 = v.current(Settings(dtype="fp32"))
    assert fp32 is v.fp("fp32") and fp32.embed.dtype == torch.float32
    bf16 = v.fp("bf16")
    assert bf16 is v.fp("bf16") and bf16.embed.dtype == torch.bfloat16
    assert v.current(Settings(dtype="bf16")) is bf16 and v.model_for(Settings(dtype="bf16")) is bf16


def test_quantised_weights_are_not_ready_until_made_then_shared():
    v = variants()
    release = threading.Event()
    source = v.fp

    def slow_source(name):
        release.wait(10)
        return source(name)

    v.fp = slow_source
    int8 = Settings(dtype="fp32", weights="int8")
    v.request(int8)
    assert not v.ready(int8) and v.weights_building[0] == "int8"
    assert v.current(int8) is None  # nothing to run yet: the engine keeps its old settings meanwhile
    release.set()
    model = v.wait(int8) or v.current(int8)
    assert v.ready(int8) and v.weights_building is None
    assert isinstance(model.layers[0].wo, Int8Linear)
    assert v.model_for(int8) is model and v.wait(int8) is None  # no draft asked: none returned


def test_a_group_size_the_model_cannot_take_is_refused_at_the_request():
    with pytest.raises(EngineError, match="divide"):
        variants().request(Settings(dtype="fp32", weights="int4", group_size=128))


def test_the_draft_self_is_the_targets_own_quantised_weights():
    v = variants()
    spec = Settings(dtype="fp32", speculate="draft", draft_model="self", draft_weights="int8")
    v.request(spec)
    draft = v.wait(spec)
    assert v.ready(spec) and draft is v.model_for(Settings(dtype="fp32", weights="int8", group_size=32))
    assert draft_key(spec) == ("self", "fp32", "int8")


def test_a_draft_that_cannot_be_loaded_says_why_in_one_line(tmp_path):
    v = variants()
    spec = Settings(dtype="fp32", speculate="draft", draft_model=str(tmp_path / "missing.gguf"), draft_weights="fp")
    v.request(spec)
    with pytest.raises(EngineError, match="could not be loaded") as error:
        v.wait(spec)
    assert "\n" not in str(error.value)


def test_a_quantisation_that_fails_raises_at_wait():
    v = variants()

    def broken(name):
        raise RuntimeError("out of memory")

    v.fp = broken
    int8 = Settings(dtype="fp32", weights="int8")
    v.request(int8)
    with pytest.raises(QuantError, match="out of memory"):
        v.wait(int8)
