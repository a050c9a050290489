"""engine/hardware/roof.py, engine/hardware/probe.py and kernels/cpu_roof.cpp: the CPU's roofs probed in C++, cached once per
machine with their date and method, measured again on demand or on other hardware; the one `Roof`
policy every front end takes a step's peak from."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from engine.hardware import probe as roofs
from engine.hardware.probe import cpu_roof
from engine.hardware.roof import MeasuredRoof, Roof, above_roof, knee_curve, roof_line
from engine.hardware.spec import DeviceSpec
from kernels import cpu_roof as probe


@pytest.fixture
def roof_cache(tmp_path, monkeypatch):
    path = tmp_path / "roof.json"
    monkeypatch.setenv("MEMBOUND_ROOF_CACHE", str(path))
    return path


def fake_record(machine: str, read_gbs: float = 12.0) -> MeasuredRoof:
    return MeasuredRoof(machine=machine, measured_at="2025-01-31 14:05", method="a test", threads=2,
                        llc_bytes=32 << 20, read_gbs=read_gbs, read_gbs_by_size={"128 MiB": read_gbs},
                        cache_read_gbs=100.0, flops={"fp32": 1e11}, flops_method={"fp32": "FMA loop"})


def test_the_roof_is_measured_once_and_read_from_the_cache_after(roof_cache, monkeypatch):
    calls = []
    monkeypatch.setattr(roofs, "measure_cpu_roof", lambda threads, progress: calls.append(threads) or
                        fake_record(roofs.machine_fingerprint(threads)))
    first = cpu_roof()
    assert calls == [torch.get_num_threads()] and roof_cache.exists()
    assert cpu_roof() == first and len(calls) == 1  # cached: the same figures, no probe
    data = json.loads(roof_cache.read_text())
    assert data[first.machine]["measured_at"] == "2025-01-31 14:05" and data[first.machine]["method"] == "a test"
    cpu_roof(remeasure=True)  # on demand (membound roof --measure)
    assert len(calls) == 2


def test_other_hardware_measures_again(roof_cache, monkeypatch):
    measured = []
    monkeypatch.setattr(roofs, "measure_cpu_roof", lambda threads, progress: measured.append(1) or
                        fake_record(roofs.machine_fingerprint(threads)))
    cpu_roof()
    monkeypatch.setattr(roofs, "llc_bytes", lambda: 260 << 20)  # another CPU: its fingerprint differs
    cpu_roof()
    assert len(measured) == 2 and len(json.loads(roof_cache.read_text())) == 2


def test_a_corrupt_cache_is_measured_over(roof_cache, monkeypatch):
    roof_cache.write_text("{not json")
    monkeypatch.setattr(roofs, "measure_cpu_roof", lambda threads, progress: fake_record(
        roofs.machine_fingerprint(threads), 9.0))
    assert cpu_roof().read_gbs == 9.0 and json.loads(roof_cache.read_text())


def test_the_cpp_read_probe_reads_every_byte_and_the_cache_faster_than_memory():
    threads = 1  # one thread: on a busy shared machine a second one's barrier waits swamp a short pass
    llc = roofs.llc_bytes()
    big = torch.ones(4 * llc // 4)
    # the smallest size the cache probe reads: an eighth of sysfs's L3 can be the memory's rate (a guest
    # shown the host's 480 MiB L3 read 240 MiB at 15.9 GB/s on one thread, like 2 GiB; 30 MiB at 29.8)
    small = torch.ones(min(roofs.cache_sizes(llc, roofs.l2_bytes())) // 4)
    memory_s = probe.read_best_s(big, 3, threads)
    cache_s = probe.read_best_s(small, 50, threads)
    assert memory_s > 0 and cache_s > 0
    assert small.nbytes / cache_s > big.nbytes / memory_s  # a read that fits the cache streams faster


def test_the_fma_probe_counts_its_flops():
    threads = torch.get_num_threads()
    rate = probe.fma_flops(threads, iters=200_000, repeats=3)
    assert 1e8 < rate < 1e13  # a 2-core VM to a big server, per the 2 * lanes * chains * iters count


def built_probe(march: str, tmp_path):
    """kernels/cpu_roof.cpp built for another x86 level than this machine's own (ctypes, typed)."""
    import ctypes
    import subprocess
    from kernels.cpu_decode import FLAGS
    flags = [f if not f.startswith("-march") else f"-march={march}" for f in FLAGS]
    out = tmp_path / f"roof-{march}.so"
    subprocess.run(["g++", *flags, str(probe.SOURCE), "-o", str(out)], check=True, capture_output=True, timeout=120)
    lib = ctypes.CDLL(str(out))
    lib.membound_int_dot_best_s.restype = lib.membound_fma_best_s.restype = ctypes.c_double
    lib.membound_int_dot_best_s.argtypes = [ctypes.c_int64] * 4 + [ctypes.POINTER(ctypes.c_float)]
    lib.membound_fma_best_s.argtypes = [ctypes.c_int64] * 3 + [ctypes.POINTER(ctypes.c_float)]
    lib.membound_int_dot_flops_per_iter.restype = lib.membound_roof_lanes.restype = ctypes.c_int64
    lib.membound_int_dot_flops_per_iter.argtypes = [ctypes.c_int64]
    return lib


