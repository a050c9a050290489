"""The kernels' load checks without a GPU: the registry of kernels switched off, the fault that
fails a named kernel's check on a CPU, the notes it leaves in the engine's Capabilities (and the
host's ModelInfo), and the CUDA-graph decoder told why it is off. The checks themselves, and the
dispatch around a switched-off kernel, run under TRITON_INTERPRET=1 in tests/kernels/test_load_checks.py."""
from dataclasses import replace

import pytest
import torch

from engine.context import EngineContext
from engine.events import TokenEvent
from engine.faults import Faults, InjectedFault
from engine.graphs import GraphDecoder
from engine.host import EngineHost
from engine.kernel_checks import CHECKS, check_graphs, check_kernels, mismatch, run_checks
from engine.protocol import Load
from kernels.registry import KERNELS, KernelSwitches
from tests.engine.test_engine import GREEDY, fake_cpu, make_engine


@pytest.fixture
def inject(monkeypatch):
    """inject("kernel_check:int4"): MEMBOUND_FAULTS as a spawned engine process would read it (an
    engine's context reads it when it is made)."""
    def set_faults(text: str) -> None:
        monkeypatch.setenv("MEMBOUND_FAULTS", text)
    return set_faults


def test_the_switches_keep_the_first_reason_and_know_their_kernels():
    switches = KernelSwitches()
    assert all(switches.enabled(name) and switches.reason(name) == "" for name in KERNELS)
    switches.disable("int4", "max error 0.3")
    switches.disable("int4", "a later reason")
    assert not switches.enabled("int4") and switches.reason("int4") == "max error 0.3"
    assert switches.enabled("int8") and switches.disabled() == {"int4": "max error 0.3"}
    with pytest.raises(ValueError, match="unknown kernel 'int2'"):
        switches.disable("int2", "no such kernel")
    assert KernelSwitches().disabled() == {}  # each engine's context has its own
    switches.reset()
    assert switches.enabled("int4")
    assert {check.kernel for check in CHECKS} == set(KERNELS)


def test_a_named_kernel_check_fault_fails_that_check_only():
    named = Faults("kernel_check:int4+paged")
    for name in ("int4", "paged"):
        with pytest.raises(InjectedFault, match=f"the {name} kernel's check"):
            named.inject_kernel_check(name)
    named.inject_kernel_check("int8")  # not named: nothing happens
    second = Faults("kernel_check@2")  # a plain kind: the second check reached fails
    second.inject_kernel_check("int8")
    with pytest.raises(InjectedFault):
        second.inject_kernel_check("int4")
    Faults("").inject("load")  # none asked for: nothing happens


def test_on_a_cpu_only_the_cpu_step_check_runs_and_no_kernel_is_switched_off():
    engine = make_engine()
    results = run_checks(engine)
    assert [r.kernel for r in results] == list(KERNELS)
    assert [r.kernel for r in results if r.ran] == ["cpu_step"] and not any(r.problem for r in results)
    assert check_kernels(engine) == {} and engine.context.kernels.disabled() == {}
    assert engine.graphs.unavailable == "not on a GPU"


def test_an_injected_failure_switches_its_kernel_off_with_a_note_for_its_option(inject):
    inject("kernel_check:int4")
    engine = make_engine()
    engine.kernel_notes = check_kernels(engine)
    note = engine.kernel_notes["weights=int4"]
    assert note.startswith("INT4 Triton kernel failed its check (InjectedFault: injected fault in the int4")
    assert note.endswith("— using the PyTorch path") and "\n" not in note
    assert list(engine.kernel_notes) == ["weights=int4"] and not engine.context.kernels.enabled("int4")
    capabilities = engine.capabilities()
    assert capabilities.note("weights", "int4") == note and capabilities.note("weights", "int8") == ""
    # switched off in the context: a later engine of it (the host's next load) does not check it
    # again, and says so again; an engine of its own context checks it afresh
    assert check_kernels(make_engine(context=engine.context)) == {"weights=int4": note}
    assert all(r.kernel != "int4" for r in run_checks(make_engine(context=engine.context)))
    assert any(r.kernel == "int4" for r in run_checks(make_engine()))


