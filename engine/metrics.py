"""The cost model, in one module: what one forward step moves and computes (`step_cost`, `plan_cost`),
charging what each implementation does ("What each implementation moves" below: dequantised
copies, naive attention's passes over its score matrix, K/V gathered out of a paged pool, a graph's
bucket); with the step's measured time, `StepMetrics` (a `StepCost` and its time) gives achieved
GB/s, MBU, MFU, arithmetic intensity and the ceilings. Torch-free, and the only place that counts a
step's bytes: a new kernel or model family adds its charge here, with a hand count in
tests/engine/test_cost.py."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from types import MappingProxyType

from engine.hardware.roof import Roof, above_roof
from engine.model.config import ModelConfig

# Phases whose rate counts the tokens they produce (tokens_out): plain decode, a speculative step's
# verification (accepted guesses + the target's own token) and its draft (the draft model's forwards:
# none of their guesses count until verified). Prefill and mixed steps count the tokens they feed.
DECODE_PHASES = ("decode", "verify", "draft")


# ---- What each implementation moves, beyond the model's own bytes ---------------------------------
# Bytes per weight that a dequantising path writes and reads beyond the stored ones
# (engine/model/quant.py picks the path; `dequantised_copy_bytes` charges it). CPU int8: the bf16
# copy written and read by the GEMM (2 + 2). CPU int4: the nibbles split (0.5 + 0.5 read, 0.5 + 0.5
# written), stacked (1 + 1), made bf16 (1 + 2), scaled (2 + 2), read by the GEMM (2). Reference (any
# device, the dtype's 2 bytes; fp32 costs more, counted as 2): int8 q.float() (1 + 4), * scale
# (4 + 4), .to (4 + 2), matmul (2); int4 unpacked (0.5 + 1 + 1 + 1), .float() (1 + 4), * scale + min
# (4 + 4 + 4), .to (4 + 2), matmul (2). Prefill-sized steps only: a decode step takes none of these.
DEQUANTISED_COPY_BYTES = MappingProxyType({("int8", "cpu"): 4, ("int4", "cpu"): 13, ("int8", "reference"): 21,
                                           ("int4", "reference"): 32.5})


def dequantised_copy_bytes(fmt: str, path: str | None, n_weights: int) -> int:
    """The copy a dequantising `path` ("cpu", "reference"; None: the kernel reads the codes) writes
    and reads back for `n_weights` weights of format `fmt` ("int8", "int4")."""
    return int(DEQUANTISED_COPY_BYTES[fmt, path] * n_weights) if path else 0


# The C++ CPU step (kernels/cpu_decode.cpp via engine/model/cpu_step.py) over M token rows — a decode
# step, a speculative verify step, a prompt chunk, a batch server's plan: each matmul weight is read
# once a call as stored and applied to every row while it is in registers or L1/L2, so it writes no
# dequantised copy whatever M (`weight_rows`); the head runs over the rows that sample. Attention
# reads each sequence's cache in place (a paged pool through its block tables: no gathered copy), row
# by row over its own positions: the rows of one sequence re-read their context from the caches, so
# a sequence's K/V count once a step, as PyTorch's fused attention reads them (`step_cost`'s KV terms).
# A prompt longer than one call's rows runs as several calls: each call's weights and context count
# (`calls_cost`).
def weight_rows(rows: int, cpp_step: bool) -> int:
    """The rows a step's matmul weights are charged at (Transformer.linear_weight_bytes(rows, head_rows)):
    one for the C++ step (no dequantised copy, whatever its rows; none for a head no row samples),
    else the rows the step ran."""
    return min(rows, 1) if cpp_step else rows


def naive_score_passes(masked: bool, captured: bool = False) -> int:
    """Passes over naive attention's score matrix, as engine/model/attention.py's naive_attention
    runs: the QK product writes it (1); a mask, where the step has one (a prompt, ragged rows, a
    graph's bucket), is applied in place (read and written: 2); softmax reads it and writes the
    probabilities (2); the value product reads them (1). A captured step (torch.compile) folds the
    mask into the softmax: 4 passes, with or without one."""
    return 6 if masked and not captured else 4


def naive_mask_bytes(mask_rows: int, queries: int, keys: int) -> int:
    """The eager boolean mask (rows, T, S): built and read once a layer (one byte a cell)."""
    return 2 * mask_rows * queries * keys


@dataclass(frozen=True)
class KVCopy:
    """K/V positions a step copies out of the paged pool into a dense buffer, per layer (K and V
    alike): batched decode rows gathered on a CPU (whole blocks, the longest row's width), or a
    sequence whose blocks are not consecutive (PagedKV.dense: a zeroed buffer, filled). Also the
    prompt prefixes a batched step's requests took from the users' prefix cache (read from it, written
    into the pool: engine/serving/prefix_store.py)."""
    read: int = 0  # positions read from the pool beyond the live ones the KV charge counts (padding)
    written: int = 0  # positions written into the copy (its zeros included)
    read_back: int = 0  # positions attention reads back from it

    def __add__(self, other: "KVCopy") -> "KVCopy":
        return KVCopy(self.read + other.read, self.written + other.written, self.read_back + other.read_back)

    def bytes(self, cfg: ModelConfig, kv_elem_bytes: int) -> int:
        return (self.read + self.written + self.read_back) * cfg.kv_bytes_per_token_per_elem * kv_elem_bytes


@dataclass(frozen=True)
class StepCost:
    """What one forward step moves and computes, for `batch_size` sequences of `new_tokens`
    tokens each, appended after `context_len` tokens already in the KV cache."""
    weight_bytes: int = 0  # every matmul weight once, at its storage precision (+ norms, biases, dequantised copies)
    kv_read_bytes: int = 0  # cached K and V read by attention
    kv_write_bytes: int = 0  # new K and V written into the cache
    other_bytes: int = 0  # embedding rows gathered, logits written
    flops: int = 0  # matmul FLOPs + attention FLOPs (2 per multiply-add)
    matmul_flops: int = 0  # the head's among them
    attention_flops: int = 0
    head_flops: int = 0  # the output head's matmul (its format may differ from the layers')
    attention_bytes: int = 0  # naive attention: its passes over the score matrix (and its mask)
    copy_bytes: int = 0  # K/V copied out of a paged pool, written and read back (KVCopy)

    @property
    def total_bytes(self) -> int:
        return (self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes + self.other_bytes + self.attention_bytes
                + self.copy_bytes)

    @property
    def kv_bytes(self) -> int:
        return self.kv_read_bytes + self.kv_write_bytes


COST_FIELDS = tuple(f.name for f in fields(StepCost))  # (dataclasses.fields walks the class: once, not every step)


def sum_costs(costs: list[StepCost]) -> StepCost:
    """Several forwards as one (a draft model's k passes, reported as one "draft" step)."""
    return StepCost(**{name: sum(getattr(c, name) for c in costs) for name in COST_FIELDS})


def cost_of(step: StepCost) -> StepCost:
    """The StepCost part of a step (a StepMetrics is one)."""
    return StepCost(**{name: getattr(step, name) for name in COST_FIELDS})


def step_cost(cfg: ModelConfig, *, batch_size: int, new_tokens: int, context_len: int,
              weight_bytes: int, kv_elem_bytes: int, act_elem_bytes: int = 4, kv_cache: bool = True,
              logits_rows: int | None = None, kv_read_tokens: int | None = None,
              attention: str = "flash", kv_layout: str = "contiguous", block_size: int = 16,
              attention_keys: int | None = None, ragged: bool = False, captured: bool = False,
              kv_copy: KVCopy | None = None, cpp_step: bool = False) -> StepCost:
    """Cost of one step.

    weight_bytes: bytes of all matmul weights as the step reads them (Transformer.linear_weight_bytes:
    as stored, plus any dequantised copy its path makes); the caller knows the storage format.
    kv_cache=False: the step recomputes the whole context (new_tokens is then the context
    length plus the new token, context_len must be 0) and nothing is cached.
    logits_rows: rows the head is evaluated on (default one per sequence).
    kv_read_tokens: cache positions attention actually reads, when it reads more than the
    live context (a captured step without the flash kernel reads the whole buffer, masked).
    attention_keys: keys each query's attention is computed over, masked ones included, when that is
    not the causal live context: a graph's bucket (the default when kv_read_tokens is given), the
    longest row of a padded batch. ragged: rows of different lengths, masked by length.
    attention="naive": the (B, n_heads, T, S) score matrix is in memory in the activation dtype,
    S = every key of the step (the masked half included: it is computed and stored too), and its
    FLOPs are the full T x S product; its passes over it: `naive_score_passes` (eager or `captured`),
    and an eager step's mask. "flash" keeps it on chip and skips the masked half of a prompt.
    cpp_step: the step ran in C++ (engine/model/cpu_step.py), whose naive attention writes each row's
    causal scores in fp32 (no masked half, no mask), softmaxes them in place and reads them for the
    values: `naive_score_passes(False)` passes (kernels/cpu_decode.cpp attend_naive).
    kv_layout="paged": attention also reads each sequence's block table (int32, once per KV head and
    layer); the positions it reads are the live ones, as contiguous. kv_copy: K/V copied out of the
    pool (`KVCopy`). Sliding-window layers (Gemma, Phi-3-mini) read and attend to their window's keys
    only; Gemma 2's soft-capped scores are written to memory and read back (no fused kernel here
    takes them)."""
    B, T, C = batch_size, new_tokens, context_len
    logits_rows = B if logits_rows is None else logits_rows
    kv_elems_per_token = cfg.kv_bytes_per_token_per_elem  # K and V, all layers
    kv_elems_per_layer_token = 2 * cfg.kv_dim
    positions_read = cfg.kv_positions_read(C) if kv_read_tokens is None else cfg.n_layers * kv_read_tokens
    kv_read = B * positions_read * kv_elems_per_layer_token * kv_elem_bytes if kv_cache else 0
    kv_write = B * T * kv_elems_per_token * kv_elem_bytes if kv_cache else 0
    # RMSNorm weights, and where the family has them the q/k/v biases (Qwen2) and q/k norms (Qwen3)
    norm_bytes = cfg.vector_elems_per_step * act_elem_bytes
    embed_rows = B * T * cfg.dim * act_elem_bytes
    logits_bytes = logits_rows * cfg.vocab_size * 4  # fp32 logits
    layer_matmul = 2 * cfg.layer_linear_params * B * T * cfg.n_layers
    head_matmul = 2 * cfg.vocab_size * cfg.dim * logits_rows
    # attention: QK^T and PV, 2 FLOPs per MAC each, q_dim wide; query i of T sees C + i + 1 keys
    # (causal), so the keys seen sum to T*C + T(T+1)/2 a layer (a sliding layer: its window's) ...
    keys_seen = cfg.keys_seen(C, T)
    padded_keys = attention_keys if attention_keys is not None else kv_read_tokens if kv_cache else None
    if padded_keys is not None:  # ... unless attention runs over a bucket or a padded width: all of it
        keys_seen = cfg.n_layers * T * padded_keys
    score_bytes = 0
    if attention == "naive" and cpp_step and padded_keys is None:
        score_bytes = naive_score_passes(False) * B * cfg.n_heads * keys_seen * 4
    elif attention == "naive" or cfg.attn_softcap:
        S = padded_keys if padded_keys is not None else C + T  # keys in the matrix
        keys_seen = cfg.n_layers * T * S
        if attention == "naive":
            masked = T > 1 or ragged or padded_keys is not None
            score_bytes = cfg.n_layers * naive_score_passes(masked, captured) * B * cfg.n_heads * T * S * act_elem_bytes
            if masked and not captured:
                mask_rows = B if ragged or padded_keys is not None else 1  # (B or 1, T, S)
                score_bytes += cfg.n_layers * naive_mask_bytes(mask_rows, T, S)
        else:  # Gemma 2's soft-capped scores beside a fused kernel: written, then read back
            score_bytes = 2 * cfg.n_layers * B * cfg.n_heads * T * S * act_elem_bytes
    if kv_cache and kv_layout == "paged":
        blocks = -(-(C + T) // block_size)
        kv_read += cfg.n_layers * B * cfg.n_kv_heads * blocks * 4
    flops_attention = B * 2 * 2 * cfg.q_dim * keys_seen
    return StepCost(
        weight_bytes=weight_bytes + norm_bytes,
        kv_read_bytes=kv_read,
        kv_write_bytes=kv_write,
        other_bytes=embed_rows + logits_bytes,
        flops=layer_matmul + head_matmul + flops_attention,
        matmul_flops=layer_matmul + head_matmul,
        attention_flops=flops_attention,
        head_flops=head_matmul,
        attention_bytes=score_bytes,
        copy_bytes=kv_copy.bytes(cfg, kv_elem_bytes) if kv_copy is not None else 0,
    )


def calls_cost(model, calls: tuple[int, ...], *, context_len: int, logits_rows: int = 1, **step) -> StepCost:
    """step_cost of one sequence's step of `model` (a Transformer) that the C++ step ran as several calls
    in order (a prompt longer than its rows, in chunks: engine/model/cpu_step.py chunks): each call's
    rows over the context the calls before it left, every layer weight read once a call as stored, the
    head only in the calls holding some of the last `logits_rows` rows, summed. `step`: step_cost's
    other arguments."""
    cfg, weight_bytes = model.cfg, model.linear_weight_bytes(rows=1)
    head_bytes = weight_bytes - model.linear_weight_bytes(rows=1, head_rows=0)
    parts, lo, first_logit = [], 0, sum(calls) - logits_rows
    for rows in calls:
        logits = max(0, lo + rows - max(lo, first_logit))
        parts.append(step_cost(cfg, batch_size=1, new_tokens=rows, context_len=context_len + lo,
                               weight_bytes=weight_bytes - (0 if logits else head_bytes), logits_rows=logits,
                               cpp_step=True, **step))
        lo += rows
    return sum_costs(parts)


def plan_cost(cfg: ModelConfig, seqs, *, weight_bytes: int, elem_bytes: int, attention: str = "flash",
              block_size: int = 16, decode_width: int | None = None, kv_copy: KVCopy | None = None,
              cpp_step: bool = False) -> StepCost:
    """The cost model for a ragged plan (engine/serving/batch_forward.py): the weights once for the
    whole step; KV traffic, attention and matmul FLOPs per sequence (each its own context and chunk
    length). decode_width: the decode rows' attention runs over one padded width (their keys gathered
    into one buffer, masked by length), else each over its own; kv_copy: what the step copied."""
    decodes = [s for s in seqs if len(s.token_ids) == 1]
    ragged = decode_width is not None and any(s.start_pos + 1 != decode_width for s in decodes)
    parts = [step_cost(cfg, batch_size=1, new_tokens=len(s.token_ids), context_len=s.start_pos, weight_bytes=0,
                       kv_elem_bytes=elem_bytes, act_elem_bytes=elem_bytes, logits_rows=int(s.samples),
                       attention=attention, kv_layout="paged", block_size=block_size,
                       attention_keys=decode_width if len(s.token_ids) == 1 else None,
                       ragged=ragged and len(s.token_ids) == 1, cpp_step=cpp_step) for s in seqs]
    total = sum_costs(parts)
    norm_bytes = parts[0].weight_bytes if parts else 0  # the norms: read once per step too
    copy_bytes = kv_copy.bytes(cfg, elem_bytes) if kv_copy is not None else 0
    return StepCost(**{**{name: getattr(total, name) for name in COST_FIELDS},
                       "weight_bytes": weight_bytes + norm_bytes, "copy_bytes": copy_bytes})


def phase_bytes(model, context_len: int) -> dict[str, int]:
    """Bytes each phase of the C++ decode step moves after `context_len` cached positions
    (`membound bench --profile`): step_cost's terms (weights as stored, norms and biases, the K/V
    read and written, the embedding row, the logits), split by phase; they add up to its total."""
    cfg = model.cfg
    elem = model.embed.element_size()
    layers = model.layers
    kv_token = cfg.kv_bytes_per_token_per_elem * elem  # K and V of one position, all layers
    ffn_norms = cfg.n_layers * cfg.dim
    final_norm = cfg.dim
    return {
        "embedding": cfg.dim * elem,
        "norm + q/k/v": sum(b.wqkv.weight_bytes for b in layers)
        + (cfg.vector_elems_per_step - ffn_norms - final_norm) * elem,  # attention norms, biases, q/k norms
        "k/v into the cache": kv_token,
        "attention": kv_token * context_len,
        "output projection": sum(b.wo.weight_bytes for b in layers),
        "norm + gate/up + SiLU": sum(b.w_gate_up.weight_bytes for b in layers) + ffn_norms * elem,
        "down projection": sum(b.w_down.weight_bytes for b in layers),
        "norm + head": model.head.weight_bytes + final_norm * elem + cfg.vocab_size * 4,  # fp32 logits
        "waiting at barriers": 0,
    }


@dataclass(frozen=True, kw_only=True)
class StepMetrics(StepCost):
    """One step, measured: its cost (the StepCost fields) and its time. Plain data: safe to hand
    across threads and to JSON."""
    step: int
    phase: str  # "prefill", "decode", "mixed" (a batched step of prompt chunks and decode rows), or a
    # speculative step's two parts: "draft" (the draft model's forwards) and "verify" (the target's one)
    batch_size: int
    new_tokens: int  # tokens fed to the model this step, per sequence
    tokens_out: int  # tokens produced (sampled) this step, all sequences
    context_len: int  # tokens already cached before the step
    step_s: float  # measured wall time (CUDA events on a GPU)
    peak_bandwidth_bps: float  # bytes/s of the roof the step sits under (engine/hardware/roof.py Roof)
    peak_flops: float  # FLOP/s of its compute roof: its dtype's, or its products' (Roof.step_flops_peak)
    peak_kind: str = ""  # what that roof is of, for its label: "fp32", "bf16", "int8/int16 dots + fp32" ("": its dtype)
    t_s: float = 0.0  # monotonic time at the end of the step
    settings_label: str = ""  # e.g. "fp32 · kv on"
    tokens_in: int = 0  # tokens fed this step, all sequences; 0: batch_size x new_tokens (a ragged
    # batched step's new_tokens is a rounded mean, so it carries the exact count here)
    draft_tokens: int = 0  # speculative steps: guesses made (draft) or checked (verify)
    accepted_tokens: int = 0  # verify: guesses the target kept (it also adds one token of its own)
    captured: bool = False  # the step ran from a captured graph or a compiled step, not eagerly
    roof: str = "memory"  # the bandwidth roof it sits under: "memory", or "cache" (its bytes fit the last-level cache)
    # a verify step after a draft model's step: that step's time, bytes and floor, so the round's
    # rate and ceilings (`round_*`) count both, as the engine ran them
    draft_s: float = 0.0
    draft_bytes: int = 0
    draft_floor_s: float = 0.0

    @classmethod
    def from_cost(cls, cost: StepCost, **measured) -> "StepMetrics":
        return cls(**{name: getattr(cost, name) for name in COST_FIELDS}, **measured)

    @property
    def above_roof(self) -> bool:
        """Its bytes or FLOPs in its measured time beat the roof: the cost model or the probe is wrong
        (engine/hardware/roof.py ABOVE_ROOF). Shown as such, never absorbed into the peak."""
        if self.step_s <= 0 or not self.peak_bandwidth_bps > 0:
            return False
        return above_roof(self.mbu, self.mfu if self.peak_flops > 0 else float("nan"))

    @property
    def tokens_fed(self) -> int:
        return self.tokens_in or self.batch_size * self.new_tokens

    @property
    def achieved_bandwidth_bps(self) -> float:
        return self.total_bytes / self.step_s

    @property
    def achieved_gbs(self) -> float:
        return self.achieved_bandwidth_bps / 1e9

    @property
    def achieved_flops(self) -> float:
        return self.flops / self.step_s

    @property
    def achieved_tflops(self) -> float:
        return self.achieved_flops / 1e12

    @property
    def mbu(self) -> float:
        """Model bandwidth utilisation: bytes the step must move (weights + KV) over time, ÷ peak."""
        return self.achieved_bandwidth_bps / self.peak_bandwidth_bps

    @property
    def mfu(self) -> float:
        return self.achieved_flops / self.peak_flops

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.total_bytes

    @property
    def tokens_per_s(self) -> float:
        """Tokens processed per second: produced tokens for decode, tokens fed for prefill (and for a
        mixed step: its prompt tokens and decode rows alike)."""
        return self._tokens / self.step_s

    @property
    def _tokens(self) -> int:
        return self.tokens_out if self.phase in DECODE_PHASES else self.tokens_fed

    @property
    def bytes_per_token(self) -> float:
        return self.total_bytes / max(self._tokens, 1)

    @property
    def acceptance_rate(self) -> float:
        """Verify steps: the fraction of the guesses the target kept (nan for other steps)."""
        return self.accepted_tokens / self.draft_tokens if self.phase == "verify" and self.draft_tokens else float("nan")

    @property
    def tokens_per_weight_read(self) -> float:
        """Tokens a target step produced for its one read of the weights: 1 at batch-1 decode, B in a
        batch, accepted + 1 in a verify step; 0 for a draft step (it reads the draft's weights)."""
        return float(self.tokens_out)

    @property
    def floor_s(self) -> float:
        """The least time the step's bytes take at the peak bandwidth."""
        return self.total_bytes / self.peak_bandwidth_bps

    @property
    def overhead_s(self) -> float:
        """Time beyond the bytes at peak bandwidth (launches, dispatch, Python, compute): what a
        captured step cuts. Never below 0 (a step cannot beat its bytes)."""
        return max(0.0, self.step_s - self.floor_s)

    @property
    def memory_ceiling_tokens_per_s(self) -> float:
        """The seed formula: peak bandwidth ÷ bytes per token."""
        return self.peak_bandwidth_bps / self.bytes_per_token

    @property
    def roofline_floor_s(self) -> float:
        """The least time the step takes by the roofline: its bytes at peak bandwidth, or its FLOPs
        at peak FLOP/s, whichever is longer."""
        return max(self.floor_s, self.flops / self.peak_flops)

    @property
    def predicted_ceiling_tokens_per_s(self) -> float:
        """Roofline bound: the step cannot finish before its bytes at peak bandwidth nor before
        its FLOPs at peak FLOP/s."""
        return self._tokens / self.roofline_floor_s

    # a speculative round (the draft model's step, then this verify step) as the plots show it: the
    # tokens the verify produced over both steps' time and bytes; any other step is its own round
    @property
    def round_tokens_per_s(self) -> float:
        return self._tokens / (self.step_s + self.draft_s)

    @property
    def round_memory_ceiling_tokens_per_s(self) -> float:
        return self._tokens * self.peak_bandwidth_bps / (self.total_bytes + self.draft_bytes)

    @property
    def round_ceiling_tokens_per_s(self) -> float:
        return self._tokens / (self.roofline_floor_s + self.draft_floor_s)

    def with_draft(self, draft: "StepMetrics") -> "StepMetrics":
        """This verify step carrying the draft model's step before it (the round's figures)."""
        return replace(self, draft_s=draft.step_s, draft_bytes=draft.total_bytes, draft_floor_s=draft.roofline_floor_s)

    @property
    def bound(self) -> str:
        """Which roof the step sits under by the model: 'memory' or 'compute'."""
        ridge = self.peak_flops / self.peak_bandwidth_bps
        return "compute" if self.arithmetic_intensity >= ridge else "memory"

    def to_dict(self) -> dict:
        d = asdict(self)
        for name in ("total_bytes", "achieved_gbs", "achieved_tflops", "mbu", "mfu", "arithmetic_intensity",
                     "tokens_per_s", "bytes_per_token", "memory_ceiling_tokens_per_s",
                     "predicted_ceiling_tokens_per_s", "bound", "acceptance_rate", "overhead_s", "above_roof",
                     "round_tokens_per_s", "round_memory_ceiling_tokens_per_s", "round_ceiling_tokens_per_s"):
            d[name] = getattr(self, name)
        return d


def decode_rate(steps: list[StepMetrics]) -> float:
    """Tokens per second over a reply's decoding steps: every token produced (accepted guesses
    included) over the time of every decode, draft and verify step."""
    steps = [s for s in steps if s.phase in DECODE_PHASES]
    seconds = sum(s.step_s for s in steps)
    return sum(s.tokens_out for s in steps) / seconds if seconds > 0 else 0.0


def speculation_figures(steps: list[StepMetrics]) -> tuple[float, float, float] | None:
    """A reply's speculation (None when it did not speculate): % of guesses kept, guesses kept per
    verify step, and tokens per read of the target's weights."""
    verifies = [s for s in steps if s.phase == "verify"]
    if not verifies:
        return None
    drafted = sum(s.draft_tokens for s in verifies)
    accepted = sum(s.accepted_tokens for s in verifies)
    target = [s for s in steps if s.phase in ("decode", "verify")]
    return 100 * accepted / drafted, accepted / len(verifies), sum(s.tokens_out for s in target) / len(target)


def speculation_summary(steps: list[StepMetrics]) -> list[str]:
    """speculation_figures in words (the terminal's; the window translates its own)."""
    figures = speculation_figures(steps)
    if figures is None:
        return []
    pct, per_step, tokens = figures
    return [f"speculation: {pct:.0f}% of guesses kept ({per_step:.2f} a step), {tokens:.2f} tokens per weight read"]


def measured(cost: StepCost, roof: Roof, dtype: str, products: tuple[str, str] | None = None,
             **figures) -> StepMetrics:
    """A step's cost against the roof it sits under (the one policy: engine/hardware/roof.py Roof),
    with its measured figures (step_s, phase, tokens, ...). `products`: how the step's layers and head
    multiply where that is not at the activations' float rate (the C++ step's integer dot products:
    engine/model/cpu_step.py products); the compute roof is then theirs (Roof.step_flops_peak)."""
    return StepMetrics.from_cost(cost, peak_bandwidth_bps=roof.bandwidth_for(cost.total_bytes),
                                 peak_flops=roof.step_flops_peak(cost, dtype, products),
                                 peak_kind=roof.peak_kind(dtype, products),
                                 roof=roof.level_for(cost.total_bytes), **figures)


@dataclass(frozen=True)
class ReplyFigures:
    """A reply's decoding as the window and the terminal sum it up."""
    tokens_per_s: float  # every token produced over every decode, draft and verify step's time
    achieved_gbs: float  # the cost model's bytes of those steps over their time
    peak_gbs: float  # the roof their bytes sit under together (each step's at its own)
    mbu: float
    ceiling_tokens_per_s: float  # the target's tokens over its steps' bytes at the roof (drafts excluded)
    above_roof: bool  # some step beat its roof (engine/hardware/roof.py ABOVE_ROOF)


def reply_figures(steps: list[StepMetrics]) -> ReplyFigures | None:
    """The decoding steps of a reply summed up; None when it decoded nothing."""
    decode = [s for s in steps if s.phase in DECODE_PHASES]
    if not decode:
        return None
    step_s = sum(s.step_s for s in decode)
    moved = sum(s.total_bytes for s in decode)
    gbs = moved / step_s / 1e9
    # each step's bytes at the roof it sits under (a precision switched mid-reply, a context that grew
    # past where the cache gives out): the reply's peak is the rate those roofs give its bytes together
    at_roofs_s = sum(s.total_bytes / s.peak_bandwidth_bps for s in decode)
    peak = moved / at_roofs_s / 1e9 if at_roofs_s > 0 else decode[-1].peak_bandwidth_bps / 1e9
    target = [s for s in decode if s.phase != "draft"]
    ceiling = sum(s.tokens_out for s in target) / sum(s.floor_s for s in target) if target else float("nan")
    return ReplyFigures(decode_rate(decode), gbs, peak, gbs / peak, ceiling, any(s.above_roof for s in steps))


def decode_ceiling_tokens_per_s(weight_bytes: float, bandwidth_bps: float, kv_bytes: float = 0.0) -> float:
    """Batch-1 decode ceiling: every weight (and the KV cache) read once per token."""
    return bandwidth_bps / (weight_bytes + kv_bytes)


# ---- What the weights hold in memory (the fit check) ----------------------------------------------
# engine/model/quant.py's storage, per matmul weight (N, K): INT8 one int8 code a weight and an fp32
# scale a row; INT4 two codes a byte and an fp16 scale and min a group; the output head INT8 under
# both; the embedding table stays floating point (its lookup stays exact). On a CPU the quantised
# layers also hold the layouts the CPU kernels stream: INT8 bf16 scales; INT4 PyTorch's packed codes
# (N padded to 16) with a bf16 (scale, zero) pair a group, and the C++ step's 16-row tiles of codes
# with their fp16 scales and mins: three copies of the codes in all.
HEAD_WEIGHTS = "int8"  # what the head becomes under int8 and int4 (engine/model/quant.py)


def _padded(n: int, to: int) -> int:
    return -(-n // to) * to


def matmul_held_bytes(n: int, k: int, weights: str, elem_bytes: int, group_size: int = 32,
                      device: str = "cuda") -> int:
    """Bytes one (N, K) matmul weight holds at `weights` ("fp", "int8", "int4") on `device`."""
    if weights == "fp":
        return n * k * elem_bytes
    cpu = device == "cpu"
    if weights == "int8":
        return n * k + 4 * n + (2 * n if cpu else 0)
    if weights == "int4":
        held = n * k // 2 + 2 * 2 * n * (k // group_size)
        if cpu:
            n_pad = _padded(n, 16)
            held += n_pad * k // 2 + 2 * 2 * n_pad * (k // group_size)  # PyTorch's layout, (scale, zero)
            held += n_pad * k // 2 + 2 * 2 * n_pad * (k // group_size)  # the C++ step's tiles, scales, mins
        return held
    raise ValueError(f"weights must be fp, int8 or int4, got {weights!r}")


def matmul_read_bytes(n: int, k: int, weights: str, elem_bytes: int, group_size: int = 32,
                      device: str = "cuda") -> int:
    """Bytes a batch-1 decode step reads of one (N, K) matmul weight at `weights` on `device`: the
    layout its kernel streams (engine/model/quant.py's `weight_bytes`). INT8: the codes and a scale a
    row (bf16 on a CPU, fp32 on a GPU); INT4: two codes a byte and a 2-byte scale and min (or zero) a
    group, a CPU's rows padded to 16 (PyTorch's layout and the C++ step's tiles alike)."""
    if weights == "fp":
        return n * k * elem_bytes
    cpu = device == "cpu"
    if weights == "int8":
        return n * k + (2 if cpu else 4) * n
    if weights == "int4":
        rows = _padded(n, 16) if cpu else n
        return rows * k // 2 + 2 * 2 * rows * (k // group_size)
    raise ValueError(f"weights must be fp, int8 or int4, got {weights!r}")


def _matmul_shapes(cfg: ModelConfig) -> list[tuple[int, int]]:
    """A layer's matmul weights (N, K), as the engine fuses them: q/k/v, the output, gate/up, down."""
    return [(cfg.q_dim + 2 * cfg.kv_dim, cfg.dim), (cfg.dim, cfg.q_dim), (2 * cfg.ffn_dim, cfg.dim),
            (cfg.dim, cfg.ffn_dim)]


def decode_weight_bytes(cfg: ModelConfig, elem_bytes: int, weights: str = "fp", group_size: int = 32,
                        device: str = "cuda") -> int:
    """The weight bytes one batch-1 decode step reads, from the shape alone: every matmul weight once
    in the layout its kernel streams, the head (INT8 under both INT8 and INT4; the embedding table
    itself where a floating-point head is tied to it) and the norms (and biases) at `elem_bytes` --
    step_cost's weight_bytes for Transformer.linear_weight_bytes(). The hardware table's figure."""
    layers = cfg.n_layers * sum(matmul_read_bytes(n, k, weights, elem_bytes, group_size, device)
                                for n, k in _matmul_shapes(cfg))
    head_weights = weights if weights == "fp" else HEAD_WEIGHTS
    head = matmul_read_bytes(cfg.vocab_size, cfg.dim, head_weights, elem_bytes, group_size, device)
    return layers + head + cfg.vector_elems_per_step * elem_bytes


def held_weight_bytes(cfg: ModelConfig, elem_bytes: int, weights: str = "fp", group_size: int = 32,
                      device: str = "cuda") -> int:
    """Bytes a model's weights hold at one weights setting (each tensor once; a tied head shares
    the embedding only while both are floating point), as the engine stores them on `device`."""
    layers = cfg.n_layers * sum(matmul_held_bytes(n, k, weights, elem_bytes, group_size, device)
                                for n, k in _matmul_shapes(cfg))
    embed = cfg.vocab_size * cfg.dim * elem_bytes
    head_weights = weights if weights == "fp" else HEAD_WEIGHTS
    head = 0 if cfg.tied_embeddings and weights == "fp" else \
        matmul_held_bytes(cfg.vocab_size, cfg.dim, head_weights, elem_bytes, group_size, device)
    return layers + embed + head + cfg.vector_elems_per_step * elem_bytes


def extra_copy_bytes(cfg: ModelConfig, elem_bytes: int, weights: str, group_size: int = 32,
                     device: str = "cuda") -> int:
    """What a quantised copy adds beside the floating-point model it is made from (which stays, for
    switching back): its own matmul weights; the embedding and the norms are shared."""
    shared = cfg.vocab_size * cfg.dim * elem_bytes + cfg.vector_elems_per_step * elem_bytes
    return held_weight_bytes(cfg, elem_bytes, weights, group_size, device) - shared
