"""The model variants the settings can ask for: the floating-point model at each dtype (made once),
quantised copies and draft models (made in background threads while a reply keeps streaming)."""
from __future__ import annotations

import threading

import torch

from engine.context import EngineContext
from engine.io.loader import LoadedWeights
from engine.model.config import ModelConfig
from engine.model.quant import QuantisedModels
from engine.model.transformer import Transformer
from engine.serving.speculative import DraftModels
from engine.settings import DRAFT_GROUP_SIZE, EngineError, QuantError, Settings, check_weights, weights_label

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class ModelVariants:
    """`current(settings)` is the model a step runs; `request(settings)` starts making what it
    lacks, `ready(settings)` says whether that is done and `wait(settings)` waits for it."""

    def __init__(self, loaded: LoadedWeights, dtype: str, device: str, context: EngineContext | None = None,
                 progress=None):
        self.loaded = loaded
        self.cfg: ModelConfig = loaded.cfg
        self.device = device
        self.context = context  # the engine's: every variant made here is bound to it
        self.progress = progress  # also reports quantisation, from its background thread
        self._lock = threading.Lock()
        self._models: dict[str, Transformer] = {dtype: Transformer(self.cfg, loaded.weights, context)}
        self.quantised = QuantisedModels()
        self.drafts = DraftModels()  # draft models for speculation ("draft"), loaded in the background

    def current(self, settings: Settings) -> Transformer:
        key = settings.weights_key
        return self._models[settings.dtype] if key is None else self.quantised.get(key)

    def fp(self, name: str) -> Transformer:
        """The model in dtype `name` with its own floating-point weights, made once (may run
        on the quantisation thread: the table is guarded)."""
        with self._lock:
            model = self._models.get(name)
        if model is None:
            weights = {k: v.to(DTYPES[name]) for k, v in self.loaded.weights.items()}
            with self._lock:
                model = self._models.setdefault(name, Transformer(self.cfg, weights, self.context))
        return model

    def model_for(self, settings: Settings) -> Transformer:
        """The model `settings` would run, made now if need be (quality tables, the bench)."""
        key = settings.validate(self.device).weights_key
        if key is None:
            return self.fp(settings.dtype)
        self.request_weights(settings)
        try:
            return self.quantised.wait(key)
        except QuantError as e:
            raise EngineError(str(e)) from None

    def request(self, settings: Settings) -> None:
        """Start making the quantised weights and the draft model `settings` need (EngineError: one line)."""
        self.request_weights(settings)
        self.request_draft(settings)

    def request_weights(self, settings: Settings) -> None:
        if settings.weights_key is None:
            return
        try:
            check_weights(self.cfg, settings.weights, settings.group_size)
            self.quantised.start(settings.weights_key, lambda: self.fp(settings.dtype), self.progress)
        except QuantError as e:
            raise EngineError(str(e)) from None

    def request_draft(self, settings: Settings) -> None:
        """Start loading the draft model `settings` speculate with (a no-op unless speculate="draft")."""
        if settings.speculate != "draft":
            return
        key = draft_key(settings)
        self.drafts.start(key, lambda: self.build_draft(settings))

    def build_draft(self, settings: Settings) -> Transformer:
        """The draft model of `settings` (runs on the loading thread). "self" is the target's own
        weights at the draft's precision (its quantised copy shared with the weights switch)."""
        from engine.serving.speculative import load_draft
        if settings.draft_model == "self":
            return self.model_for(Settings(dtype=settings.dtype, weights=settings.draft_weights,
                                           group_size=DRAFT_GROUP_SIZE))
        draft = load_draft(settings.draft_model, self.cfg, self.loaded.tokenizer, DTYPES[settings.dtype],
                           self.device, settings.draft_weights, self.cfg.max_seq_len)
        return draft.bind(self.context)

    @property
    def weights_building(self) -> tuple[str, float] | None:
        """(label, fraction done) while quantised weights are being made, else None."""
        building = self.quantised.building
        if building is None:
            return None
        (_, weights, group_size), fraction = building
        return weights_label(weights, group_size), fraction

    def ready(self, settings: Settings) -> bool:
        """False while the weights or the draft model `settings` need are still being made."""
        key = settings.weights_key
        draft = draft_key(settings) if settings.speculate == "draft" else None
        return not ((key is not None and self.quantised.get(key) is None and self.weights_building is not None)
                    or (draft is not None and self.drafts.is_building(draft)))

    def wait(self, settings: Settings) -> Transformer | None:
        """Wait for what `settings` need; returns their draft model (None: they use none). Raises
        QuantError or EngineError when it could not be made."""
        key = settings.weights_key
        if key is not None and self.quantised.get(key) is None:
            self.quantised.wait(key)
        return self.drafts.wait(draft_key(settings)) if settings.speculate == "draft" else None


def draft_key(settings: Settings) -> tuple:
    return settings.draft_model, settings.dtype, settings.draft_weights