def test_a_failed_graph_check_tells_the_graph_decoder_why(inject):
    inject("kernel_check:graphs")
    engine = make_engine()
    notes = check_kernels(engine)
    assert notes["cuda_graphs=True"].startswith("CUDA-graph decode failed its check")
    assert notes["cuda_graphs=True"].endswith("— decoding without graphs")
    assert engine.graphs.unavailable.startswith("failed its check at load: InjectedFault")
    later = GraphDecoder("cuda", kernels=engine.context.kernels)  # a later engine of its context never tries graphs
    assert later.unavailable == engine.context.kernels.reason("graphs") and not later.active(True)
    assert not GraphDecoder("cuda", kernels=EngineContext().kernels).unavailable  # another engine's: its own


def test_the_host_publishes_the_notes_with_the_model(inject, tiny_weights):
    inject("kernel_check:int8+flash")
    emitted = []
    host = EngineHost(lambda kind, *args: emitted.append((kind, args)))
    host.execute(Load(tiny_weights, device="cpu", settings=GREEDY, hardware=fake_cpu()))
    info = next(args[0] for kind, args in emitted if kind == "model_loaded")
    assert set(info.capabilities.notes) == {"weights=int8", "attention=flash"}
    assert info.capabilities.note("attention", "flash").startswith("flash-decoding Triton kernel failed its check")
    assert not [args for kind, args in emitted if kind == "failed"]


# ---- the graph check's plumbing, with the capture stood in for by the capturable step run eagerly ----
def stand_in_graphs(engine, broken: str = "", cuda_graphs: bool = True):
    """engine.graphs as on a GPU, its compiled step replaced by `forward_decode_static` run eagerly
    (torch.compile's CUDA graphs need a GPU); `broken`: "stale" reads no cache, "capture" fails."""
    graphs = engine.graphs
    graphs.unavailable = ""
    engine.settings = replace(engine.settings, cuda_graphs=cuda_graphs)  # a CPU engine's say False

    def decode(model, cache, tokens, start, attention):
        if broken == "capture":
            graphs.unavailable = "capture failed: BackendCompilerFailed: inductor"
            return model(tokens, start_pos=start, cache=cache, attention=attention)
        graphs.replays += 1
        cache.length = start + 1
        if broken == "stale":
            return model(tokens, attention=attention)
        if broken == "rounding":  # a fused graph rounds differently, by about bf16's step
            logits = model.forward_decode_static(tokens, torch.tensor([start]), cache, attention)
            return logits + 0.02 * logits.abs().max() * torch.sign(torch.randn_like(logits))
        return model.forward_decode_static(tokens, torch.tensor([start]), cache, attention)
    graphs.decode = decode
    return graphs


def test_the_graph_check_compares_the_replayed_step_with_eager_and_leaves_the_cache_empty():
    engine = make_engine()
    graphs = stand_in_graphs(engine)
    assert check_graphs(engine) == ""
    assert engine.cache.layout == "contiguous" and engine.cache.length == 0 and engine.cached_ids == []
    assert graphs.replays == 0  # the figures count the conversation's replays only
    # the first reply decodes into the cache the check captured its graph on, as a fresh engine would
    cache = engine.cache
    tokens = reply(engine)
    assert engine.cache is cache and len(tokens) == GREEDY.max_new_tokens and graphs.replays == len(tokens) - 1
    assert tokens == reply(make_engine())
    paged = make_engine(replace(GREEDY, kv_layout="paged"))  # graphs are not for its cache: a scratch one
    own = paged.cache  # (made with the engine)
    stand_in_graphs(paged)
    assert check_graphs(paged) == "" and paged.cache is own and own.layout == "paged" and paged.cached_ids == []


def test_the_graph_check_holds_a_bf16_model_to_bf16s_tolerance_not_its_fp32_logits():
    bf16 = make_engine()
    bf16.apply(replace(bf16.settings, dtype="bf16"))
    list(bf16.take_settings())
    assert bf16.model.dtype == torch.bfloat16
    stand_in_graphs(bf16, broken="rounding")
    assert check_graphs(bf16) == ""  # 2% of the largest logit: within a bf16 step's rounding
    fp32 = make_engine()
    stand_in_graphs(fp32, broken="rounding")
    assert check_graphs(fp32).startswith("max error")  # but far outside an fp32 one's