@pytest.mark.parametrize("march", ["native", "x86-64-v3", "x86-64-v4"])  # VNNI here; AVX2; AVX-512 without VNNI
def test_the_integer_dot_probes_time_their_products_at_every_x86_level(march, tmp_path):
    """An integer dot product multiplies at most 4x the multiply-adds of an FMA of its width (four
    bytes a lane) and an int16 pair dot 2x: a rate beyond that is a loop that did not multiply (GCC
    hoisted vpmaddubsw out of a loop of `acc + maddubs(w, x)`: AVX2 "int8" read 10.7x its FMA rate)."""
    import ctypes
    if "avx2" not in open("/proc/cpuinfo").read():
        pytest.fail("the x86 levels are built and run here (this project's CI machines have AVX2 and AVX-512)")
    lib = built_probe(march, tmp_path)
    sink, iters = ctypes.c_float(), 200_000
    fma = 2 * lib.membound_roof_lanes() * probe.CHAINS * iters / lib.membound_fma_best_s(iters, 5, 1, ctypes.byref(sink))
    for bits, most in ((8, 4), (16, 2)):
        per_iter = lib.membound_int_dot_flops_per_iter(bits)
        assert per_iter == 2 * most * lib.membound_roof_lanes() * probe.CHAINS  # the instruction's multiply-adds
        rate = per_iter * iters / lib.membound_int_dot_best_s(bits, iters, 5, 1, ctypes.byref(sink))
        assert 0.3 * fma < rate < 1.25 * most * fma, f"{march} int{bits}: {rate / fma:.2f}x the FMA rate"


def test_the_integer_dot_probe_says_where_a_machine_has_none(tmp_path):
    lib = built_probe("x86-64", tmp_path)  # SSE2: no integer dot product the decode step uses
    sink = __import__("ctypes").c_float()
    assert lib.membound_int_dot_flops_per_iter(8) == lib.membound_int_dot_flops_per_iter(16) == 0
    assert lib.membound_int_dot_best_s(8, 10, 1, 1, sink) < 0


