"""The app's pure parts: ring buffers, axis helpers, setting colours, settings paths and change
labels, and the seed table's arithmetic (engine.ceilings) worked by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest
from app_test_helpers import fake_cpu

from app.controls import CONTROLS, get_field, has_field, with_field
from app.live_data import LiveData
from app.plots.step_plot import x_window
from app.plots.style import nice_ceiling
from app.plots.timeline import merge_bars
from app.ringbuffer import RingBuffer
from app.theme import DARK, LIGHT, SettingColours
from engine.hardware import ceilings
from engine.model.config import ModelConfig
from engine.settings import SamplingParams, Settings, describe_change


def test_ring_buffer_keeps_the_newest_rows_in_order():
    ring = RingBuffer(4, ("x", "y"))
    assert len(ring) == 0 and math.isnan(ring.last("x")) and ring.column("x").size == 0
    for i in range(6):
        ring.append(x=i, y=None if i == 3 else 10 * i)
    assert len(ring) == 4 and ring.total == 6
    assert ring.column("x").tolist() == [2, 3, 4, 5]
    y = ring.column("y")
    assert y[0] == 20 and math.isnan(y[1]) and y[3] == 50 and ring.last("y") == 50
    ring.column("x")[0] = 99  # a copy: plotting code cannot corrupt the buffer
    assert ring.column("x")[0] == 2
    ring.append(x=7)
    assert math.isnan(ring.last("y"))  # a column not given is NaN, not a stale value
    ring.clear()
    assert ring.total == 0 and len(ring.column("y")) == 0
    with pytest.raises(ValueError):
        RingBuffer(0, ("x",))


def test_x_window_jumps_a_quarter_window_at_a_time():
    assert x_window(0, 400) == (-2.0, 50.0) and x_window(60, 400) == (-2.0, 100.0)
    assert x_window(300, 400) == (-2.0, 400.0) and x_window(400, 400) == (-2.0, 400.0)
    assert x_window(401, 400) == (98.0, 500.0)
    assert x_window(499, 400) == (98.0, 500.0)  # no scrolling between jumps
    assert x_window(500, 400) == (198.0, 600.0)
    for n in range(401, 2000, 37):
        lo, hi = x_window(n, 400)
        assert lo < n - 1 <= hi  # the newest step is always in view


@pytest.mark.parametrize("value, expected", [(0.7, 1), (1, 1), (1.01, 2), (3, 5), (7, 10), (0.031, 0.05),
                                             (420, 500), (0, 1), (float("nan"), 1)])
def test_nice_ceiling(value, expected):
    assert nice_ceiling(value) == pytest.approx(expected)


def test_each_setting_keeps_one_colour_and_distinct_settings_differ():
    colours = SettingColours(DARK)
    fp32_on, fp32_off, bf16_on = "fp32 · kv on", "fp32 · kv off", "bf16 · kv on"
    assert colours.colour(fp32_on) == dict(DARK.setting_colours)["fp32"]
    assert colours.colour(fp32_off) == dict(DARK.setting_colours)["kv off"]
    assert colours.colour(bf16_on) == dict(DARK.setting_colours)["bf16"]
    assert colours.colour("bf16 · kv off") not in {colours.colour(x) for x in (fp32_on, fp32_off, bf16_on)}
    assert colours.colour(fp32_on) == colours.colour(fp32_on)
    colours.set_theme(LIGHT)
    assert colours.colour(fp32_on) == dict(LIGHT.setting_colours)["fp32"]


def test_settings_paths_and_change_labels():
    s = Settings()
    assert get_field(s, "sampling.top_p") == 0.95 and has_field(s, "kv_cache") and not has_field(s, "nope")
    t = with_field(with_field(s, "sampling.temperature", 0.2), "kv_cache", False)
    assert t.sampling.temperature == 0.2 and t.kv_cache is False and s.kv_cache is True
    assert describe_change(s, t) == ("kv cache off", "T=0.2 top-p=0.95")
    assert describe_change(s, with_field(s, "dtype", "bf16")) == ("bf16",)
    assert describe_change(s, s) == ()
    fields = [c.field for c in CONTROLS]
    assert {"dtype", "kv_cache", "max_new_tokens", "sampling.temperature", "sampling.top_p"} <= set(fields)


def test_live_data_records_steps_and_annotations():
    from engine.metrics import StepMetrics

    data = LiveData(step_capacity=8)
    data.start_reply(100.0)

    def step(i, phase):
        return StepMetrics(step=i, phase=phase, batch_size=1, new_tokens=10 if phase == "prefill" else 1,
                           tokens_out=1, context_len=0 if phase == "prefill" else 9 + i, step_s=0.01,
                           weight_bytes=10**6, kv_read_bytes=1000, kv_write_bytes=100, other_bytes=0,
                           flops=2 * 10**6, peak_bandwidth_bps=1e9, peak_flops=1e10, t_s=100.0 + 0.01 * (i + 1),
                           settings_label="fp32 · kv on")
    data.add_step(step(0, "prefill"))
    note = data.annotate("kv cache off", "fp32 · kv off", 100.02)
    data.add_step(step(1, "decode"))
    assert note.x == 1.0 and note.label == "fp32 · kv off" and data.labels == ["fp32 · kv on"]
    assert data.ttft_s == pytest.approx(0.01)
    assert data.steps.column("tokens_per_s").tolist() == pytest.approx([1000.0, 100.0])
    assert data.steps.column("ceiling_tps")[1] == pytest.approx(1e9 / (10**6 + 1100))
    v = data.version
    data.clear()
    assert data.version > v and data.steps.total == 0 and data.annotations == []


def test_a_mixed_step_is_neither_a_prefill_marker_nor_on_the_decode_line():
    from engine.metrics import StepMetrics

    data = LiveData(step_capacity=8)
    for i, phase in enumerate(("prefill", "decode", "mixed")):
        data.add_step(StepMetrics(step=i, phase=phase, batch_size=3, new_tokens=2, tokens_out=2, context_len=4,
                                  step_s=0.01, weight_bytes=10**6, kv_read_bytes=0, kv_write_bytes=0, other_bytes=0,
                                  flops=10**6, peak_bandwidth_bps=1e9, peak_flops=1e10, tokens_in=7))
    assert data.steps.column("prefill").tolist() == [1.0, 0.0, 1.0]  # off the decode line: tokens fed/s
    assert data.steps.column("mixed").tolist() == [0.0, 0.0, 1.0]
    assert data.steps.column("tokens_per_s").tolist() == pytest.approx([700.0, 200.0, 700.0])


# ---- engine.ceilings: the seed table --------------------------------------------------------
def test_seed_table_matches_the_formula_by_hand():
    cfg = ModelConfig.from_name("llama3-8b")
    size = ceilings.model_size(cfg)
    # 32 layers of (4096*(4096+2*1024) + 4096*4096 + 3*4096*14336) plus the 128256 x 4096 head
    assert size.read_params == 32 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336) + 128256 * 4096
    h100 = ceilings.gpu_chip("H100 SXM")
    assert (h100.bandwidth_gbs, h100.memory_bytes) == (3350, 80 * 2**30)
    bf16 = ceilings.decode_ceiling(size, h100, "bf16")
    norms = 32 * 2 * 4096 + 4096  # two RMSNorm weights a layer and the final one, read every step too
    assert bf16.fits and bf16.tokens_per_s == pytest.approx(3350e9 / (2 * (size.read_params + norms)))
    assert 200 < bf16.tokens_per_s < 230  # the number every talk quotes: ~215 tok/s
    int4 = ceilings.decode_ceiling(size, h100, "int4")
    # the engine's INT4: 0.5 + 4/32 bytes a layer weight (fp16 scale and min, groups of 32), the head at INT8
    layers, head = 32 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336), 128256 * 4096
    int4_bytes = 0.625 * layers + (head + 4 * 128256) + 2 * norms
    assert int4.tokens_per_s == pytest.approx(3350e9 / int4_bytes)


def test_seed_table_says_oom_where_the_weights_do_not_fit():
    big = ceilings.model_size(ModelConfig.from_name("llama3-70b"))
    chips = [ceilings.gpu_chip(label) for label in ceilings.REFERENCE_GPUS]
    fp16, int8 = ceilings.seed_table([big], chips, "fp16")[0], ceilings.seed_table([big], chips, "int8")[0]
    assert [c.text() for c in fp16] == ["OOM", "OOM", "OOM"]  # 141 GB of weights
    assert all(c.fits and c.tokens_per_s > 0 for c in int8)
    cpu = ceilings.device_chip(fake_cpu())
    assert (cpu.label, cpu.bandwidth_gbs, cpu.source) == ("this CPU", 20.0, "measured")
    assert not ceilings.decode_ceiling(big, cpu, "fp16").fits  # 16 GiB of RAM


def test_tensor_parallel_columns_split_the_weights_and_pay_for_the_all_reduces():
    h100 = ceilings.gpu_chip("H100 SXM")
    assert h100.link_gbs == 900
    big = ceilings.model_size(ModelConfig.from_name("llama3-70b"))
    one = ceilings.decode_ceiling(big, h100, "bf16")
    two, eight = (ceilings.tp_ceiling(big, h100, n, "bf16") for n in (2, 8))
    assert not one.fits and two.fits and eight.fits  # 141 GB: not on one 80 GB GPU, on two
    norms = 80 * 2 * 8192 + 8192  # read every step beside the matmuls (each GPU its half, as counted)
    assert two.weight_bytes_per_token == pytest.approx(2 * (big.read_params + norms) / 2)
    # by hand: each GPU reads its half at 3.35 TB/s; 80 layers x 2 all-reduces of 8192 bf16 values,
    # a ring moving 2(n-1)/n of them one way at 450 GB/s
    step_s = (big.read_params + norms) / 3350e9 + 80 * 2 * (2 * 1 / 2) * 8192 * 2 / 450e9
    assert two.tokens_per_s == pytest.approx(1 / step_s)
    assert 3.5 * two.tokens_per_s < eight.tokens_per_s < 4 * two.tokens_per_s  # the all-reduces cost a little
    slow_link = ceilings.Chip("slow", 3350, 80 * 2**30, "spec", link_gbs=1.0)  # a link 900x slower
    assert ceilings.tp_ceiling(big, slow_link, 8, "bf16").tokens_per_s < 0.5 * eight.tokens_per_s
    huge = ceilings.model_size(ModelConfig.from_name("llama3.1-405b"))  # 811 GB in bf16
    assert not ceilings.tp_ceiling(huge, h100, 8, "bf16").fits and ceilings.tp_ceiling(huge, h100, 8, "int8").fits
    with pytest.raises(ValueError, match="no NVLink"):
        ceilings.tp_ceiling(big, ceilings.gpu_chip("L4"), 2, "bf16")


def test_ceiling_text_is_short():
    cell = ceilings.Ceiling
    assert cell(12345.0, 1, 1, True).text() == "12k" and cell(2.5e6, 1, 1, True).text() == "2.5M"
    assert cell(215.4, 1, 1, True).text() == "215" and cell(3.14, 1, 1, True).text() == "3.1"
    assert cell(None, 1, 1, False).text() == "OOM"


def test_every_datasheet_gpu_has_a_memory_size():
    from engine.hardware.spec import KNOWN_GPUS

    assert {g.label for g in KNOWN_GPUS} <= set(ceilings.GPU_MEMORY_BYTES)


def test_sampling_default_round_trip():
    s = Settings(sampling=SamplingParams(temperature=0.5))
    assert with_field(s, "sampling.top_p", 0.5).sampling == SamplingParams(temperature=0.5, top_p=0.5)
    assert np.isclose(get_field(s, "sampling.temperature"), 0.5)


def test_long_replies_draw_merged_timeline_bars_without_losing_a_spike():
    x0 = np.arange(1000) * 0.01
    ms = np.full(1000, 10.0)
    ms[777] = 90.0
    starts, ends, heights = merge_bars(x0, ms, max_bars=300)
    assert len(starts) <= 300 + 3 and starts[0] == 0 and ends[-1] == pytest.approx(10.0)
    assert heights.max() == 90.0 and np.all(np.diff(starts) > 0)
    same = merge_bars(x0[:50], ms[:50], max_bars=300)
    assert np.array_equal(same[0], x0[:50]) and np.array_equal(same[2], ms[:50])
