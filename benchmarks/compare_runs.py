"""Compare two result CSVs of ``gper bench`` (or ``gper bench peers``) row by row.

Developer tool: ``python benchmarks/compare_runs.py OLD.csv NEW.csv [--impl gper] [--out FILE.md]``.
Rows are matched on (impl, op, capacity, batch, mode); the implementation ids of earlier runs
(``seeds-cumsum``) are mapped to today's (``cumsum``). Prints a Markdown table of the medians,
their ratio, and each run's own spread over its repeats (max / min): a ratio inside the spreads
is noise.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

RENAMED = {"seeds-cumsum": "cumsum"}
KEY = ("impl", "op", "capacity", "batch", "mode")


def read(path: Path) -> dict[tuple, dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r.get("status", "ok") == "ok" and r.get("median_us")]
    out = {}
    for r in rows:
        r["impl"] = RENAMED.get(r["impl"], r["impl"])
        out[tuple(r[k] for k in KEY)] = r
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--impl", help="only implementations whose id starts with this")
    ap.add_argument("--out", type=Path, help="also write the table here")
    args = ap.parse_args()
    old, new = read(args.old), read(args.new)
    keys = [k for k in old if k in new and (args.impl is None or k[0].startswith(args.impl))]
    lines = [
        f"Old: `{args.old.name}`; new: `{args.new.name}`; {len(keys)} rows in both.",
        "",
        "| impl | op | capacity | batch | mode | old µs | new µs | new / old | old spread | new spread |",
        "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    ratios = []
    for k in keys:
        o, n = old[k], new[k]
        mo, mn = float(o["median_us"]), float(n["median_us"])
        spread_o = float(o["max_us"]) / float(o["min_us"])
        spread_n = float(n["max_us"]) / float(n["min_us"])
        ratios.append(mn / mo)
        cap = int(k[2])
        cap_s = f"2^{cap.bit_length() - 1}" if cap & (cap - 1) == 0 else str(cap)
        cells = [*k[:2], cap_s, *k[3:], f"{mo:.1f}", f"{mn:.1f}", f"{mn / mo:.3f}"]
        cells += [f"{spread_o:.3f}", f"{spread_n:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    if ratios:
        lines += [
            "",
            f"new / old: median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}",
        ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
