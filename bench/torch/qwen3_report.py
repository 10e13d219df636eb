#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The table (markdown, stdout or --md) and the plot (SVG, --svg) of a torch_qwen3.json from qwen3_capture.py.

  python bench/torch/qwen3_report.py docs/perf/h200/torch_qwen3.json --md docs/perf/h200/torch_qwen3.md \
      --svg docs/perf/torch_qwen3.svg
"""

from __future__ import annotations

import argparse
import json

MODES = ("b1_eager", "b1_graph", "b16_graph")
PRESETS = (("hidden_states", "hidden-states (28/fwd)"), ("vllm_full", "vllm-full (341/fwd)"))


def pct(x, base):
    return 100.0 * (x / base - 1.0)


def table(d: dict) -> str:
    lines = [f"Qwen3-0.6B-shaped decode, 128 new tokens, whole generation (ms, median); {d['device']}, "
             f"commit {d['commit'][:7]}, {d['date']}", "",
             "| mode | no capture | hidden-states ferry | hidden-states torch copies | vllm-full ferry | "
             "vllm-full torch copies |", "|---|---|---|---|---|---|"]
    for m in MODES:
        r = d["decode"].get(m) or {}
        base = r.get("no_capture_ms")
        if base is None:
            continue
        cells = [f"{base:.1f}"]
        for p, _ in PRESETS:
            for k in ("ferry_ms", "torch_copy_ms"):
                v = r[p][k]
                cells.append(f"{v:.1f} ({pct(v, base):+.1f}%)")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += ["", f"entries checked bit-exact: {d['entries_checked']}, bad: {d['entries_bad']}", "",
              "| H2D step, B=64 (GPU span to the first consumer) | per-tensor torch copies (us) | ferry (us) | ratio |",
              "|---|---|---|---|"]
    for m in ("eager", "graph"):
        r = d["h2d_step"].get(m) or {}
        if r.get("ferry_us") is None:
            continue
        lines.append(f"| {m} | {r['torch_copies_us']:.1f} | {r['ferry_us']:.1f} | "
                     f"{r['ferry_us'] / r['torch_copies_us']:.2f}x |")
    lines.append(f"\nCommand: `{d['command']}`")
    return "\n".join(lines) + "\n"


def svg(d: dict) -> str:
    W, H, L, B, T = 760, 420, 70, 360, 60
    bars = []  # (group label, [(label, pct, color)])
    colors = {"ferry": "#4e79a7", "torch": "#e15759"}
    for m in MODES:
        r = d["decode"].get(m) or {}
        base = r.get("no_capture_ms")
        if base is None:
            continue
        items = []
        for p, label in PRESETS:
            items.append((f"{label.split()[0]} ferry", pct(r[p]["ferry_ms"], base), colors["ferry"]))
            items.append((f"{label.split()[0]} torch", pct(r[p]["torch_copy_ms"], base), colors["torch"]))
        bars.append((m, items))
    top = max([1.0] + [v for _, it in bars for _, v, _ in it])
    scale = (B - T) / top
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           'font-family="sans-serif" font-size="12">', f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{L}" y="22" font-size="15" font-weight="bold">Qwen3-0.6B decode with capture: % over no '
           'capture (128 tokens)</text>',
           f'<text x="{L}" y="38" fill="#555">{d["device"]}, commit {d["commit"][:7]}, {d["date"][:10]}; blue: '
           'ferry, red: per-hook pinned copy_; left pair hidden-states, right pair vllm-full</text>',
           f'<line x1="{L}" y1="{B}" x2="{W - 20}" y2="{B}" stroke="#000"/>']
    gw = (W - L - 40) / max(1, len(bars))
    for gi, (m, items) in enumerate(bars):
        x0 = L + 10 + gi * gw
        bw = (gw - 30) / len(items)
        for i, (_, v, c) in enumerate(items):
            h = max(0.0, v) * scale
            x = x0 + i * bw + (8 if i >= 2 else 0)
            out.append(f'<rect x="{x:.1f}" y="{B - h:.1f}" width="{bw - 4:.1f}" height="{h:.1f}" fill="{c}"/>')
            out.append(f'<text x="{x + (bw - 4) / 2:.1f}" y="{B - h - 3:.1f}" text-anchor="middle" '
                       f'font-size="9">{v:.1f}</text>')
        out.append(f'<text x="{x0 + (gw - 30) / 2:.1f}" y="{B + 16}" text-anchor="middle">{m}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    ap.add_argument("--md")
    ap.add_argument("--svg")
    a = ap.parse_args()
    with open(a.json) as f:
        d = json.load(f)
    t = table(d)
    print(t, end="")
    if a.md:
        with open(a.md, "w") as f:
            f.write(t)
    if a.svg:
        with open(a.svg, "w") as f:
            f.write(svg(d))


if __name__ == "__main__":
    main()
