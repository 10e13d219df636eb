#!/usr/bin/env python3
"""The torch Qwen3-0.6B benchmark's table and plot for docs/perf (from bench/torch/qwen3_capture.py's JSON).
Usage: python3 bench/device/reports/torch_tables.py [torch_qwen3.json] [--write docs/perf/README.md] [--plot OUT.svg]
The table replaces the text between <!-- torch-qwen3 --> and <!-- /torch-qwen3 --> in README."""
import json
import sys

sys.dont_write_bytecode = True  # the sibling import below leaves no __pycache__ in the tree
from perf_tables import write_block  # noqa: E402

MODES = [("b1_eager", "B=1 eager"), ("b1_graph", "B=1 graph"), ("b16_graph", "B=16 graph")]
PRESETS = [("hidden_states", "hidden-states (28)"), ("vllm_full", "vllm-full (341)")]
CONTESTANTS = [("ferry_ms", "ferry"), ("gather_ms", "ferry gather"), ("torch_copy_ms", "torch copies")]


def pct(v, base):
    return f"{v:.1f} ms ({(v / base - 1) * 100:+.2f}%)"


def check_note(d):
    """The reference and the determinism diagnostics (JSON "check"; absent from older runs)."""
    c = d.get("check")
    if not c:
        return ""
    if "replay_bad" not in c:  # the per-step replay was the reference (before witness copies)
        return (f"Reference: a per-step replay (each captured step replayed eagerly without capture from the same "
                f"state, `.cpu()` of the hooked tensors). Determinism: two whole reference generations differ in "
                f"{c.get('reference_vs_reference_bad', '?')} captures; the replay's next token differs from the "
                f"captured step's in {c.get('step_token_mismatches', '?')} steps, its KV[pos] in "
                f"{c.get('step_kv_mismatches', '?')}.")
    return (f"Reference (entries_bad): witness copies, a synchronous copy of each hooked tensor made by the same "
            f"execution beside its capture (eager: `.cpu()` at the hook; graph: a device copy captured next to the "
            f"capture). Diagnostics: the uncaptured eager replay of each step from the same state differs from "
            f"ferry's entries in {c['replay_bad']} captures, two whole uncaptured generations differ from each "
            f"other in {c.get('reference_vs_reference_bad', '?')}; the replay's next token differs from the captured "
            f"step's in {c.get('step_token_mismatches', '?')} steps, its KV[pos] in {c.get('step_kv_mismatches', '?')}: "
            f"the model is not bit-reproducible run to run (no ferry involved), so the replay cannot be the "
            f"reference. B=1 eager rows are CPU-bound and vary by several % between runs.")


def noise_note(d):
    """The no-capture step captured twice per graph mode (JSON "noise"; absent from older runs)."""
    nz = d.get("noise") or {}
    cells = [f"{name} {nz[key]['spread_pct']:+.2f}%" for key, name in MODES if key in nz]
    if not cells:
        return ""
    return (f"Noise floor of the graph rows: the no-capture step captured a second time, after every other graph "
            f"of its mode, differs from the first capture by {', '.join(cells)}.")


def table(d):
    measured = (f"Measured {d.get('date', '?')} on {d.get('device', '?')}, commit {d.get('commit', '?')}: "
                f"`{d.get('command', '?')}`. Whole 128-token greedy generation (median); entries checked "
                f"bit-exact: {d.get('entries_checked', 0)}, bad: {d.get('entries_bad', '?')}.")
    rows = [" ".join(x for x in (measured, check_note(d), noise_note(d)) if x), "", "| decode | no capture | preset | " + " | ".join(n for _, n in CONTESTANTS) + " |",
            "|---|---|---|" + "---|" * len(CONTESTANTS)]
    for key, name in MODES:
        m = d.get("decode", {}).get(key)
        if not m or not m.get("no_capture_ms"):
            continue  # a mode not run here (graphs on the host backend)
        base = m["no_capture_ms"]
        for pk, pname in PRESETS:
            p = m.get(pk) or {}
            cells = [pct(p[c], base) if p.get(c) is not None else "-" for c, _ in CONTESTANTS]
            rows.append(f"| {name} | {base:.1f} ms | {pname} | " + " | ".join(cells) + " |")
    h = d.get("h2d_step") or {}
    h2d = []
    for k in ("eager", "graph"):
        if (h.get(k) or {}).get("torch_copies_us") and (h.get(k) or {}).get("ferry_us") is not None:
            t, f = h[k]["torch_copies_us"], h[k]["ferry_us"]
            h2d.append(f"| {k} | {t:.1f} us | {f:.1f} us | {f / t:.2f}x |")
    if h2d:
        rows += ["", "| H2D decode step, B=64 (GPU span to the first consumer) | per-tensor copies | ferry | ratio |",
                 "|---|---|---|---|"] + h2d
    return "\n".join(rows) + "\n"


