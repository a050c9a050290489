"""Text <-> token ids for the engine: a `tokenizers` BPE built from GGUF metadata or a tokenizer.json,
the model's own chat template rendered in a jinja2 sandbox, and a streaming detokeniser."""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers
from tokenizers import decoders, models, pre_tokenizers


class TokenizerError(ValueError):
    """A tokenizer this module cannot build (one-line message for the user)."""


# GGUF token types (llama.cpp's llama_token_type).
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

# Token texts llama.cpp treats as end of generation when the vocabulary has them: chat templates end a
# turn with one of these, which is not always the file's eos token.
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")
END_OF_TURN_TOKENS = (
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>",
    "<|return|>", "<end_of_utterance>",
)

# Pre-tokenizer regexes, one per family of `tokenizer.ggml.pre` (as llama.cpp groups them).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# o200k's split (Phi-4-mini's vocabulary; llama.cpp "gpt-4o"): cased words with their contractions,
# numbers in threes, punctuation runs with a trailing slash or newlines
GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GPT2_PRE = {"default", "gpt2", "gpt-2"}
DIGITS_THEN_GPT2_PRE = {"smollm", "starcoder", "refact", "codeshell", "command-r"}
LLAMA3_PRE = {"llama-bpe", "llama3", "llama-v3", "smaug-bpe", "dbrx", "falcon3"}
QWEN2_PRE = {"qwen2", "deepseek-r1-qwen"}
GPT4O_PRE = {"gpt-4o"}


