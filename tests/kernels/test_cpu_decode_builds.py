"""How the C++ step is built where it runs: the build plans of Linux, macOS and Windows (the platform
mocked: which flags, which fallback, the message), every x86 level this machine runs compiling clean
under -Wall -Wextra, the aarch64 builds (plain NEON, SDOT, BFDOT + SDOT, no SIMD) cross-compiled and
run under qemu-aarch64 against fp64 references and the scalar build (the sampler against PyTorch's
softmax and numpy's draw), and the per-format timing that
decides whether the C++ step or PyTorch's decodes."""
import os
import shutil
import subprocess
from pathlib import Path

import numpy
import pytest
import torch

from engine.model import cpu_step, sampling
from engine.settings import SamplingParams
from kernels import cpu_decode
from kernels.cpu_decode import BuildError, build_plan

AVX512_FLAGS = "flags : fpu sse2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_bf16"
AVX2_FLAGS = "flags : fpu sse2 avx avx2 fma f16c"
DRIVER = Path(__file__).with_name("cpu_decode_driver.cpp")


def which_of(*present: str):
    return lambda name: f"/usr/bin/{name}" if name in present else None


def plan(isa="native", system="Linux", machine="x86_64", present=("g++",), features=AVX512_FLAGS, **kw):
    return build_plan(isa, system=system, machine=machine, which=which_of(*present),
                      cpu_features=features, **kw)


# ---- the build plans -------------------------------------------------------------------------------
def test_linux_x86_levels_are_compiler_targets():
    assert "-march=native" in plan().flags and "-fopenmp" in plan().flags and plan().suffix == ".so"
    assert plan().compiler == "g++" and {"-Wall", "-Wextra"} <= set(plan().flags)
    avx2 = plan("avx2").flags
    assert "-march=x86-64-v3" in avx2 and "-march=native" not in avx2  # AVX2 + FMA + F16C, no AVX-512
    assert "-march=x86-64" in plan("scalar").flags
    assert plan("avx512").level == "avx512" and "-march=native" in plan("avx512").flags


def test_a_level_this_cpu_cannot_run_is_refused_in_one_line():
    with pytest.raises(BuildError, match=r"^MEMBOUND_CPU_ISA=avx512: this CPU has no AVX-512 \(its flags lack avx512f\)$"):
        plan("avx512", features=AVX2_FLAGS)
    with pytest.raises(BuildError, match="MEMBOUND_CPU_ISA=neon is an ARM level; this CPU is x86_64"):
        plan("neon")
    with pytest.raises(BuildError, match="MEMBOUND_CPU_ISA=avx2 is an x86 level; this CPU is aarch64"):
        plan("avx2", machine="aarch64", features="Features : fp asimd")
    with pytest.raises(BuildError, match=r"MEMBOUND_CPU_ISA=sse9: expected one of avx512, avx2, neon, scalar"):
        cpu_decode.requested_isa("sse9")
    assert cpu_decode.requested_isa("") == "native" and cpu_decode.requested_isa("AVX2") == "avx2"


def test_linux_aarch64_builds_for_its_own_cpu_or_without_simd():
    arm = plan(machine="aarch64", features="Features : fp asimd bf16 asimddp")
    assert "-mcpu=native" in arm.flags and "-fopenmp" in arm.flags
    assert "-march=armv8-a+nosimd" in plan("scalar", machine="aarch64", features="Features : fp asimd").flags


def test_macos_uses_apple_clang_with_pytorchs_libomp(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "include").mkdir()
    (tmp_path / "lib" / "libomp.dylib").touch()
    (tmp_path / "include" / "omp.h").touch()
    mac = plan(system="Darwin", machine="arm64", present=("clang++",), features="", torch_dir=tmp_path)
    assert mac.compiler == "clang++" and mac.suffix == ".dylib" and mac.note == ""
    flags = " ".join(mac.flags)
    assert "-mcpu=native" in flags and "-Xpreprocessor -fopenmp" in flags  # Apple clang: through the preprocessor
    assert f"-Xpreprocessor -fopenmp -I{tmp_path / 'include'} -L{tmp_path / 'lib'} -lomp -Wl,-rpath,{tmp_path / 'lib'}" in flags


