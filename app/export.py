"""Export a session: the window and each plot as PNG and SVG (pyqtgraph's exporters for the plots,
QtSvg for the window), every step as CSV, and a one-page Markdown report — what ran on what, when
each setting changed, the decode figures per setting, and the pictures."""
from __future__ import annotations

import csv
import datetime
import math
from pathlib import Path

import numpy as np
import pyqtgraph.exporters as pg_exporters
from PySide6.QtCore import QPoint, QRect, QSize
from PySide6.QtGui import QPainter
from PySide6.QtSvg import QSvgGenerator

from app.i18n import translate

PLOT_PNG_WIDTH = 1600
CSV_COLUMNS = (("step", "x"), ("t_s", "t_s"), ("start_s", "start_s"), ("tokens_per_s", "tokens_per_s"),
               ("ceiling_tokens_per_s", "ceiling_tps"), ("roofline_tokens_per_s", "roof_tps"),
               ("achieved_gbs", "gbs"), ("flops_per_s", "flops"), ("mfu_pct", "mfu_pct"),
               ("arithmetic_intensity", "ai"), ("step_ms", "step_ms"), ("peak_flops", "peak_flops"),
               ("peak_bandwidth_bps", "peak_bps"))


def export_plot(view, path: str | Path) -> Path:
    """One plot (an app.plots PlotView) as .png or .svg, by the path's suffix."""
    path = Path(path)
    if path.suffix.lower() == ".svg":
        try:
            pg_exporters.SVGExporter(view.plot).export(str(path))
        except ValueError:  # pyqtgraph 0.14's exporter cannot rewrite some paths' coordinates: Qt's own SVG
            _render_svg(view, path)
        return path
    if path.suffix.lower() == ".png":
        exporter = pg_exporters.ImageExporter(view.plot)
        exporter.parameters()["width"] = PLOT_PNG_WIDTH
    else:
        raise ValueError(f"{path}: export a plot as .png or .svg")
    exporter.export(str(path))
    return path


def export_window(window, path: str | Path) -> Path:
    """The whole window as .png or .svg."""
    path = Path(path)
    window.plots.refresh(force=True)
    if path.suffix.lower() == ".png":
        if not window.grab().save(str(path), "PNG"):
            raise OSError(f"could not write {path}")
    elif path.suffix.lower() == ".svg":
        _render_svg(window, path)
    else:
        raise ValueError(f"{path}: export the window as .png or .svg")
    return path


def _render_svg(widget, path: Path) -> None:
    """A widget drawn into an SVG file by Qt (vector where the widget paints vectors)."""
    generator = QSvgGenerator()
    generator.setFileName(str(path))
    generator.setSize(QSize(widget.width(), widget.height()))
    generator.setViewBox(QRect(0, 0, widget.width(), widget.height()))
    generator.setTitle(widget.windowTitle() or "membound")
    painter = QPainter(generator)
    widget.render(painter, QPoint(0, 0))
    painter.end()


def write_steps_csv(data, path: str | Path) -> Path:
    """Every step in the ring buffer: its phase and settings label, then the plotted figures and what
    its compute roof is of."""
    path = Path(path)
    steps = data.steps
    columns = {name: steps.column(source) for name, source in CSV_COLUMNS}
    prefill, mixed, labels = steps.column("prefill"), steps.column("mixed"), steps.column("label")
    kinds = steps.column("peak_kind")
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["step", "phase", "settings"] + [name for name, _ in CSV_COLUMNS[1:]] + ["peak_flops_of"])
        for i in range(len(steps)):
            phase = "mixed" if mixed[i] > 0.5 else "prefill" if prefill[i] > 0.5 else "decode"
            label = data.labels[int(labels[i])] if math.isfinite(labels[i]) else ""
            row = [int(columns["step"][i]), phase, label]
            row += ["" if not math.isfinite(columns[name][i]) else repr(float(columns[name][i]))
                    for name, _ in CSV_COLUMNS[1:]]
            row.append(data.peak_kinds[int(kinds[i])] if math.isfinite(kinds[i]) else "")  # "fp32", "int8/int16 dots + fp32"
            writer.writerow(row)
    return path


