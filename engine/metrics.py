"""The cost model: bytes moved and FLOPs of one forward step from the model's shape and the
settings; with the step's measured time, achieved GB/s, FLOP/s, MBU, MFU, arithmetic
intensity and the predicted ceiling. One immutable `StepMetrics` per step."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from engine.hardware.roof import above_roof
from engine.model.config import ModelConfig

# Phases whose rate counts the tokens they produce (tokens_out): plain decode, a speculative step's
# verification (accepted guesses + the target's own token) and its draft (the draft model's forwards:
# none of their guesses count until verified). Prefill and mixed steps count the tokens they feed.
DECODE_PHASES = ("decode", "verify", "draft")


@dataclass(frozen=True)
class StepCost:
    """What one forward step moves and computes, for `batch_size` sequences of `new_tokens`
    tokens each, appended after `context_len` tokens already in the KV cache."""
    weight_bytes: int  # every matmul weight once, at its storage precision (+ norms and biases)
    kv_read_bytes: int  # cached K and V read by attention
    kv_write_bytes: int  # new K and V written into the cache
    other_bytes: int  # embedding rows gathered, logits written
    flops: int  # matmul FLOPs + attention FLOPs (2 per multiply-add)
    matmul_flops: int
    attention_flops: int
    attention_bytes: int = 0  # naive attention: the score matrix written, then read back

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes + self.other_bytes + self.attention_bytes

    @property
    def kv_bytes(self) -> int:
        return self.kv_read_bytes + self.kv_write_bytes


def sum_costs(costs: list[StepCost]) -> StepCost:
    """Several forwards as one (a draft model's k passes, reported as one "draft" step)."""
    return StepCost(**{f.name: sum(getattr(c, f.name) for c in costs) for f in fields(StepCost)})


def step_cost(cfg: ModelConfig, *, batch_size: int, new_tokens: int, context_len: int,
              weight_bytes: int, kv_elem_bytes: int, act_elem_bytes: int = 4, kv_cache: bool = True,
              logits_rows: int | None = None, kv_read_tokens: int | None = None,
              attention: str = "flash", kv_layout: str = "contiguous", block_size: int = 16) -> StepCost:
    """Cost of one step.

    weight_bytes: bytes of all matmul weights as stored (quantised weights count their
    packed bytes and scales); the caller knows the storage format.
    kv_cache=False: the step recomputes the whole context (new_tokens is then the context
    length plus the new token, context_len must be 0) and nothing is cached.
    logits_rows: rows the head is evaluated on (default one per sequence).
    kv_read_tokens: cache positions attention actually reads, when it reads more than the
    live context (a captured step without the flash kernel reads the whole buffer, masked).
    attention="naive": the (B, n_heads, T, S) score matrix is written to memory and read back
    in the activation dtype, S = every key of the step (the masked half included: it is computed
    and stored too), and its FLOPs are the full T x S product; "flash" keeps it on chip and skips
    the masked half. kv_layout="paged": attention also reads each sequence's block table (int32,
    once per KV head and layer); the positions it reads are the live ones, as contiguous.
    Sliding-window layers (Gemma, Phi-3-mini) read and attend to their window's keys only; Gemma 2's
    soft-capped scores are written to memory and read back as naive attention's are (no fused
    kernel here takes them)."""
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
    # (causal), so the keys seen sum to T*C + T(T+1)/2 a layer (a sliding layer: its window's)
    keys_seen = cfg.keys_seen(C, T)
    score_bytes = 0
    if attention == "naive" or cfg.attn_softcap:
        S = kv_read_tokens if kv_cache and kv_read_tokens is not None else C + T  # keys in the matrix
        keys_seen = cfg.n_layers * T * S
        score_bytes = 2 * cfg.n_layers * B * cfg.n_heads * T * S * act_elem_bytes  # written, then read
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
        attention_bytes=score_bytes,
    )