def test_macos_without_libomp_builds_for_one_thread_and_says_so(tmp_path):
    mac = plan(system="Darwin", machine="arm64", present=("clang++",), features="", torch_dir=tmp_path,
               exists=lambda p: False)
    assert "-Xpreprocessor" not in mac.flags and "-Wno-unknown-pragmas" in mac.flags
    assert mac.note == "the C++ step runs on one thread (Apple clang without OpenMP: PyTorch's libomp.dylib not found)"
    intel = plan(system="Darwin", machine="x86_64", present=("clang++",), features="", torch_dir=tmp_path,
                 exists=lambda p: False)
    assert "-march=native" in intel.flags


def test_windows_builds_with_clang_cl_or_refuses_in_one_line():
    win = plan(system="Windows", machine="AMD64", present=("clang-cl",), exists=lambda p: p.name == "libomp.lib")
    assert win.compiler == "clang-cl" and win.suffix == ".dll" and "/openmp" in win.flags and win.note == ""
    assert "/clang:-march=native" in win.flags and "/LD" in win.flags
    lone = plan("avx2", system="Windows", machine="AMD64", present=("clang-cl",), exists=lambda p: False)
    assert "/clang:-march=x86-64-v3" in lone.flags and "/openmp" not in lone.flags
    assert lone.note == "the C++ step runs on one thread (clang-cl found no LLVM libomp.lib for OpenMP)"
    with pytest.raises(BuildError) as msvc:
        plan(system="Windows", machine="AMD64", present=("cl",))
    assert str(msvc.value) == ("the C++ decode step on Windows needs LLVM's clang-cl (only MSVC's cl, which lacks "
                               "the GCC vector extensions it uses): PyTorch's step decodes")
    with pytest.raises(BuildError, match=r"needs LLVM's clang-cl \(no compiler\)"):
        plan(system="Windows", machine="AMD64", present=())


def test_no_compiler_anywhere_is_one_line():
    with pytest.raises(BuildError, match=r"^no C\+\+ compiler \(g\+\+ or clang\+\+\) on PATH$"):
        plan(present=())
    with pytest.raises(BuildError, match=r"^no C\+\+ compiler \(clang\+\+ or g\+\+\) on PATH$"):
        plan(system="Darwin", machine="arm64", present=(), features="")


def test_the_cache_key_names_the_level_and_the_cpus_features(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cpu_decode, "_LOADED", {})
    lib = cpu_decode.load("avx2")
    built = list((tmp_path / "membound" / "cpu_decode").glob("*.so"))
    assert [p.name.split("-")[1] for p in built] == ["avx2"] and lib.isa == "AVX2"
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor : 0\nBogoMIPS : 50.00\nFeatures : fp asimd evtstrm aes bf16 asimddp\n")
    assert cpu_decode.cpu_feature_line("Linux", str(cpuinfo)).startswith("Features : fp asimd")


