"""The model variants the settings can ask for: the floating-point model at each dtype (made once),
quantised copies and draft models (made in background threads while a reply keeps streaming)."""
from __future__ import annotations

import threading

import torch

from engine.context import EngineContext
from engine.io.loader import LoadedWeights
from engine.model.config import ModelConfig
from engine.model.footprint import copy_fit_refusal
from engine.model.quant import QuantisedModels
from engine.model.transformer import Transformer
from engine.serving.speculative import DraftModels
from engine.settings import DRAFT_GROUP_SIZE, EngineError, QuantError, Settings, check_weights, weights_label
from engine.steps.timing import elem_bytes

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
        with self._lock:
            new_dtype = settings.dtype not in self._models
        if new_dtype:  # another dtype's weights: a copy of the model
            self.check_copy_fits(settings.dtype, "fp", settings.group_size)
        self.request_weights(settings)
        self.request_draft(settings)

    def request_weights(self, settings: Settings) -> None:
        if settings.weights_key is None:
            return
        try:
            check_weights(self.cfg, settings.weights, settings.group_size)
        except QuantError as e:
            raise EngineError(str(e)) from None
        building = self.quantised.building
        made = self.quantised.get(settings.weights_key) is not None
        if not made and (building is None or building[0] != settings.weights_key):
            self.check_copy_fits(settings.dtype, settings.weights, settings.group_size)
        self.quantised.start(settings.weights_key, lambda: self.fp(settings.dtype), self.progress)

    def check_copy_fits(self, dtype: str, weights: str, group_size: int) -> None:
        """Refuse a new copy of the weights (another dtype, a quantised copy) the device has no room
        for, in one line, before any of it is made (engine/model/footprint.py)."""
        refusal = copy_fit_refusal(self.cfg, self.device, dtype, weights, group_size, elem_bytes(DTYPES[dtype]))
        if refusal:
            raise EngineError(refusal)

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