def byte_to_char() -> dict[int, str]:
    """GPT-2's byte -> printable character table: a byte-level vocabulary spells every token with it."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    next_free = 256
    for b in range(256):
        if b not in table:  # control bytes and space move up past 255 so they print
            table[b] = chr(next_free)
            next_free += 1
    return table


def pre_tokenizer_for(pre: str):
    if pre in GPT2_PRE:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in DIGITS_THEN_GPT2_PRE:
        # Every digit is its own piece before the GPT-2 split (SmolLM2's tokenizer.json; llama.cpp "smollm").
        # It shows beyond digits: "a  1" splits as "a", "  ", "1", so the spaces may merge into one token.
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    for names, regex in ((LLAMA3_PRE, LLAMA3_SPLIT), (QWEN2_PRE, QWEN2_SPLIT), (GPT4O_PRE, GPT4O_SPLIT)):
        if pre in names:
            return pre_tokenizers.Sequence([
                pre_tokenizers.Split(tokenizers.Regex(regex), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ])
    raise TokenizerError(f"unsupported GGUF pre-tokenizer {pre!r} (tokenizer.ggml.pre)")


def sentencepiece_merges(tokens: list[str], scores: list[float], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """BPE merges implied by a scored SentencePiece vocabulary: every split of a piece into two
    pieces of the vocabulary is a merge, ranked by the whole piece's score (best first), then the
    longer halves first, then the piece's place in the vocabulary and the halves' ids (the order
    transformers gives them, so both tokenise alike)."""
    score_of = dict(zip(tokens, scores))  # a repeated piece: its first place, its last score
    ranked = []
    for place, (piece, score) in enumerate(score_of.items()):
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-score, -len(left), -len(right), place, vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def gguf_tokenizer_refusal(meta: dict[str, Any]) -> str:
    """Why a GGUF file's tokenizer cannot be built here ("" when it can): read from its metadata
    alone, so a model list can say so before anything loads."""
    kind = meta.get("tokenizer.ggml.model")
    if kind == "llama":
        return "" if "tokenizer.ggml.scores" in meta else "GGUF SentencePiece vocabulary without scores"
    if kind != "gpt2":
        return (f"unsupported GGUF tokenizer model {kind!r}; byte-level BPE ('gpt2') and SentencePiece "
                "('llama') are supported")
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in GPT2_PRE | DIGITS_THEN_GPT2_PRE | LLAMA3_PRE | QWEN2_PRE | GPT4O_PRE:
        return f"unsupported GGUF pre-tokenizer {pre!r} (tokenizer.ggml.pre)"
    return ""


def special_token_text(value: Any) -> str | None:
    """tokenizer_config.json writes a special token as a string or as {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """A `tokenizers.Tokenizer` plus what the engine needs around it: BOS policy, stop tokens, chat template."""

    def __init__(self, backend: tokenizers.Tokenizer, *, bos_id: int | None, eos_id: int | None,
                 add_bos: bool, chat_template: str | None = None, extra_stop_ids: Iterable[int] = ()):
        self.backend = backend
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.add_bos = add_bos
        self.chat_template = chat_template or None
        self.eos_ids: set[int] = {i for i in (eos_id, *extra_stop_ids) if i is not None}
        # Special tokens whose text is also in the template are the turn ends the model will emit.
        for id_, added in backend.get_added_tokens_decoder().items():
            if added.special and added.content in END_OF_TURN_TOKENS:
                self.eos_ids.add(id_)
        self._template = None  # compiled on first use

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any]) -> "Tokenizer":
        refusal = gguf_tokenizer_refusal(meta)
        if refusal:
            raise TokenizerError(refusal)
        tokens: list[str] = meta["tokenizer.ggml.tokens"]
        token_types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        if meta.get("tokenizer.ggml.model") == "llama":
            return cls._from_sentencepiece(meta, tokens, token_types)
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
        pre = meta.get("tokenizer.ggml.pre", "default")

        alphabet = set(byte_to_char().values())
        spelling = byte_to_char()
        vocab: dict[str, int] = {}
        for id_, (token, token_type) in enumerate(zip(tokens, token_types)):
            if token_type not in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED) and not set(token) <= alphabet:
                # a few converters store normal tokens as raw text; BPE needs them in the byte alphabet
                token = "".join(spelling[b] for b in token.encode("utf-8"))
            vocab.setdefault(token, id_)

        backend = tokenizers.Tokenizer(models.BPE(
            vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False,
            ignore_merges=pre in LLAMA3_PRE,  # Llama 3 takes a whole-word vocab hit before merging
        ))
        backend.pre_tokenizer = pre_tokenizer_for(pre)
        backend.decoder = decoders.ByteLevel()
        return cls._with_added_tokens(backend, meta, tokens, token_types, add_bos_default=False)

    @classmethod
    def _from_sentencepiece(cls, meta: dict[str, Any], tokens: list[str], token_types: list[int]) -> "Tokenizer":
        """A SentencePiece vocabulary (Llama 1/2, Mistral): BPE over "▁"-spaced text whose merges are
        rebuilt from the pieces' scores, unknown characters falling back to <0xNN> byte pieces: the
        tokenizer transformers builds from the same file."""
        scores: list[float] = meta["tokenizer.ggml.scores"]
        vocab: dict[str, int] = {}
        for id_, token in enumerate(tokens):
            vocab.setdefault(token, id_)
        unk = next((t for t, tt in zip(tokens, token_types) if tt == TOKEN_TYPE_UNKNOWN), None)
        backend = tokenizers.Tokenizer(models.BPE(
            vocab=vocab, merges=sentencepiece_merges(tokens, scores, vocab), unk_token=unk, fuse_unk=True,
            byte_fallback=True))
        prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", split=False,
                                                         prepend_scheme="first" if prefix else "never")
        steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        backend.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
        # llama.cpp adds a BOS by default for these vocabularies
        return cls._with_added_tokens(backend, meta, tokens, token_types, add_bos_default=True)

    @classmethod
    def _with_added_tokens(cls, backend, meta: dict[str, Any], tokens: list[str], token_types: list[int],
                           add_bos_default: bool) -> "Tokenizer":
        """Control tokens become special (matched whole, skippable on decode), user-defined ones are
        matched whole; BOS/EOS, the stop tokens and the chat template come from the GGUF's keys."""
        backend.add_special_tokens([
            tokenizers.AddedToken(t, special=True, normalized=False)
            for t, tt in zip(tokens, token_types) if tt == TOKEN_TYPE_CONTROL
        ])
        backend.add_tokens([
            tokenizers.AddedToken(t, special=False, normalized=False)
            for t, tt in zip(tokens, token_types) if tt == TOKEN_TYPE_USER_DEFINED
        ])
        stop_ids = [meta[k] for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id") if k in meta]
        return cls(
            backend,
            bos_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_id=meta.get("tokenizer.ggml.eos_token_id"),
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default)),
            chat_template=meta.get("tokenizer.chat_template"),
            extra_stop_ids=stop_ids,
        )

    @classmethod
    def from_file(cls, path: str | Path, tokenizer_config: dict[str, Any] | None = None) -> "Tokenizer":
        """HF folder form: tokenizer.json, with tokenizer_config.json (read from beside it when not given)."""
        path = Path(path)
        try:
            backend = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:
            raise TokenizerError(f"cannot read {path}: {e}") from None
        if tokenizer_config is None:
            config_path = path.with_name("tokenizer_config.json")
            tokenizer_config = json.loads(config_path.read_text("utf-8")) if config_path.exists() else {}
        chat_template = tokenizer_config.get("chat_template")
        if isinstance(chat_template, list):  # several named templates: take the default one
            chat_template = next((t["template"] for t in chat_template if t.get("name") == "default"), None)
        template_path = path.with_name("chat_template.jinja")
        if chat_template is None and template_path.exists():
            chat_template = template_path.read_text("utf-8")

        def id_of(key: str) -> int | None:
            text = special_token_text(tokenizer_config.get(key))
            return backend.token_to_id(text) if text is not None else None

        bos_id = id_of("bos_token")
        if "add_bos_token" in tokenizer_config:
            add_bos = bool(tokenizer_config["add_bos_token"])
        else:  # the tokenizer.json's post-processor decides, as in transformers
            add_bos = bos_id is not None and bos_id in backend.encode("", add_special_tokens=True).ids
        return cls(backend, bos_id=bos_id, eos_id=id_of("eos_token"), add_bos=add_bos, chat_template=chat_template)

    # --- ids ------------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_text(self, id_: int) -> str | None:
        return self.backend.id_to_token(id_)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Ids of `text`; special tokens written in it ("<|im_start|>") become their single ids."""
        # BOS is ours to add, never the post-processor's, so the policy lives in one place.
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def stream(self, skip_special_tokens: bool = False) -> "StreamDecoder":
        return StreamDecoder(self, skip_special_tokens)

    # --- chat -------------------------------------------------------------------------------------

    @property
    def chat_format(self) -> str:
        """"template" (the file's own), "chatml" (none, but its vocabulary has ChatML's turn tokens)
        or "plain" (neither: a base model, fed the conversation as plain text)."""
        if self.chat_template is not None:
            return "template"
        vocab = self.backend.get_vocab(with_added_tokens=True)
        return "chatml" if all(t in vocab for t in CHATML_TOKENS) else "plain"

    @property
    def template_note(self) -> str:
        """One line for the user when the conversation is not fed through a chat template ("" if it is)."""
        if self.chat_format != "plain":
            return ""
        return ("no chat template in the file (a base model): the conversation is fed as plain text; "
                "`membound chat --raw` completes a prompt exactly as written")

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The conversation as the model was trained to see it, from its own template (ChatML where
        it has none but its vocabulary has ChatML's tokens; else plain text)."""
        if self.chat_template is None:
            if self.chat_format == "plain":
                return render_plain(messages, add_generation_prompt)
            return render_chatml(messages, add_generation_prompt)
        if self._template is None:
            self._template = chat_environment().from_string(self.chat_template)
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self._text_of(self.bos_id),
            eos_token=self._text_of(self.eos_id),
        )

    def encode_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """render_chat then encode, adding BOS only when the template did not already write it."""
        text = self.render_chat(messages, add_generation_prompt)
        bos_text = self._text_of(self.bos_id)
        add_bos = self.add_bos and not (bos_text and text.startswith(bos_text))
        return self.encode(text, add_bos=add_bos)

    def _text_of(self, id_: int | None) -> str:
        return (self.backend.id_to_token(id_) or "") if id_ is not None else ""


