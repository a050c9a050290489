"""The C++ step's products of several token rows ask for the next block's lines while they compute.

Each block of weight rows prefetches the same columns of a block further on (kernels/cpu_decode.cpp
`ahead_due`, `prefetch_rows`): the hardware prefetchers lose four short rows read side by side. From
session 8 to 24 that code sat in a struct's member function, and GCC 12 compiled every one of its
prefetches away: the fp32 and bf16 products of 2..64 token rows read memory with no prefetch at all,
which is why a batch of 2 took 1.5-1.8x the time of one row (docs/benchmarks.md, session 24). No
result changes with a prefetch, so this reads the compiled code: each multi-row block, built for every
level, must hold a prefetch instruction (itself or in what it calls)."""
import os
import re
import subprocess
from pathlib import Path

import pytest

from kernels import cpu_decode
from tests.kernels.test_cpu_decode_builds import cross_tools

PROBE = Path(__file__).with_name("cpu_decode_prefetch_probe.cpp")
X86_PREFETCH = re.compile(r"^\s*prefetch(t0|t1|t2|nta|w)\b")
ARM_PREFETCH = re.compile(r"^\s*prfm\b")
X86_CALL = re.compile(r"^\s*(?:call|jmp)\s+([A-Za-z_][\w.$]*)")
ARM_CALL = re.compile(r"^\s*(?:bl|b)\s+([A-Za-z_][\w.$]*)")
LABEL = re.compile(r"^([A-Za-z_][\w.$]*):")


def functions(asm: str) -> dict[str, list[str]]:
    """Each global or local function of an assembly listing: its lines, label to the next label."""
    found: dict[str, list[str]] = {}
    current = None
    for line in asm.splitlines():
        if (m := LABEL.match(line)) and not m.group(1).startswith(".L"):
            current = found.setdefault(m.group(1), [])
        elif current is not None:
            current.append(line)
    return found


def prefetches(name: str, funcs: dict[str, list[str]], arm: bool, seen: set | None = None) -> int:
    """Prefetch instructions in `name` and in everything it calls or jumps to (recursively)."""
    seen = set() if seen is None else seen
    if name in seen or name not in funcs:
        return 0
    seen.add(name)
    found = 0
    for line in funcs[name]:
        if (ARM_PREFETCH if arm else X86_PREFETCH).match(line):
            found += 1
        elif m := (ARM_CALL if arm else X86_CALL).match(line):
            found += prefetches(m.group(1).removesuffix("@PLT"), funcs, arm, seen)
    return found


def compiled(cxx: str, flags: list[str], tmp_path: Path) -> dict[str, list[str]]:
    out = tmp_path / "probe.s"
    done = subprocess.run([cxx, *flags, "-S", str(PROBE), "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return functions(out.read_text())


def assert_every_block_prefetches(funcs: dict[str, list[str]], arm: bool, expect: set[str]):
    probes = {name for name in funcs if name.startswith("probe_")}
    assert expect <= probes, f"missing probes: {expect - probes}"
    silent = sorted(name for name in probes if prefetches(name, funcs, arm) == 0)
    assert not silent, f"these multi-row blocks ask for no line ahead: {silent}"


@pytest.mark.parametrize("level", ["native", "avx2", "scalar"])
def test_every_multi_row_block_prefetches_at_each_x86_level(level, tmp_path):
    plan = cpu_decode.build_plan(level)  # the compiler and flags the library is built with at this level
    funcs = compiled(plan.compiler, [f for f in plan.flags if f != "-shared"], tmp_path)
    expect = {"probe_f32_g2", "probe_bf16_g2", "probe_i8_g2"}
    features = cpu_decode.cpu_feature_line().split()
    if level == "native" and "avx512f" in features:  # six token rows a pass, and bf16 dot products where it has them
        expect |= {"probe_f32_g4", "probe_f32_g6"} | ({"probe_bf16dot_g2"} if "avx512_bf16" in features else set())
    assert_every_block_prefetches(funcs, arm=False, expect=expect)


@pytest.mark.parametrize("target", ["armv8-a", "armv8.6-a+bf16+dotprod"])
def test_every_multi_row_block_prefetches_on_aarch64(target, tmp_path):
    why = cross_tools()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must read the NEON builds: {why}")
        pytest.skip(f"the NEON builds are not read: {why}")
    funcs = compiled("aarch64-linux-gnu-g++", ["-O3", "-std=c++17", "-fopenmp", f"-march={target}"], tmp_path)
    expect = {"probe_f32_g2", "probe_f32_g4", "probe_f32_g6"}
    if "bf16" in target:
        expect.add("probe_bf16dot_g2")
    assert_every_block_prefetches(funcs, arm=True, expect=expect)


def test_the_reader_finds_a_block_that_asks_for_nothing():
    """The reader itself: a block whose prefetch was compiled away is named (the old code's shape)."""
    asm = "probe_a:\n\tvfmadd231ps %zmm0, %zmm1, %zmm2\n\tjmp helper\nhelper:\n\tprefetcht1 (%rdi)\n\tret\n" \
          "probe_b:\n\tvfmadd231ps %zmm0, %zmm1, %zmm2\n\tret\n"
    funcs = functions(asm)
    assert prefetches("probe_a", funcs, arm=False) == 1 and prefetches("probe_b", funcs, arm=False) == 0
    with pytest.raises(AssertionError, match="probe_b"):
        assert_every_block_prefetches(funcs, arm=False, expect={"probe_a"})