def reply(engine) -> list[int]:
    return [e.token_id for e in engine.generate([5, 6, 7], ignore_eos=True)
            if isinstance(e, TokenEvent) and e.token_id >= 0]


def test_a_graph_that_disagrees_or_does_not_capture_fails_its_check():
    engine = make_engine()
    stand_in_graphs(engine, broken="stale")
    assert check_graphs(engine).startswith("max error")
    engine = make_engine()
    stand_in_graphs(engine, broken="capture")
    assert check_graphs(engine) == "capture failed: BackendCompilerFailed: inductor"
    engine = make_engine(replace(GREEDY, cuda_graphs=False))
    stand_in_graphs(engine, cuda_graphs=False)
    assert check_graphs(engine) is None  # graphs are off in the settings: nothing to check


def test_mismatch_says_what_is_wrong():
    want = torch.tensor([1.0, -2.0, 4.0])
    assert mismatch(want.clone(), want) == ""
    assert mismatch(want * 1.5, want) == "max error 0.5 of the largest output, allowed 0.0001"
    assert mismatch(torch.tensor([1.0, float("nan"), 4.0]), want) == "returned non-finite values"
    assert mismatch(want.half(), want).startswith("returned torch.float16 (3,), expected torch.float32")


@pytest.fixture
def tiny_weights():
    return make_engine().loaded


def test_a_cpu_step_that_disagrees_with_pytorch_is_switched_off_and_pytorch_decodes(monkeypatch):
    from engine.model import cpu_step
    real = cpu_step.checked_step
    monkeypatch.setattr(cpu_step, "checked_step", lambda *args, **kw: None if (got := real(*args, **kw)) is None
                        else got + 1.0)  # a wrong step: every logit off by one
    engine = make_engine()
    notes = check_kernels(engine)
    assert notes["attention=flash"].startswith("C++ CPU decode step failed its check (max error")
    assert notes["attention=flash"].endswith("— using PyTorch's step")
    assert not engine.context.kernels.enabled("cpu_step")
    monkeypatch.undo()
    ids = engine.tokenizer.encode("hello")
    steps = [e for e in engine.generate(ids, max_new_tokens=3) if type(e).__name__ == "StepMetrics"]
    assert len(steps) == 3 and cpu_step.unavailable_reason(engine.context).startswith("max error")


def test_the_cpu_step_passes_its_check_on_the_default_model_in_bf16():
    """bf16 rounds at other points in C++ than in PyTorch's ops: held to the bf16 bound, not fp32's
    (the fp32 logits of a bf16 model once failed it, and the app loaded in bf16 never ran C++)."""
    from engine.engine import Engine
    from engine.settings import Settings
    engine = Engine("default", device="cpu", dtype="bf16", max_context=64, hardware=fake_cpu(),
                    settings=Settings(dtype="bf16"))
    results = {r.kernel: r for r in run_checks(engine)}
    assert results["cpu_step"].ran and results["cpu_step"].problem == "" and engine.context.kernels.enabled("cpu_step")


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_the_cpu_step_passes_its_check_on_the_default_model_in_fp32_with_quantised_weights(weights):
    """INT8/INT4 products round in bf16 (PyTorch's x and y; the C++ step's x on bf16 dot products):
    held to bf16's bound. Held to fp32's they failed by 0.018 / 0.038, and an app loaded at fp32 with
    INT8/INT4 weights never ran C++ (8 simulated users: 116 tok/s in the window, ~560 headless: issue 23)."""
    from engine.engine import Engine
    from engine.settings import Settings
    engine = Engine("default", device="cpu", dtype="fp32", max_context=64, hardware=fake_cpu(),
                    settings=Settings(dtype="fp32", weights=weights))
    results = {r.kernel: r for r in run_checks(engine)}
    assert results["cpu_step"].ran and results["cpu_step"].problem == "" and engine.context.kernels.enabled("cpu_step")