# ---- every level this machine runs compiles clean ---------------------------------------------------
@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
def test_each_x86_level_builds_clean_under_wall_wextra(isa, tmp_path):
    if isa == "native" and "avx512f" not in cpu_decode.cpu_feature_line().split():
        isa = "avx2"
    built = build_plan(isa)
    done = subprocess.run([built.compiler, *built.flags, "-Werror", str(cpu_decode.SOURCE), "-o", str(tmp_path / "x.so")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


# ---- the AVX-512 variants a laptop or server may have: without VNNI or bf16 dots (Skylake-X), VNNI without
# bf16 dots (Ice Lake laptops), both (Cooper Lake, Sapphire Rapids, Zen 4): each INT4 path its own code
AVX512_TARGETS = {"skylake-avx512": ("AVX-512", ["avx512f"]),
                  "icelake-server": ("AVX-512 (int8 dot products)", ["avx512f", "avx512_vnni"]),
                  "cooperlake": ("AVX-512 (bf16 and int8 dot products)", ["avx512f", "avx512_vnni", "avx512_bf16"])}


@pytest.mark.parametrize("target", list(AVX512_TARGETS))
def test_each_avx512_variant_builds_clean_and_its_products_match_their_references(target, tmp_path):
    from tests.kernels.test_cpu_decode import (INT16_TOLERANCE, PRODUCT_TOLERANCE, c_matrix, product_layer,
                                               product_reference, relative_error)
    isa, needs = AVX512_TARGETS[target]
    has = cpu_decode.cpu_feature_line().split()
    if not all(n in has for n in needs):  # (an AVX2 machine: the AVX2 build is tested above)
        pytest.skip(f"this CPU cannot run {target}'s instructions ({', '.join(n for n in needs if n not in has)})")
    built = build_plan("scalar")
    flags = [f for f in built.flags if not f.startswith("-march")] + [f"-march={target}", "-Werror"]
    done = subprocess.run([built.compiler, *flags, str(cpu_decode.SOURCE), "-o", str(tmp_path / "x.so")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    import ctypes
    lib = cpu_decode.bind(ctypes.CDLL(str(tmp_path / "x.so")))
    assert lib.isa == isa
    for fmt in PRODUCT_TOLERANCE:
        for n, k in ((40, 96), (37, 224)):
            layer = product_layer(fmt, n, k)
            mat, _keep = c_matrix(layer)
            rounding = lib.membound_input_rounding(mat.fmt)
            tol = INT16_TOLERANCE if rounding == cpu_decode.X_INT16 else PRODUCT_TOLERANCE[fmt]
            x = torch.randn(9, k, generator=torch.Generator().manual_seed(n)) * 3 + 1
            got = cpu_decode.gemm(lib, mat, x, 2)
            assert relative_error(got, product_reference(layer, fmt, x, rounding)) < tol, (target, fmt, n, k)
            for i in (0, 5, 8):  # a row alone gives the bits it gave among eight others
                assert torch.equal(cpu_decode.gemm(lib, mat, x[i:i + 1], 1)[0], got[i]), (target, fmt, i)


# ---- aarch64 under qemu --------------------------------------------------------------------------------
AARCH64 = {"armv8-a": "NEON", "armv8.2-a+dotprod": "NEON (SDOT)", "armv8.6-a+bf16+dotprod": "NEON (BFDOT, SDOT)",
           "armv8-a+nosimd": "scalar"}
# products, relative to the reference's largest |value|: the inputs as the level takes them (int8
# codes per block for SDOT's int8 and int4: against the exact inputs)
PRODUCT_TOLERANCE = {"fp32": 1e-6, "bf16": 1e-6, "int8": 1e-6, "int4": 1e-5}
SDOT_TOLERANCE = 2e-2
# whole steps of a random model against the scalar x86 build: fp32 activations and weights, and the
# levels' input roundings through two layers (bf16 for BFDOT, int8 codes for SDOT)
STEP_TOLERANCE = {"fp32": 1e-5, "bf16": 1e-5, "int8": 1e-4, "int4": 1e-5}
ROUNDED_STEP_TOLERANCE = {"bf16": 3e-2, "int8": 8e-2, "int4": 4e-2}


def cross_tools() -> str:
    """"" when the cross compiler and qemu are here; else the one line make test prints."""
    missing = [t for t in ("aarch64-linux-gnu-g++", "qemu-aarch64") if not shutil.which(t)]
    return f"no {' or '.join(missing)} here (apt-get install qemu-user g++-aarch64-linux-gnu)" if missing else ""


@pytest.fixture(scope="module")
def driver_outputs(tmp_path_factory):
    """Each aarch64 build of the driver run under qemu, and the x86 scalar build natively (the steps'
    reference): {target: (products output, steps output, sample output)}."""
    why = cross_tools()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the NEON builds: {why}")
        pytest.skip(f"the NEON builds are not tested: {why}")
    tmp = tmp_path_factory.mktemp("aarch64")
    out = {}
    for target in (*AARCH64, "x86-64"):
        exe = tmp / f"driver-{target}"
        cxx = "g++" if target == "x86-64" else "aarch64-linux-gnu-g++"
        done = subprocess.run([cxx, "-O2", f"-march={target}", "-fopenmp", "-std=c++17", *cpu_decode.WARNINGS, "-Werror",
                               str(DRIVER), "-o", str(exe)], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{target}: {done.stderr[-2000:]}"
        run = [str(exe)] if target == "x86-64" else ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", "-cpu", "max", str(exe)]
        out[target] = tuple(subprocess.run(run + [mode], capture_output=True, text=True, timeout=600, check=True,
                                           env={**os.environ, "OMP_NUM_THREADS": "2"}).stdout
                            for mode in ("products", "steps", "sample"))
    return out


@pytest.mark.parametrize("target", list(AARCH64))
def test_aarch64_products_match_their_references_under_qemu(driver_outputs, target):
    products = driver_outputs[target][0]
    lines = [line.split() for line in products.splitlines()]
    assert ["isa", *AARCH64[target].split()] in lines  # the level the target's features select
    checked = 0
    for fields in lines:
        if fields[0] == "product":
            fmt, error = fields[1], float(fields[5])
            tol = SDOT_TOLERANCE if int8_codes(AARCH64[target], fmt) else PRODUCT_TOLERANCE[fmt]
            assert error < tol, f"{target} {' '.join(fields)}"
            checked += 1
        elif fields[0] == "bits":
            assert fields[4] == "1", f"{target}: a row's bits depend on the others: {' '.join(fields)}"
    assert checked == 4 * 5 * 4  # formats x shapes x row counts


def int8_codes(level: str, fmt: str) -> bool:
    """Whether the level takes this format's inputs as int8 codes (SDOT; BFDOT takes int4's as bf16)."""
    return "SDOT" in level and (fmt == "int8" or fmt == "int4" and "BFDOT" not in level)


def logits_of(output: str) -> dict:
    return {(f[1], f[2]): torch.tensor([float(v) for v in f[3:]]) for f in map(str.split, output.splitlines())
            if f[0] == "logits"}


@pytest.mark.parametrize("target", list(AARCH64))
def test_aarch64_steps_match_the_scalar_build(driver_outputs, target):
    """One-row steps, two sequences side by side and a three-row verify step of a random model (and that
    step again under naive attention)."""
    got, want = logits_of(driver_outputs[target][1]), logits_of(driver_outputs["x86-64"][1])
    assert got.keys() == want.keys() and len(got) == 4 * 14
    level = AARCH64[target]
    for (fmt, step), w in want.items():
        rounded = ("BFDOT" in level and fmt in ("bf16", "int4")) or int8_codes(level, fmt)
        tol = ROUNDED_STEP_TOLERANCE[fmt] if rounded else STEP_TOLERANCE[fmt]
        error = ((got[fmt, step] - w).abs().max() / w.abs().max()).item()
        assert error < tol, f"{target} {fmt} step {step}: {error:.1e}"


@pytest.mark.parametrize("target", [*AARCH64, "x86-64"])
def test_the_sampler_holds_at_every_aarch64_level_under_qemu(driver_outputs, target):
    """The C++ sampler (membound_tempered, membound_sample_top_p) built for each aarch64 level: its
    probabilities within fp32 rounding of PyTorch's softmax and zero where it is zero, and each token the
    one numpy's kept_tokens and draw_one give on those probabilities (rows of 1 to 1,000 tokens: every
    vector width's tail, masked tokens, ties, top-k 3, top-p 0.5 to 1, u at 0 and next to 1)."""
    from tests.engine.test_sampling import python_top_p_token
    lines = [line.split() for line in driver_outputs[target][2].splitlines()]
    rows = {f[1]: torch.tensor([float(v) for v in f[2:]]) for f in lines if f[0] == "row"}
    probs = {tuple(f[1:4]): numpy.array(f[4:], dtype=numpy.float32) for f in lines if f[0] == "probs"}
    tokens = [f[1:] for f in lines if f[0] == "token"]
    assert len(rows) == 5 and len(probs) == 5 * 4 and len(tokens) == 5 * 4 * 9
    for (r, t, k), got in probs.items():
        want = sampling.tempered(rows[r][None], SamplingParams(temperature=float(t), top_k=int(k)))[0]
        got = torch.from_numpy(got)
        assert bool((got[want == 0] == 0).all()) and torch.allclose(got, want, rtol=3e-6, atol=1e-12), (target, r, t, k)
    for r, t, k, p, u, token in tokens:
        assert int(token) == python_top_p_token(probs[r, t, k], float(p), float(u)), (target, r, t, k, p, u)


# ---- which step decodes, per format -------------------------------------------------------------------
def test_a_format_pytorch_steps_faster_decodes_in_pytorch_and_the_path_says_why(monkeypatch):
    from tests.kernels.test_cpu_decode import GQA, model_of
    from engine import dispatch
    from engine.kernel_checks import time_cpu_formats
    from engine.kv.cache import ContiguousKVCache
    timed = []

    def fake_timing(model):  # int4 "slower" in C++ here, the others faster
        timed.append(cpu_step.format_label(model))
        return (3e-3, 2e-3) if "int4" in cpu_step.format_label(model) else (1e-3, 2.5e-3)
    monkeypatch.setattr(cpu_step, "time_steps", fake_timing)
    fp = model_of(GQA, "fp32", "fp")
    made = time_cpu_formats(fp)
    assert [c.label for c in made] == timed == ["fp32", "fp32 · int8", "fp32 · int4"]
    line = cpu_step.path_line(fp)
    isa = cpu_step.library().isa
    assert line.startswith(f"decode: C++ step, {isa}, ") and "\n" not in line
    assert line.endswith("timed at load against PyTorch's step: fp32 2.5x, fp32 · int8 2.5x; PyTorch's step for "
                         "fp32 · int4 (the C++ step 1.5x its time)")
    int4 = model_of(GQA, "fp32", "int4")
    with torch.inference_mode():
        cache = ContiguousKVCache(GQA, 1, GQA.max_seq_len, torch.float32, "cpu")
        before = dispatch.counts()
        int4(torch.tensor([[3]]), 0, cache)
        fp(torch.tensor([[3]]), 0, ContiguousKVCache(GQA, 1, GQA.max_seq_len, torch.float32, "cpu"))
        ran = dispatch.since(before)["decode step"]
    assert ran.get(cpu_step.STEP_LABEL) == 1 and len(timed) == 3  # fp32 in C++, int4 in PyTorch; no new timing


@pytest.mark.cpu_timing
def test_the_timing_runs_both_steps_on_a_stand_in_of_the_first_layers(monkeypatch):
    from tests.kernels.test_cpu_decode import QWEN, model_of
    model = model_of(QWEN, "fp32", "int8")
    monkeypatch.setattr(cpu_step, "STAND_IN_BYTES", 1)  # one layer is enough
    short = cpu_step.stand_in(model)
    assert short.cfg.n_layers == 1 and short.cfg.vocab_size == QWEN.vocab_size  # (203 rows < 256)
    assert short.layers[0] is model.layers[0] and len(model.layers) == 2  # the same tensors; the model untouched
    cpp_s, pytorch_s = cpu_step.time_steps(model)
    assert 0 < cpp_s < 1 and 0 < pytorch_s < 1