@dataclass(frozen=True)
class StepMetrics:
    """One step, measured. Plain data: safe to hand across threads and to JSON."""
    step: int
    phase: str  # "prefill", "decode", "mixed" (a batched step of prompt chunks and decode rows), or a
    # speculative step's two parts: "draft" (the draft model's forwards) and "verify" (the target's one)
    batch_size: int
    new_tokens: int  # tokens fed to the model this step, per sequence
    tokens_out: int  # tokens produced (sampled) this step, all sequences
    context_len: int  # tokens already cached before the step
    step_s: float  # measured wall time (CUDA events on a GPU)
    weight_bytes: int
    kv_read_bytes: int
    kv_write_bytes: int
    other_bytes: int
    flops: int
    peak_bandwidth_bps: float  # bytes/s the device can move (spec or measured)
    peak_flops: float  # FLOP/s for the step's dtype
    t_s: float = 0.0  # monotonic time at the end of the step
    settings_label: str = ""  # e.g. "fp32 · kv on"
    attention_bytes: int = 0  # naive attention's score matrix written and read back (0 for flash)
    tokens_in: int = 0  # tokens fed this step, all sequences; 0: batch_size x new_tokens (a ragged
    # batched step's new_tokens is a rounded mean, so it carries the exact count here)
    draft_tokens: int = 0  # speculative steps: guesses made (draft) or checked (verify)
    accepted_tokens: int = 0  # verify: guesses the target kept (it also adds one token of its own)
    captured: bool = False  # the step ran from a captured graph or a compiled step, not eagerly
    roof: str = "memory"  # the bandwidth roof it sits under: "memory", or "cache" (its bytes fit the last-level cache)

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

    @classmethod
    def from_cost(cls, cost: StepCost, *, step: int, phase: str, batch_size: int, new_tokens: int,
                  tokens_out: int, context_len: int, step_s: float, peak_bandwidth_bps: float,
                  peak_flops: float, t_s: float = 0.0, settings_label: str = "", tokens_in: int = 0,
                  draft_tokens: int = 0, accepted_tokens: int = 0, captured: bool = False) -> "StepMetrics":
        return cls(step=step, phase=phase, batch_size=batch_size, new_tokens=new_tokens, tokens_out=tokens_out,
                   context_len=context_len, step_s=step_s, weight_bytes=cost.weight_bytes,
                   kv_read_bytes=cost.kv_read_bytes, kv_write_bytes=cost.kv_write_bytes,
                   other_bytes=cost.other_bytes, flops=cost.flops, peak_bandwidth_bps=peak_bandwidth_bps,
                   peak_flops=peak_flops, t_s=t_s, settings_label=settings_label,
                   attention_bytes=cost.attention_bytes, tokens_in=tokens_in, draft_tokens=draft_tokens,
                   accepted_tokens=accepted_tokens, captured=captured)

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes + self.other_bytes + self.attention_bytes

    @property
    def kv_bytes(self) -> int:
        return self.kv_read_bytes + self.kv_write_bytes

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
    def predicted_ceiling_tokens_per_s(self) -> float:
        """Roofline bound: the step cannot finish before its bytes at peak bandwidth nor before
        its FLOPs at peak FLOP/s."""
        floor_s = max(self.total_bytes / self.peak_bandwidth_bps, self.flops / self.peak_flops)
        return self._tokens / floor_s

    @property
    def bound(self) -> str:
        """Which roof the step sits under by the model: 'memory' or 'compute'."""
        ridge = self.peak_flops / self.peak_bandwidth_bps
        return "compute" if self.arithmetic_intensity >= ridge else "memory"

    def to_dict(self) -> dict:
        d = asdict(self)
        for name in ("total_bytes", "achieved_gbs", "achieved_tflops", "mbu", "mfu", "arithmetic_intensity",
                     "tokens_per_s", "bytes_per_token", "memory_ceiling_tokens_per_s",
                     "predicted_ceiling_tokens_per_s", "bound", "acceptance_rate", "overhead_s", "above_roof"):
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


def held_weight_bytes(cfg: ModelConfig, elem_bytes: int, weights: str = "fp", group_size: int = 32,
                      device: str = "cuda") -> int:
    """Bytes a model's weights hold at one weights setting (each tensor once; a tied head shares
    the embedding only while both are floating point), as the engine stores them on `device`."""
    shapes = [(cfg.q_dim + 2 * cfg.kv_dim, cfg.dim), (cfg.dim, cfg.q_dim), (2 * cfg.ffn_dim, cfg.dim),
              (cfg.dim, cfg.ffn_dim)]
    layers = cfg.n_layers * sum(matmul_held_bytes(n, k, weights, elem_bytes, group_size, device) for n, k in shapes)
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