def render_plain(messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """The conversation as a plain transcript, for a base model (no template, no turn tokens)."""
    turns = [f"{m['role'].capitalize()}: {m['content']}\n\n" for m in messages]
    return "".join(turns) + ("Assistant:" if add_generation_prompt else "")


def render_chatml(messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """Plain ChatML, for models that ship no template."""
    turns = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
    return "".join(turns) + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def chat_environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    """A sandbox for templates that come with downloaded models (untrusted code), set up the way HF renders them."""

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja's own tojson escapes HTML characters, which would change the prompt
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class StreamDecoder:
    """Incremental detokenisation: feed ids one at a time, get back only text that is final.

    Text is held back while it ends in U+FFFD (an incomplete UTF-8 sequence split over tokens, e.g. an emoji).
    Each step decodes a short window of ids: the last emitted token(s) as context, so decoders that depend
    on neighbours (leading-space strip) agree with decoding everything at once. `flush()` ends the stream.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0  # window start: context already emitted
        self.read_offset = 0  # everything before this has been emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def feed(self, id_: int) -> str:
        """The text this id completes; "" while it is held back."""
        self.ids.append(id_)
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        window_text = self._decode(self.ids[self.prefix_offset:])
        if len(window_text) <= len(prefix_text) or window_text.endswith("\ufffd"):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return window_text[len(prefix_text):]

    def flush(self) -> str:
        """Whatever was held back (an incomplete sequence becomes U+FFFD, as in decode)."""
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        window_text = self._decode(self.ids[self.prefix_offset:])
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return window_text[len(prefix_text):]
