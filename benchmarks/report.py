"""Rendering a benchmark run's JSON (benchmarks/run.py --json): a Markdown report and the chart.

    python -m benchmarks.report benchmarks/results.json                 # Markdown on stdout
    python -m benchmarks.report benchmarks/results.json --chart out.png # and the bar chart

The Markdown is what benchmarks/RESULTS.md holds for a run: when, the exact command, the
machine (with its load average: other work on it skews every number), the matmul peak, the
table (a row per model and thread count; ``steal %``: the share of the machine's CPU time its
hypervisor gave other guests while that row was timed; ``cross-core ns``: a 2-thread row's
cache-line round trip between the two CPUs right before and after its timing, crosscore.py;
``load``: the 1-minute load average as the model's timing began), the geometric means,
mismatches and failures.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # python benchmarks/report.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _ms(x) -> str:
    if x is None:
        return "-"
    ms = x * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:,.0f}"


def _f(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _mib(r: dict, side: str) -> str:
    got = (r.get("peak_rss") or {}).get(side)
    return "-" if not got else f"{got['peak_mib']:.0f}"


def _load(r: dict) -> str:
    """The 1-minute load average when the model's timing began."""
    load = r.get("load_average")
    return "-" if not load else f"{load[0]:.1f}"


def markdown(doc: dict) -> str:
    """The run as Markdown."""
    m = doc["machine"]
    v = m.get("versions", {})
    lines = [f"- date: {doc['date']}",
             f"- command: `{doc['command']}`" + (f" ({doc['seconds'] / 60:.0f} min)"
                                                  if doc.get("seconds") else ""),
             f"- machine: {m['cpu']}, {m['cores']} cores, {m['system']} {m['architecture']}; "
             f"load average (1, 5, 15 min) at the end: {m.get('load_average')}",
             "- versions: " + ", ".join(f"{k} {x}" for k, x in v.items())]
    peaks = ", ".join(f"{p:.1f} GFLOP/s at {t} thread{'s' * (t != '1')}"
                      for t, p in doc["matmul_peak_gflops"].items() if p)
    lines.append(f"- matmul peak (ONNX Runtime sgemm 2048^3, best of the runs): {peaks}")
    crossing = m.get("cross_core_round_trip_ns") or {}
    if any(crossing.values()):
        ns = lambda x: "-" if x is None else f"{x:.0f} ns"  # noqa: E731
        lines.append(f"- cross-core round trip (one cache line, benchmarks/crosscore.py): "
                     f"{ns(crossing.get('start'))} at the start, {ns(crossing.get('end'))} at "
                     f"the end")
    lines += ["", "| model | T | mlpack ms | ORT ms | ORT/mlpack | mlpack GFLOP/s | % peak | "
              "ORT GFLOP/s | % peak | runs (mlpack/ORT) | steal % | cross-core ns | build s | "
              "peak RSS mlpack MiB | peak RSS ORT MiB | outputs | load |",
              "|---|" + "---:|" * 14 + "---|---:|"]
    for r in doc["models"]:
        out = r.get("outputs")
        verdict = "-" if out is None else "ok" if out["match"] else "**MISMATCH**"
        for i, row in enumerate(r["threads"]):
            mp, o = row["mlpack"], row["ort"] or {}
            first = i == 0
            lines.append("| " + " | ".join([
                r["model"] if first else "", str(row["threads"]), _ms(mp["median_s"]),
                _ms(o.get("median_s")), _f(row["ratio"], ".3f"), _f(mp["gflops"], ".2f"),
                _f(mp["percent_of_peak"], ".1f"), _f(o.get("gflops"), ".1f"),
                _f(o.get("percent_of_peak"), ".1f"), f"{mp['runs']}/{o.get('runs', '-')}",
                _f(row.get("steal_percent"), ".0f"), _crossing(row),
                _f(r.get("build_seconds"), ".1f") if first else "",
                _mib(r, "mlpack") if first else "", _mib(r, "ort") if first else "",
                verdict if first else "", _load(r) if first else ""]) + " |")
    lines.append("")
    for t, g in doc["geomean_ratio"].items():
        lines.append(f"Geometric mean of ORT/mlpack at {t} thread{'s' * (t != '1')}: **{g:.3f}**"
                     + (f" (mlpack {1 / g:.1f}x slower)." if g < 1 else
                        f" (mlpack {g:.1f}x faster)."))
        lines.append("")
    for r in doc["models"]:
        if r.get("outputs") and not r["outputs"]["match"]:
            lines.append(f"**MISMATCH** {r['model']}: {r['outputs']['detail']}")
            lines.append("")
    for f in doc.get("failures", []):
        lines.append(f"**FAILED** {f}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _crossing(row: dict) -> str:
    """A 2-thread row's cross-core round trips before / after its timing (run.py)."""
    ns = row.get("cross_core_ns") or []
    return " / ".join("-" if x is None else f"{x:.0f}" for x in ns) or "-"


def chart(doc: dict, out) -> None:
    """A bar chart of ORT/mlpack per model, a bar per thread count, and a line at 1.0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [r["model"] for r in doc["models"]]
    counts = sorted({row["threads"] for r in doc["models"] for row in r["threads"]})
    width = 0.8 / max(len(counts), 1)
    fig, ax = plt.subplots(figsize=(max(8, 0.8 * len(models) + 2), 5))
    for j, t in enumerate(counts):
        xs, ys = [], []
        for i, r in enumerate(doc["models"]):
            row = next((x for x in r["threads"] if x["threads"] == t), None)
            if row and row["ratio"]:
                xs.append(i + (j - (len(counts) - 1) / 2) * width)
                ys.append(row["ratio"])
        geo = doc["geomean_ratio"].get(str(t))
        label = f"{t} thread{'s' * (t != 1)}" + (f" (geomean {geo:.3g})" if geo else "")
        ax.bar(xs, ys, width, label=label)
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
    ax.set_yscale("log")
    ax.set_xticks(range(len(models)), models, rotation=45, ha="right")
    ax.set_ylabel("ORT latency / mlpack latency (log; > 1: mlpack faster)")
    ax.set_title(f"mlpack vs ONNX Runtime {doc['machine']['versions'].get('onnxruntime', '')}, "
                 f"{doc['date'][:10]}, {doc['machine']['cpu']}, {doc['machine']['cores']} cores",
                 fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report",
                                     description="Render a benchmarks.run --json file.")
    parser.add_argument("results", type=Path, help="the JSON written by benchmarks.run --json")
    parser.add_argument("--chart", type=Path, default=None, help="also write the bar chart here")
    args = parser.parse_args(argv)
    doc = json.loads(args.results.read_text())
    sys.stdout.write(markdown(doc))
    if args.chart is not None:
        chart(doc, args.chart)
    return 0


if __name__ == "__main__":
    sys.exit(main())
