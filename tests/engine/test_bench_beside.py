"""The CPU benches' read beside each timed run (engine/bench/beside.py): the memory read just before
and after, and the run's MBU against it, shown where it was measured and nowhere else."""
from dataclasses import replace
from types import SimpleNamespace

from engine.bench.beside import ReadBeside, step_bytes, with_read_beside
from engine.bench.run import format_sweep, format_table
from engine.bench.single import BenchResult, timed_run
from tests.engine.test_quant import tiny_engine


def result(achieved_gbs: float = 30.0, roof: str = "memory") -> BenchResult:
    return BenchResult("membound", 16, 4, 100.0, 50.0, 0.01, achieved_gbs, 50.0, achieved_gbs / 50.0, 0.01, 90.0,
                       6e8, roof=roof)


class CountingRead:
    def __init__(self, reads):
        self.reads, self.calls, self.sizes = list(reads), 0, []

    def read_gbs(self, n_bytes: int) -> float:
        self.sizes.append(n_bytes)
        self.calls += 1
        return self.reads.pop(0)


def test_mbu_beside_is_the_runs_bandwidth_over_the_mean_of_the_reads_around_it():
    got = with_read_beside(result(30.0), 40.0, 60.0)
    assert got.read_beside_gbs == (40.0, 60.0)
    assert abs(got.mbu_beside - 0.6) < 1e-12
    assert got.mbu == result(30.0).mbu  # against the cached roof, unchanged
    assert with_read_beside(result(30.0), None, 60.0) == result(30.0)  # no buffer to read: the run as it was



def test_a_timed_run_reads_memory_once_before_and_once_after():
    eng = tiny_engine()
    reads = CountingRead([41.0, 63.0])
    got, steps, paths = timed_run(eng, list(range(1, 17)), 4, reads)
    assert reads.calls == 2 and got.read_beside_gbs == (41.0, 63.0)
    assert reads.sizes[0] == reads.sizes[1] == step_bytes(eng)  # a read of the step's own bytes
    assert abs(step_bytes(eng) - got.decode_bytes_per_token) < 0.2 * got.decode_bytes_per_token  # (and its KV)
    assert got.decode_tokens == 4 and paths["run_s"] > 0
    plain, _, _ = timed_run(eng, list(range(1, 17)), 4)
    assert plain.read_beside_gbs is None and plain.mbu_beside is None


def test_the_tables_show_the_read_beside_only_where_it_was_measured():
    measured = with_read_beside(result(30.0), 40.0, 60.0)
    rows = {line[:24].strip(): line[24:].split() for line in format_table([measured]).splitlines()[1:]}
    assert rows["read before / after GB/s"] == ["40.0", "/", "60.0"]
    assert rows["MBU beside the run"] == ["60.0%"]
    for table in (format_table([result()]), format_sweep([result(), replace(result(), name="int4")], {})):
        assert "beside" not in table and "before / after" not in table  # a GPU's (or an old) table as it was
    sweep = format_sweep([measured, replace(result(), name="peer")], {}, peers=1)
    assert "MBU beside the run" in sweep and "60.0%" in sweep


def test_a_cpu_engine_gets_a_read_beside_and_a_gpu_none():
    assert ReadBeside.for_engine(SimpleNamespace(hardware=SimpleNamespace(kind="cuda"))) is None
    beside = ReadBeside.for_engine(tiny_engine())
    assert beside is not None and beside.threads >= 1
    assert 0.1 < beside.read_gbs(3 << 20) < 10_000  # GB/s of a real read
    assert [n for n in beside._held] == [4 << 20]  # rounded up to 2 MiB pages, kept for the next read
    beside.read_gbs(4 << 20)
    assert len(beside._held) == 1

    def no_room(n_bytes):
        raise MemoryError
    beside._probe = SimpleNamespace(read_buffer=no_room)
    assert beside.read_gbs(64 << 20) is None  # a machine that cannot spare the buffer: no figure, no traceback
