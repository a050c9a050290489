"""GPU smoke check: the CUDA-graph decode step gives the eager step's tokens, and the
figures it reports are finite and under the peak. Run by scripts/gpu_check.sh."""
import math

import torch

from engine.config import ModelConfig
from engine.engine import Engine, Settings, TokenEvent
from engine.loader import LoadedWeights, synthetic_weights
from engine.byte_tokenizer import ByteTokenizer
from engine.metrics import StepMetrics
from engine.sampling import SamplingParams

cfg = ModelConfig.from_name("llama3.2-1b").with_max_seq_len(2048)
weights = synthetic_weights(cfg, torch.bfloat16, "cuda", seed=0)
loaded = LoadedWeights(cfg, weights, ByteTokenizer(cfg.vocab_size), "synthetic", "llama3.2-1b", "bf16")
greedy = SamplingParams(greedy=True, temperature=0.0)
prompt = list(range(1, 100))
runs = {}
for graphs in (False, True):
    eng = Engine(loaded, device="cuda", settings=Settings(dtype="bf16", max_new_tokens=48, sampling=greedy,
                                                          cuda_graphs=graphs))
    events = list(eng.generate(prompt))
    tokens = [e.token_id for e in events if isinstance(e, TokenEvent)]
    steps = [e for e in events if isinstance(e, StepMetrics) and e.phase == "decode"]
    mbu = [s.mbu for s in steps[10:]]
    print(f"cuda_graphs={graphs}: graph_failed={eng._graph_failed} decode tok/s "
          f"{len(steps) / sum(s.step_s for s in steps):.1f}, MBU median {sorted(mbu)[len(mbu) // 2]:.2%}")
    assert all(math.isfinite(s.achieved_gbs) and s.mbu < 1.05 for s in steps), "MBU above peak: a wrong figure"
    runs[graphs] = tokens
same = sum(a == b for a, b in zip(runs[False], runs[True]))
print(f"tokens equal eager vs graph: {same}/{len(runs[False])}")
assert same >= len(runs[False]) - 2, "graph decode diverges from eager"  # bf16 near-ties may flip late tokens
print("smoke ok")