def plot(d, path):
    """Overhead above no capture (%) per mode and preset, one bar per contestant (plain SVG)."""
    bars = []
    for key, name in MODES:
        m = d.get("decode", {}).get(key)
        if not m or not m.get("no_capture_ms"):
            continue
        for pk, pname in PRESETS:
            p = m.get(pk) or {}
            bars.append((f"{name}, {pname.split()[0]}",
                         [(p[c] / m["no_capture_ms"] - 1) * 100 if p.get(c) is not None else None
                          for c, _ in CONTESTANTS]))
    colors = ["#4e79a7", "#59a14f", "#e15759"]
    W, H, L, T, B = 820, 420, 60, 50, 110
    top = max([v for _, vs in bars for v in vs if v is not None] + [1.0])
    group = (W - L - 160) / max(len(bars), 1)
    bw = group / (len(CONTESTANTS) + 1)
    y = lambda v: T + (H - T - B) * (1 - max(v, 0) / top)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{L}" y="20" font-size="14" font-weight="bold">Qwen3-0.6B-shaped decode with capture: '
           f'overhead above no capture (%)</text>',
           f'<text x="{L}" y="36" fill="#555">{d.get("device", "?")}, commit {d.get("commit", "?")}, '
           f'128 tokens, median</text>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - 160}" y2="{H - B}" stroke="#000"/>']
    for i in range(5):
        v = top * i / 4
        out.append(f'<text x="{L - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.0f}</text>')
        out.append(f'<line x1="{L}" y1="{y(v):.1f}" x2="{W - 160}" y2="{y(v):.1f}" stroke="#ddd"/>')
    for g, (label, vs) in enumerate(bars):
        x0 = L + g * group + bw / 2
        for j, v in enumerate(vs):
            if v is None:
                continue
            out.append(f'<rect x="{x0 + j * bw:.1f}" y="{y(v):.1f}" width="{bw * 0.9:.1f}" '
                       f'height="{H - B - y(v):.1f}" fill="{colors[j]}"><title>{v:.2f}%</title></rect>')
        cx = x0 + len(CONTESTANTS) * bw / 2
        out.append(f'<text x="{cx:.1f}" y="{H - B + 14}" text-anchor="end" '
                   f'transform="rotate(-35 {cx:.1f} {H - B + 14})">{label}</text>')
    for j, (_, n) in enumerate(CONTESTANTS):
        out.append(f'<rect x="{W - 145}" y="{T + j * 18}" width="12" height="12" fill="{colors[j]}"/>')
        out.append(f'<text x="{W - 128}" y="{T + j * 18 + 10}">{n}</text>')
    out.append("</svg>")
    open(path, "w").write("\n".join(out) + "\n")


def main(argv):
    path = argv[0] if argv and not argv[0].startswith("--") else "docs/perf/h200/torch_qwen3.json"
    d = json.load(open(path))
    text = table(d)
    if "--plot" in argv:
        plot(d, argv[argv.index("--plot") + 1])
    if "--write" in argv:
        write_block(argv[argv.index("--write") + 1], "<!-- torch-qwen3 -->", "<!-- /torch-qwen3 -->", "\n" + text,
                    "torch_tables")
    else:
        print(text, end="")


if __name__ == "__main__":
    main(sys.argv[1:])