@pytest.mark.parametrize("march", ["armv8-a", "armv8.2-a+dotprod"])
def test_the_roof_probe_builds_clean_for_aarch64(march, tmp_path):
    import os
    import shutil
    import subprocess
    if not shutil.which("aarch64-linux-gnu-g++"):
        if os.environ.get("CI"):
            pytest.fail("CI must build the aarch64 probe: no aarch64-linux-gnu-g++")
        pytest.skip("no aarch64-linux-gnu-g++ here (apt-get install g++-aarch64-linux-gnu)")
    done = subprocess.run(["aarch64-linux-gnu-g++", "-O3", f"-march={march}", "-fopenmp", "-shared", "-fPIC", "-std=c++17",
                           "-Wall", "-Wextra", "-Werror", str(probe.SOURCE), "-o", str(tmp_path / "roof.so")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_steps_compute_roof_is_its_parts_each_at_its_own_peak():
    from engine.metrics import StepCost
    roof = Roof(bandwidth_bps=50e9, flops={"fp32": 1e11, "bf16": 2e11, "int8": 4e11, "int16": 2e11})
    # an INT4 step: layers' products as int8 dots, the INT8 head's as int16 pairs, attention at fp32
    cost = StepCost(flops=10 * 10**9, matmul_flops=9 * 10**9, head_flops=10**9, attention_flops=10**9)
    seconds = 8e9 / 4e11 + 1e9 / 2e11 + 1e9 / 1e11
    assert roof.step_flops_peak(cost, "fp32", ("int8", "int16")) == pytest.approx(10e9 / seconds)
    assert roof.step_flops_peak(cost, "fp32") == 1e11  # no products named: the activations' rate
    assert roof.step_flops_peak(cost, "bf16", ("bf16", "bf16")) == pytest.approx(10e9 / (9e9 / 2e11 + 1e9 / 2e11))
    plain = Roof(bandwidth_bps=50e9, flops={"fp32": 1e11})  # a probe with no integer dots: the float rate
    assert plain.step_flops_peak(cost, "fp32", ("int8", "int16")) == pytest.approx(1e11)


def test_the_roof_chooses_the_cache_roof_only_for_a_step_that_fits_it():
    spec = DeviceSpec(name="cpu", kind="cpu", peak_bandwidth_gbs=20.0, peak_flops={"fp32": 1e11},
                      cache_bandwidth_gbs=200.0, cache_bytes=32 << 20)
    roof = Roof.of(spec)
    assert roof.level_for(10 << 20) == "cache" and roof.bandwidth_for(10 << 20) == 200e9
    assert roof.level_for(540e6) == "memory" and roof.bandwidth_for(540e6) == 20e9
    plain = Roof.of(DeviceSpec(name="cpu", kind="cpu", peak_bandwidth_gbs=20.0))
    assert plain.level_for(1) == "memory" and plain.flops_for("bf16") != plain.flops_for("bf16")  # nan: unknown
    assert roof.flops_for("bf16") == 1e11  # fp32 stands in


def test_above_the_roof_beyond_the_probes_noise():
    assert not above_roof(1.0, 0.5) and not above_roof(1.01, float("nan"))
    assert above_roof(1.10, 0.2) and above_roof(0.5, 2.77)


def test_membound_roof_prints_the_cached_roof_and_measures_on_demand(roof_cache, monkeypatch, capsys):
    from engine.cli import main
    measured = []
    monkeypatch.setattr(roofs, "measure_cpu_roof", lambda threads, progress: measured.append(1) or
                        fake_record(roofs.machine_fingerprint(threads)))
    assert main(["roof"]) == 0 and main(["roof"]) == 0 and len(measured) == 1
    out = capsys.readouterr().out
    assert "read 12.0 GB/s" in out and "measured 2025-01-31 14:05 by a test" in out and str(roof_cache) in out
    assert main(["roof", "--measure"]) == 0 and len(measured) == 2


def test_the_read_probe_s_buffer_is_touched_aligned_and_says_how_much_sits_on_huge_pages():
    buffer, huge = probe.read_buffer(8 << 20)
    assert buffer.numel() == (8 << 20) // 4 and bool((buffer == 1.0).all())  # every page faulted in before a pass
    assert buffer.data_ptr() % probe.HUGE_PAGE_BYTES == 0  # 2 MiB aligned: whole huge pages, none split
    assert huge is None or 0.0 <= huge <= 1.0
    plain = torch.ones(1 << 20)  # PyTorch's allocator: 4 KiB pages where the kernel's THP is madvise-only
    assert probe.huge_page_fraction(plain.data_ptr(), plain.nbytes) in (None, 0.0) or huge is not None
    assert probe.huge_page_fraction(0, 1) is None  # no mapping holds it


def test_a_roof_cached_by_an_older_probe_method_is_measured_again(roof_cache, monkeypatch):
    measured = []
    monkeypatch.setattr(roofs, "measure_cpu_roof", lambda threads, progress: measured.append(1) or
                        fake_record(roofs.machine_fingerprint(threads)))
    old = roofs.machine_fingerprint(torch.get_num_threads()).replace(f" | {roofs.PROBE_METHOD}", "")
    roof_cache.write_text(json.dumps({old: fake_record(old, 3.0).to_dict()}))  # the 4 KiB-page probe's record
    assert cpu_roof().read_gbs == 12.0 and measured == [1]


def test_the_measured_roof_is_the_best_round_and_says_its_spread(monkeypatch):
    reads = iter([1.0, 1.0, 0.5, 0.5, 0.8, 0.8, 1.0, 1.0, 1.0, 1.0] + [1.0] * 10)  # seconds a pass, per size per round
    monkeypatch.setattr(probe, "read_best_s", lambda buffer, passes, threads: next(reads) * buffer.nbytes / 1e9)
    monkeypatch.setattr(probe, "read_buffer", lambda n: (torch.empty(n // 4), 1.0))
    monkeypatch.setattr(probe, "fma_flops", lambda threads: 1e11)
    monkeypatch.setattr(probe, "bf16_flops", lambda threads: None)
    monkeypatch.setattr(probe, "int_dot_flops", lambda kind, threads: {"int8": 4e11}.get(kind))
    monkeypatch.setattr(roofs, "measure_matmul_flops", lambda *a, **k: 1.0)
    monkeypatch.setattr(roofs, "READ_ROUND_GAP_S", 0.0)
    monkeypatch.setattr(roofs, "llc_bytes", lambda: 32 << 20)  # two sizes (512 MiB, 1 GiB), whatever this machine's
    monkeypatch.setattr(roofs, "_ram_total_bytes", lambda: 24 << 30)
    record = roofs.measure_cpu_roof(2, lambda message: None)
    assert list(record.read_gbs_by_size) == ["512 MiB", "1024 MiB"]
    assert record.read_gbs == pytest.approx(2.0) and record.read_gbs_rounds == [1.0, 2.0, 1.25, 1.0, 1.0]
    assert "2 MiB pages" in record.method and "rounds 1.0–2.0" in record.describe()
    assert record.flops["int8"] == 4e11 and "int16" not in record.flops  # a kind the machine lacks: none
    assert "int8 0.400 TFLOP/s (int8 dot loop)" in record.describe()


def test_a_roof_measured_while_the_machine_was_busy_is_measured_again_once_it_is_quiet(roof_cache, monkeypatch):
    measured = []
    fresh = replace(fake_record(roofs.machine_fingerprint(torch.get_num_threads()), 36.0), load_average=0.2)
    monkeypatch.setattr(roofs, "measure_cpu_roof", lambda threads, progress: measured.append(1) or fresh)
    monkeypatch.setattr(roofs.os, "cpu_count", lambda: 2)
    busy = replace(fresh, read_gbs=8.9, load_average=3.1)  # another job beside the probe: it read low
    roof_cache.write_text(json.dumps({busy.machine: busy.to_dict()}))
    monkeypatch.setattr(roofs, "quiet_now", lambda: False)  # still busy: the busy record, no probe at every start
    assert cpu_roof().read_gbs == 8.9 and measured == []
    monkeypatch.setattr(roofs, "quiet_now", lambda: True)  # quiet now: measured again, and kept
    assert cpu_roof().read_gbs == 36.0 and measured == [1]
    assert cpu_roof().read_gbs == 36.0 and measured == [1]
    assert roofs.measured_busy(busy) and not roofs.measured_busy(fresh) and not roofs.measured_busy(fake_record("m"))
    # what ran beside the probe, when /proc/stat says it, decides over the load average (which lags a minute)
    assert not roofs.measured_busy(replace(busy, other_cores=0.05)) and roofs.measured_busy(replace(fresh, other_cores=0.6))


def test_other_processes_cpu_time_is_counted_apart_from_the_probe_s_own(monkeypatch):
    monkeypatch.setattr(roofs.os, "cpu_count", lambda: 2)
    # (machine busy ticks, machine ticks, this process's ticks): 200 ticks of 2 cores, 120 busy, 100 of them ours
    assert roofs.other_cores_between((1000, 5000, 300), (1120, 5200, 400)) == pytest.approx(0.2)
    assert roofs.other_cores_between((1000, 5000, 300), (1180, 5200, 400)) == pytest.approx(0.8)
    assert roofs.other_cores_between(None, (1, 2, 3)) is None
    ticks = roofs.cpu_ticks()  # this machine's: busy <= all, and this process has run
    assert ticks is not None and 0 <= ticks[0] <= ticks[1] and ticks[2] > 0
    monkeypatch.setattr(roofs, "cpu_ticks", iter([(1000, 5000, 300), (1120, 5200, 400)]).__next__)
    assert roofs.quiet_now(0.0)  # 0.2 cores beside it
    monkeypatch.setattr(roofs, "cpu_ticks", iter([(1000, 5000, 300), (1180, 5200, 400)]).__next__)
    assert not roofs.quiet_now(0.0)


def test_the_read_probe_s_sizes_stay_past_the_cache_within_an_eighth_of_the_ram():
    MiB, GiB = 1 << 20, 1 << 30
    assert roofs.read_sizes(32 * MiB, 24 * GiB) == [512 * MiB, GiB]  # 16x and 32x the cache
    assert roofs.read_sizes(8 * MiB, 24 * GiB) == [256 * MiB]  # both below the floor: one size
    assert roofs.read_sizes(260 * MiB, 128 * GiB) == [4 * GiB]  # both past MAX_READ_BYTES: one of it
    # a 480 MiB L3 in 24 GiB (an Intel Xeon guest here): two sizes would both be capped at 1.5 GiB,
    # 3.2x the cache; one buffer of the whole eighth reads 6.4x past it
    assert roofs.read_sizes(480 * MiB, 24 * GiB) == [3 * GiB]
    for llc in (1 * MiB, 32 * MiB, 260 * MiB, 480 * MiB, 2 * GiB):
        for ram in (4 * GiB, 24 * GiB, 512 * GiB, None):
            sizes = roofs.read_sizes(llc, ram)
            assert sizes and sizes == sorted(set(sizes)) and max(sizes) <= roofs.MAX_READ_BYTES
            assert ram is None or sum(sizes) <= ram // 8


def test_the_cache_roof_is_the_size_that_read_at_the_cache_s_rate_not_the_size_sysfs_names():
    MiB = 1 << 20
    # this Intel guest: sysfs names a 480 MiB L3; 30-120 MiB read 54-57 GB/s, 240 MiB the memory's 31.6
    assert roofs.cache_sizes(480 * MiB, 4 * MiB) == [240 * MiB, 120 * MiB, 60 * MiB, 30 * MiB]
    reads = {240 * MiB: 31.6, 120 * MiB: 54.1, 60 * MiB: 56.7, 30 * MiB: 57.0}
    assert roofs.cache_roof(reads, 31.1) == (57.0, 120 * MiB)  # a 274 MB bf16 step is not under it
    assert roofs.cache_roof({16 * MiB: 33.0, 8 * MiB: 34.0}, 31.1) == (34.0, None)  # no faster than memory
    assert roofs.cache_roof({}, 31.1) == (None, None)
    assert roofs.cache_sizes(32 * MiB, 2 * MiB) == [16 * MiB, 8 * MiB, 4 * MiB]  # never within twice the L2s
    assert roofs.cache_sizes(2 * MiB, 4 * MiB) == [MiB]  # a cache too small to tell from the L2: half of it


def test_the_cache_probe_reads_between_its_halvings_where_the_cache_gives_out():
    MiB = 1 << 20
    # measured here (2 threads): 120 MiB 59.1 GB/s, 130 58.0, 140 53.3, 160 41.7, 200 38.5, 240 36.6, memory 31.3;
    # the int8 step (131 MiB) read 32.4 GB/s "above" the memory roof while a read of its size runs at 58
    ladder = {240 * MiB: 36.6, 120 * MiB: 59.1, 60 * MiB: 59.6, 30 * MiB: 59.0}
    assert roofs.cache_roof(ladder, 31.3) == (59.6, 120 * MiB)
    assert roofs.knee_sizes(ladder, 31.3) == [n * MiB for n in (130, 142, 154, 168, 184, 200, 220)]
    knee = {**ladder, 130 * MiB: 58.0, 142 * MiB: 46.0, 154 * MiB: 42.0, 168 * MiB: 40.9, 184 * MiB: 39.0,
            200 * MiB: 38.5, 220 * MiB: 37.0}
    assert roofs.cache_roof(knee, 31.3) == (59.6, 130 * MiB)
    curve = knee_curve(knee, 31.3, 130 * MiB)  # 240 MiB read faster than memory: no curve's end yet
    assert curve == [(142 * MiB, 46.0), (154 * MiB, 42.0), (168 * MiB, 40.9), (184 * MiB, 39.0),
                     (200 * MiB, 38.5), (220 * MiB, 37.0), (240 * MiB, 36.6)]
    knee = {**knee, 240 * MiB: 31.5}  # read within the probe's noise of the memory's: from there, memory
    curve = knee_curve(knee, 31.3, 130 * MiB)
    assert curve[-2:] == [(220 * MiB, 37.0), (240 * MiB, 31.3)]
    roof = Roof(bandwidth_bps=31.3e9, cache_bandwidth_bps=59.6e9, cache_bytes=130 * MiB,
                cache_knee=tuple((n, gbs * 1e9) for n, gbs in curve))
    # the int8 step (131 MiB): under the cache roof, its 32.4 GB/s 54% of it, not 104% of the memory's
    assert roof.level_for(131 * MiB) == "cache" and roof.bandwidth_for(131 * MiB) == 59.6e9
    # where the cache gives out, the read of the largest size no bigger than the step: an upper bound
    assert roof.bandwidth_for(150 * MiB) == 46.0e9 and roof.bandwidth_for(219 * MiB) == 38.5e9
    assert roof.level_for(240 * MiB) == roof.level_for(274e6) == "memory" and roof.bandwidth_for(274e6) == 31.3e9
    assert roof.level_for(220 * MiB) == "memory" and roof.bandwidth_for(220 * MiB) == 37.0e9  # under 1.2x
    assert Roof(31.3e9, {}, 59.6e9, 130 * MiB).level_for(131 * MiB) == "memory"  # no knee read: as before
    record = replace(fake_record("m"), read_gbs=31.3, cache_read_gbs=59.6, cache_read_bytes=130 * MiB,
                     cache_reads=[[n, gbs] for n, gbs in knee.items()])
    assert record.cache_knee() == curve and "(then 142 MiB 46.0, 154 MiB 42.0" in record.describe()
    assert MeasuredRoof.from_dict(json.loads(json.dumps(record.to_dict()))).cache_knee() == curve
    assert roofs.knee_sizes({240 * MiB: 60.0, 120 * MiB: 61.0}, 31.3) == []  # the largest size still fits
    assert "(then 142 MiB 46.0" in record.describe()


def test_the_cache_probe_reads_past_its_ladder_while_a_size_reads_faster_than_memory():
    MiB = 1 << 20
    # measured here (2 threads, 2026-12-04): 240 MiB 36.6 GB/s, memory 31.7 (a 3013 MiB read); the bf16
    # step (274 MB) read 33.9 GB/s, "107% of the memory roof", the fp32 step (547 MB) 32.4, "102%"
    ladder = {240 * MiB: 36.6, 120 * MiB: 59.1, 60 * MiB: 59.6, 30 * MiB: 59.0}
    assert roofs.next_past_size(ladder, 31.7, 3013 * MiB) == 480 * MiB
    assert roofs.next_past_size({**ladder, 480 * MiB: 33.9}, 31.7, 3013 * MiB) == 960 * MiB
    assert roofs.next_past_size({**ladder, 480 * MiB: 32.0}, 31.7, 3013 * MiB) is None  # memory's, within 2%
    assert roofs.next_past_size({**ladder, 480 * MiB: 33.9, 960 * MiB: 33.0, 1920 * MiB: 32.9}, 31.7,
                                3013 * MiB) is None  # no bigger than the read probe's own buffer
    assert roofs.next_past_size({240 * MiB: 36.6, 120 * MiB: 37.0}, 31.7, 3013 * MiB) is None  # no cache roof
    reads = {**ladder, 480 * MiB: 33.9, 960 * MiB: 32.1}
    fit = roofs.cache_roof(reads, 31.7)[1]
    record = replace(fake_record("m"), read_gbs=31.7, cache_read_gbs=59.6, cache_read_bytes=fit,
                     cache_reads=[[n, gbs] for n, gbs in reads.items()])
    roof = Roof(bandwidth_bps=31.7e9, cache_bandwidth_bps=59.6e9, cache_bytes=fit,
                cache_knee=tuple((n, gbs * 1e9) for n, gbs in record.cache_knee()))
    # bf16 under the 240 MiB read, fp32 under the 480 MiB read: both under 100%, both "memory"-level
    assert roof.bandwidth_for(274e6) == 36.6e9 and 33.9e9 / roof.bandwidth_for(274e6) < 1
    assert roof.bandwidth_for(547e6) == 33.9e9 and 32.4e9 / roof.bandwidth_for(547e6) < 1
    assert roof.level_for(274e6) == roof.level_for(547e6) == "memory"
    assert roof.bandwidth_for(1100 * MiB) == 31.7e9  # past the read back at the memory's rate
    spec = DeviceSpec(name="cpu", kind="cpu", peak_bandwidth_gbs=31.7, measured_bandwidth_gbs=31.7,
                      cache_bandwidth_gbs=59.6, cache_bytes=fit, cache_knee=tuple(record.cache_knee()))
    assert "(the roof of a step of up to 120 MiB; to 960 MiB, a read of the step's size)" in roof_line(spec)
    assert roofs.knee_sizes({16 * MiB: 33.0, 8 * MiB: 34.0}, 31.1) == []  # no size read faster than memory


def test_the_device_has_a_cache_roof_only_for_the_bytes_that_read_at_its_rate(roof_cache, monkeypatch):
    from engine.hardware import detect
    fits = replace(fake_record(roofs.machine_fingerprint(torch.get_num_threads())), cache_read_bytes=120 << 20)
    for record, gbs, size in ((fits, 100.0, 120 << 20), (replace(fits, cache_read_bytes=None), None, None)):
        monkeypatch.setattr(detect, "cpu_roof", lambda remeasure, progress, record=record: record)
        spec = detect._detect_cpu(True, lambda message: None)
        assert (spec.cache_bandwidth_gbs, spec.cache_bytes) == (gbs, size)
        roof = Roof.of(spec)
        assert roof.level_for(274e6) == "memory" and roof.level_for(100e6) == ("cache" if gbs else "memory")
    assert "read 100.0 GB/s up to 120 MiB" in fits.describe()


def test_the_bench_measures_each_decode_step_against_the_roof_it_sits_under():
    # the int4 step of this Intel guest: ~100 MB a token, under its 120 MiB cache roof (56 GB/s), not the
    # 31 GB/s memory roof the bench once put every column against (and its ceiling against the cache's)
    from types import SimpleNamespace
    from engine.bench.single import summarise
    roof = Roof(bandwidth_bps=31e9, flops={"fp32": 1e12}, cache_bandwidth_bps=56e9, cache_bytes=120 << 20)

    def step(nbytes, phase="decode"):
        return SimpleNamespace(phase=phase, step_s=0.004, total_bytes=nbytes, flops=1e8, new_tokens=1,
                               peak_bandwidth_bps=roof.bandwidth_for(nbytes), peak_flops=1e12,
                               roof=roof.level_for(nbytes))
    int4 = summarise("int4", [step(100e6, "prefill")], [step(100e6)] * 4, 0.01)
    assert int4.roof == "cache" and int4.peak_gbs == pytest.approx(56.0)
    assert int4.mbu == pytest.approx(25.0 / 56.0) and int4.predicted_ceiling_tokens_per_s == pytest.approx(560.0)
    bf16 = summarise("bf16", [step(274e6, "prefill")], [step(274e6)] * 4, 0.01)
    assert bf16.roof == "memory" and bf16.mbu == pytest.approx(68.5 / 31.0)
    both = summarise("both", [step(100e6, "prefill")], [step(100e6), step(274e6)], 0.01)
    assert both.roof == "memory + cache" and both.mbu == pytest.approx(both.decode_achieved_gbs / both.peak_gbs)
