"""`membound attach URL --headless --seconds N [--json FILE]`: scrape a server for N seconds, print
one line per scrape and write the series the window would plot (one record per scrape)."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from engine.attach.client import Scraper, normalise_url
from engine.attach.peak import resolve_peak
from engine.attach.series import ScrapeRecord
from engine.attach.servers import SERVERS


def _fmt(value: float, spec: str, unit: str = "") -> str:
    return "–" if not math.isfinite(value) else f"{value:{spec}}{unit}"


def summary_line(record: ScrapeRecord, t0_s: float) -> str:
    """One scrape for the terminal: '  3.0 s  gen 51.2 tok/s · prompt 0.0 tok/s · running 1 · …'."""
    head = f"{record.t_s - t0_s:6.1f} s  "
    if record.status in ("down", "bad answer"):
        return head + f"{record.status}: {record.message}"
    parts = [f"gen {_fmt(record.generation_tokens_per_s, ',.1f')} tok/s",
             f"prompt {_fmt(record.prompt_tokens_per_s, ',.1f')} tok/s"
             + (f" ({record.prompt_tokens_meaning})" if record.prompt_tokens_meaning else ""),
             f"running {_fmt(record.running, '.0f')}", f"waiting {_fmt(record.waiting, '.0f')}"]
    if math.isfinite(record.kv_cache_usage):
        parts.append(f"KV {100 * record.kv_cache_usage:.0f}%")
    if math.isfinite(record.ttft_p50_s):
        parts.append(f"TTFT p50 {1e3 * record.ttft_p50_s:,.0f} ms p95 {_fmt(1e3 * record.ttft_p95_s, ',.0f')} ms")
    if math.isfinite(record.itl_p50_s):
        parts.append(f"ITL p50 {1e3 * record.itl_p50_s:,.1f} ms")
    if math.isfinite(record.gbs):
        parts.append(f"{record.gbs:,.0f} GB/s" + (f" MBU {100 * record.mbu:.0f}%" if math.isfinite(record.mbu) else "")
                     + " (server's estimate)")
    line = head + " · ".join(parts)
    return line + (f"   [{record.status}: {record.message}]" if record.status != "ok" else "")


def run_headless(args, out=None, err=None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    url = normalise_url(args.url)
    if not args.seconds > 0:
        raise ValueError("--seconds must be above 0")
    peak, peak_note = resolve_peak(url, args.gpu)
    scraper = Scraper(url, interval_s=args.interval, peak=peak, api_key=args.api_key)
    records: list[ScrapeRecord] = []
    t0 = scraper.clock()
    print(f"membound attach {url} · scraping every {args.interval:g} s for {args.seconds:g} s · {peak_note}",
          file=err)

    def on_record(record: ScrapeRecord) -> None:
        records.append(record)
        print(summary_line(record, t0), file=out, flush=True)

    scraper.run(args.seconds, on_record)
    kind = scraper.kind
    server = SERVERS.get(kind)
    if server is not None and not any(math.isfinite(r.gbs) for r in records):
        print(f"membound: {server.bytes_hint}", file=err)
    if args.json:
        document = {"url": url, "server": kind or None, "interval_s": args.interval,
                    "peak": None if peak is None else {"label": peak.label, "bandwidth_gbs": peak.bandwidth_gbs,
                                                       "flops": peak.flops, "source": peak.source},
                    "peak_note": peak_note, "bytes_note": server.bytes_hint if server else None,
                    "records": [r.to_dict(t0) for r in records]}
        Path(args.json).write_text(json.dumps(document, indent=1) + "\n")
        print(f"membound: wrote {len(records)} records to {args.json}", file=err)
    if not any(r.status not in ("down", "bad answer") for r in records):
        last = records[-1].message if records else "no scrape"
        print(f"membound: error: no metrics from {url} in {args.seconds:g} s: {last}", file=err)
        return 1
    return 0