def decode_summary(data) -> list[dict]:
    """Per settings label, over its decode steps: medians of tokens/s, ceiling and GB/s, MBU, MFU."""
    steps = data.steps
    decode = steps.column("prefill") < 0.5
    labels = steps.column("label")
    rows = []
    for code, label in enumerate(data.labels):
        mask = decode & (labels == code)
        if not mask.any():
            continue
        gbs, peak_gbs = steps.column("gbs")[mask], steps.column("peak_bps")[mask] / 1e9
        mfu = steps.column("mfu_pct")[mask]
        rows.append({"settings": label, "steps": int(mask.sum()),
                     "tokens_per_s": float(np.median(steps.column("tokens_per_s")[mask])),
                     "ceiling_tokens_per_s": float(np.median(steps.column("ceiling_tps")[mask])),
                     "gbs": float(np.median(gbs)), "mbu_pct": float(np.median(100 * gbs / peak_gbs)),
                     "mfu_pct": float(np.nanmedian(mfu)) if np.isfinite(mfu).any() else math.nan})
    return rows


def report_markdown(window, pictures: dict[str, str], replay: str = "") -> str:
    data, info = window.data, window.model_info
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = ["# " + translate("Report", "membound session report ({date})").format(date=now), ""]
    if replay:
        lines += [translate("Report", "From a replay: {file}.").format(file=replay), ""]
    if info is not None:
        spec = info.hardware
        params = info.cfg.n_params
        lines += ["- " + translate("Report", "Model: {model}, {params} M parameters, on {device}").format(
                      model=info.label, params=f"{params / 1e6:,.0f}", device=info.device),
                  "- " + translate("Report", "Hardware: {name} — {source}; peak bandwidth {gbs} GB/s").format(
                      name=spec.name, source=spec.source, gbs=f"{spec.peak_bandwidth_gbs:,.1f}"),
                  "- " + translate("Report", "Steps recorded: {n}").format(n=f"{data.steps.total:,}"), ""]
    lines += ["## " + translate("Report", "Settings timeline"), "",
              translate("Report", "| step | s | change | settings from here |"), "|---:|---:|---|---|"]
    t_first = data.steps.column("start_s")[:1]
    t0 = float(t_first[0]) if len(t_first) else (data.annotations[0].t_s if data.annotations else 0.0)
    for note in data.annotations:
        lines.append(f"| {note.x:.0f} | {note.t_s - t0:,.1f} | {note.text} | {note.label} |")
    lines += ["", "## " + translate("Report", "Decode, per setting (medians over its steps)"), "",
              translate("Report", "| settings | steps | tokens/s | ceiling tokens/s | GB/s | MBU | MFU |"),
              "|---|---:|---:|---:|---:|---:|---:|"]
    for row in decode_summary(data):
        mfu = f"{row['mfu_pct']:.1f}%" if math.isfinite(row["mfu_pct"]) else "–"
        lines.append(f"| {row['settings']} | {row['steps']} | {row['tokens_per_s']:,.1f} | "
                     f"{row['ceiling_tokens_per_s']:,.0f} | {row['gbs']:,.2f} | {row['mbu_pct']:.0f}% | {mfu} |")
    lines += ["", translate("Report", "GB/s, MBU and MFU are the cost model's bytes and FLOPs over the measured step "
                                      "time (engine/metrics.py); the ceiling is peak bandwidth ÷ bytes per token."),
              "", "## " + translate("Report", "Plots"), ""]
    for title, file in pictures.items():
        lines += [f"### {title}", "", f"![{title}]({file})", ""]
    return "\n".join(lines)


def export_session(window, folder: str | Path, replay: str = "") -> list[Path]:
    """Everything, into `folder` (made if needed): window.png/.svg, plot-NAME.png/.svg, steps.csv,
    report.md. Returns the files written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    window.plots.refresh(force=True)
    window.plots.update_readouts(force=True)
    written = [export_window(window, folder / "window.png"), export_window(window, folder / "window.svg")]
    pictures = {translate("Report", "The window"): "window.png"}
    for name, view in window.plots.views.items():
        for suffix in ("png", "svg"):
            written.append(export_plot(view, folder / f"plot-{name}.{suffix}"))
        pictures[translate("Plots", view.title)] = f"plot-{name}.png"
    written.append(write_steps_csv(window.data, folder / "steps.csv"))
    report = folder / "report.md"
    report.write_text(report_markdown(window, pictures, replay), encoding="utf-8")
    written.append(report)
    return written
