#!/usr/bin/env python3
"""Draws the plots of docs/perf/README.md as plain SVG from the benchmark summaries (docs/perf/h200/{d2h,h2d,
torch_qwen3}.json or bench/run.sh's), no GPU or plotting library needed; perf_page.py --write calls draw(). A plot
whose figures are missing is skipped; the dashed targets are the run file's "targets" block.
Usage: python3 bench/device/reports/perf_plots.py [d2h.json] [h2d.json] [out_dir] [torch_qwen3.json]"""
import json
import math
import os
import sys


def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError) as e:
        print(f"perf_plots: {path}: {e}", file=sys.stderr)
        return {}


COLORS = ["#4e79a7", "#e15759", "#f28e2b", "#59a14f", "#76b7b2", "#b07aa1", "#9c755f", "#bab0ac"]
W, H = 760, 420
L, R, T, B = 70, 210, 50, 60  # margins (legend on the right)


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class svg:
    def __init__(self, title, subtitle):
        self.parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
                      f'font-family="sans-serif" font-size="12">',
                      f'<rect width="{W}" height="{H}" fill="white"/>',
                      f'<text x="{L}" y="22" font-size="15" font-weight="bold">{esc(title)}</text>',
                      f'<text x="{L}" y="38" fill="#555">{esc(subtitle)}</text>']

    def add(self, s):
        self.parts.append(s)

    def text(self, x, y, s, anchor="start", color="#000", size=12, rotate=None):
        tr = f' transform="rotate({rotate} {x} {y})"' if rotate is not None else ""
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="{color}" font-size="{size}"{tr}>{esc(s)}</text>')

    def line(self, x1, y1, x2, y2, color="#000", width=1, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{color}" stroke-width="{width}"{d}/>')

    def legend(self, names):
        for i, n in enumerate(names):
            y = T + 8 + i * 18
            self.add(f'<rect x="{W - R + 14}" y="{y - 9}" width="12" height="12" fill="{COLORS[i % len(COLORS)]}"/>')
            self.text(W - R + 32, y + 1, n)

    def save(self, path):
        self.add("</svg>")
        with open(path, "w") as f:
            f.write("\n".join(self.parts) + "\n")


def log_ticks(lo, hi):
    out = []
    e = math.floor(math.log10(lo))
    while 10 ** e <= hi:
        for m in (1, 2, 5):
            v = m * 10 ** e
            if lo <= v <= hi:
                out.append(v)
        e += 1
    return out


def per_hook_plot(path, d2h):
    """D2H: GPU time per hook in a graph vs payload, log-log."""
    rows = d2h["per_hook_graph_us"]
    sizes = sorted(int(s) for s in rows if any(v is not None for v in rows[s].values()))
    series = [("copy_only", "copy only"), ("old_volatile", "old volatile (invalid)"),
              ("per_entry_release", "per-entry st.release.sys"), ("ferry_k1", "ferry K=1"),
              ("ferry_k16", "ferry K=16"), ("ferry_k64", "ferry K=64")]
    vals = [rows[str(s)][k] for s in sizes for k, _ in series if rows[str(s)].get(k)]
    ylo, yhi = 10 ** math.floor(math.log10(min(vals))), 10 ** math.ceil(math.log10(max(vals)))
    xlo, xhi = sizes[0], sizes[-1]
    pw, ph = W - L - R, H - T - B
    X = lambda s: L + (math.log(s) - math.log(xlo)) / (math.log(xhi) - math.log(xlo)) * pw
    Y = lambda v: T + ph - (math.log(v) - math.log(ylo)) / (math.log(yhi) - math.log(ylo)) * ph
    hooks = 64 if d2h.get("backend") == "host" else 512
    g = svg("D2H: GPU time per hook in a CUDA graph", f"{d2h['device']}, commit {d2h['commit']}, {d2h['date'][:10]}; "
            f"{hooks} back-to-back hooks, median of round-robin replays")
    for v in log_ticks(ylo, yhi):
        g.line(L, Y(v), L + pw, Y(v), "#ddd")
        g.text(L - 6, Y(v) + 4, f"{v:g}", "end")
    for s in sizes:
        g.line(X(s), T, X(s), T + ph, "#eee")
        g.text(X(s), T + ph + 16, f"{s // 1024} KiB" if s < 1 << 20 else f"{s >> 20} MiB", "middle")
    g.line(L, T + ph, L + pw, T + ph)
    g.line(L, T, L, T + ph)
    g.text(L + pw / 2, H - 18, "payload per hook", "middle")
    g.text(18, T + ph / 2, "us per hook (log)", "middle", rotate=-90)
    for i, (k, _) in enumerate(series):
        pts = [(X(s), Y(rows[str(s)][k])) for s in sizes if rows[str(s)].get(k)]
        c = COLORS[i]
        g.add('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' % (c, " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)))
        for x, y in pts:
            g.add(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{c}"/>')
    g.legend([n for _, n in series])
    g.save(path)


def bars(path, title, subtitle, groups, names, ylabel, targets=None):
    """Grouped bars. groups: [(label, [value or None per name])]; targets: {group label: value} drawn as a dash."""
    vals = [v for _, vs in groups for v in vs if v is not None] + list((targets or {}).values())
    # the axis spans 0 and every value: an overhead can be negative (capture measured faster than none, in noise)
    top, bottom = max(vals + [0.0]) * 1.12, min(vals + [0.0]) * 1.12
    if top - bottom <= 0:
        top = 1.0
    pw, ph = W - L - R, H - T - B
    Y = lambda v: T + ph - (v - bottom) / (top - bottom) * ph
    g = svg(title, subtitle)
    step = 10 ** math.floor(math.log10((top - bottom) / 4))
    for m in (1, 2, 5, 10):
        if (top - bottom) / (m * step) <= 6:
            step *= m
            break
    v = math.floor(bottom / step) * step
    while v <= top:
        if v >= bottom:
            g.line(L, Y(v), L + pw, Y(v), "#ddd")
            g.text(L - 6, Y(v) + 4, f"{v:g}", "end")
        v += step
    g.line(L, Y(0), L + pw, Y(0))
    g.line(L, T, L, T + ph)
    g.text(18, T + ph / 2, ylabel, "middle", rotate=-90)
    gw = pw / len(groups)
    bw = gw * 0.8 / len(names)
    for gi, (label, vs) in enumerate(groups):
        x0 = L + gi * gw + gw * 0.1
        for i, v in enumerate(vs):
            if v is None:
                continue
            x = x0 + i * bw
            y0, y1 = sorted((Y(v), Y(0)))
            g.add(f'<rect x="{x:.1f}" y="{y0:.1f}" width="{bw * 0.9:.1f}" height="{y1 - y0:.1f}" fill="{COLORS[i % len(COLORS)]}"/>')
            g.text(x + bw * 0.45, (Y(v) - 3) if v >= 0 else (Y(v) + 11), f"{v:.1f}", "middle", size=9)
        g.text(L + gi * gw + gw / 2, T + ph + 16, label, "middle")
        if targets and label in targets:
            t = targets[label]
            g.line(L + gi * gw + 4, Y(t), L + (gi + 1) * gw - 4, Y(t), "#000", 2, "6,3")
    leg = list(names) + (["target (dashed)"] if targets else [])
    g.legend(leg)
    if targets:  # the legend swatch of the target is a dash, not a box
        y = T + 8 + len(names) * 18
        g.add(f'<rect x="{W - R + 13}" y="{y - 10}" width="14" height="14" fill="white"/>')
        g.line(W - R + 13, y - 3, W - R + 27, y - 3, "#000", 2, "6,3")
    g.save(path)


def forward_plot(path, d2h):
    """D2H: whole-forward overhead vs no capture, 28 and 341 hooks."""
    keys = [("copy_only_overhead_pct", "copy only"), ("old_volatile_overhead_pct", "old volatile (invalid)"),
            ("per_entry_release_overhead_pct", "per-entry st.release.sys"), ("ferry_overhead_pct", "ferry (K=16)")]
    groups = [(f"{h[5:]} hooks / forward", [d2h["forward"][h].get(k) for k, _ in keys]) for h in ("hooks28", "hooks341")]
    bars(path, "D2H: simulated forward, overhead vs no capture (%)",
         f"{d2h['device']}, commit {d2h['commit']}, {d2h['date'][:10]}; 28 layers of ~60 us, 16 KiB per hook, graph replay",
         groups, [n for _, n in keys], "% over no capture",
         {f"{h[5:]} hooks / forward": t["max"] for h in ("hooks28", "hooks341")
          if (t := (d2h.get("targets") or {}).get(f"overhead_pct_{h}"))})


def h2d_plot(path, h2d):
    """H2D: graph spans per anchor case, with the targets (dashed)."""
    keys = [("floor_graph_us", "floor (consumer only)"), ("packed_graph_us", "packed"),
            ("zerocopy_graph_us", "zerocopy"), ("auto_graph_us", "auto")]
    cases = ["decode256", "tiny4", "small32", "small64"]
    groups = [(c, [h2d["cases"][c].get(k) for k, _ in keys]) for c in cases if c in h2d["cases"]]
    bars(path, "H2D: GPU span in a CUDA graph (us), event -> upload -> first consumer",
         f"{h2d['device']}, commit {h2d['commit']}, {h2d['date'][:10]}; median of {h2d.get('iterations', '?')} round-robin replays",
         groups, [n for _, n in keys], "us",
         {c: t["max"] for c in cases if (t := (h2d.get("targets") or {}).get(f"{c}_graph_us"))})


def torch_plot(path, d):
    """torch Qwen3: overhead above no capture (%) per mode and preset, one bar per contestant."""
    modes = (("b1_eager", "B=1 eager"), ("b1_graph", "B=1 graph"), ("b16_graph", "B=16 graph"))
    names = (("ferry_ms", "ferry"), ("gather_ms", "ferry gather"), ("torch_copy_ms", "torch copies"))
    groups = []
    for key, name in modes:
        m = (d.get("decode") or {}).get(key) or {}
        for preset in ("hidden_states", "vllm_full"):
            if m.get("no_capture_ms"):
                p = m.get(preset) or {}
                groups.append((f"{name}, {preset.split('_')[0]}", [None if p.get(k) is None else
                                                                 (p[k] / m["no_capture_ms"] - 1) * 100 for k, _ in names]))
    bars(path, "torch Qwen3-0.6B-shaped decode: overhead above no capture (%)",
         f"{d['device']}, commit {d['commit']}, {d['date'][:10]}; 128 tokens, median", groups, [n for _, n in names], "%")


def draw(folder, out_dir, files=None):
    """The plots of folder's d2h.json, h2d.json and torch_qwen3.json (files: other paths) into out_dir."""
    files = files or {k: os.path.join(folder, k + ".json") for k in ("d2h", "h2d", "torch_qwen3")}
    data = {k: load(p) for k, p in files.items() if p}
    wrote = []
    for fn, key, name in ((per_hook_plot, "d2h", "d2h_per_hook.svg"), (forward_plot, "d2h", "d2h_forward.svg"),
                          (h2d_plot, "h2d", "h2d_graph.svg"), (torch_plot, "torch_qwen3", "torch_qwen3.svg")):
        if key not in data:
            continue
        try:
            fn(f"{out_dir}/{name}", data[key])
            wrote.append(f"{out_dir}/{name}")
        except (KeyError, ValueError, TypeError, ZeroDivisionError) as e:  # figures missing from the summary
            print(f"perf_plots: {name} skipped ({type(e).__name__}: {e})", file=sys.stderr)
    print("wrote " + (", ".join(wrote) if wrote else "no plot"))


if __name__ == "__main__":
    a = sys.argv[1:]
    draw(None, a[2] if len(a) > 2 else "docs/perf",
         {"d2h": a[0] if a else "docs/perf/h200/d2h.json", "h2d": a[1] if len(a) > 1 else "docs/perf/h200/h2d.json",
          "torch_qwen3": a[3] if len(a) > 3 else None})
