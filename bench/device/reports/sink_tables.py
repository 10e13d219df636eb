#!/usr/bin/env python3
"""ferry's native-sink figures (issue 28): docs/perf/h200/sinks.json and its table (stdlib only, no GPU needed).
perf_tables.py's `sinks` and `sinks-tables` commands run these:

  perf_tables.py sinks [SINKS_RAW] [EAGER_B1] OUT_JSON
      Merges into OUT_JSON (kept where it exists: each input replaces only its own blocks) the "safetensors" and
      "shm" blocks of ferry_bench_sinks' JSON (SINKS_RAW: its stdout, e.g. sinks_raw.json; with it the top-level
      device, commit, date and command) and the "eager_b1" block of the eager Python benchmark (EAGER_B1: a JSON
      file holding {"eager_b1": {...}} or the block itself; its own commit/date/command, when they differ, go into
      the block's "source"). Each input is recognised by its keys, in any order; a path that does not exist or
      "-" is skipped (say so), so `sinks - eager_b1.json sinks.json` updates the eager block alone. An input that
      is bench/torch/eager_pool.py's report (--json) becomes the "eager_pooled" block: every kept eager run's rounds
      pooled, shown as one more row per preset, decided as the published run's rows are.
  perf_tables.py sinks-tables [SINKS_JSON] [--write README]   (default: docs/perf/h200/sinks.json)
      The table of docs/perf/README.md's native-sinks section ("not measured yet" where SINKS_JSON lacks a
      block or does not exist); --write replaces it between README's <!-- sinks-tables --> and <!-- /tables -->.
"""
import json
import os
import sys

sys.dont_write_bytecode = True

# The keys issue 28 asks for, per block (medians; eager: per step).
ISSUE_KEYS = {
    "safetensors": ("disk_write_gbps", "sink_write_gbps", "forward_overhead_pct", "null_consumer_overhead_pct",
                    "entries_checked", "entries_bad"),
    "shm": ("reader_gbps", "forward_overhead_pct", "in_process_overhead_pct", "entries_checked", "entries_bad"),
    "eager_b1": ("rounds", "no_capture_ms", "hidden_states", "vllm_full"),
}
EAGER_PRESET_KEYS = ("ferry_ms", "deferred_ms", "torch_copy_ms")
STAMP = ("device", "commit", "date", "command")
DEFAULT_JSON = "docs/perf/h200/sinks.json"
NOT_YET = "not measured yet"


def _load(path):
    with open(path) as fh:
        return json.load(fh)


def missing_keys(block, name):
    """The issue's keys absent from `block` (eager_b1: its presets' keys too)."""
    miss = [k for k in ISSUE_KEYS[name] if k not in block]
    if name == "eager_b1":
        for preset in ("hidden_states", "vllm_full"):
            miss += [f"{preset}.{k}" for k in EAGER_PRESET_KEYS if k not in (block.get(preset) or {})]
    return miss


def merge(inputs, out_path):
    """Writes out_path: its current content, with the blocks of each input replaced (see the module's doc)."""
    out = _load(out_path) if os.path.exists(out_path) else {}
    for path in inputs:
        if path == "-" or not os.path.exists(path):
            print(f"sinks: {path}: skipped (absent)")
            continue
        d = _load(path)
        if "safetensors" in d or "shm" in d:
            for k in STAMP:
                out[k] = d.get(k) or os.environ.get("FERRY_" + k.upper()) or out.get(k) or "unknown"
            for k in ("backend", "forward"):
                if k in d:
                    out[k] = d[k]
            for k in ("safetensors", "shm"):
                if k in d:
                    out[k] = d[k]
            if d.get("backend") == "host":
                print(f"sinks: {path}: WARNING: measured on the host backend (host timings say nothing about a GPU)")
            what = [k for k in ("safetensors", "shm") if k in d]
        elif "eager_b1" in d or {"rounds", "no_capture_ms"} <= set(d):
            block = dict(d["eager_b1"] if "eager_b1" in d else d)
            source = {k: d[k] for k in STAMP if k in d and "eager_b1" in d}
            if source and any(source.get(k) != out.get(k) for k in ("commit", "date")):
                block["source"] = source
            out["eager_b1"] = block
            for k in STAMP:  # a file of eager_b1 alone still names where it was measured
                if k not in out and k in source:
                    out[k] = source[k]
            what = ["eager_b1"]
        elif d and all(isinstance(v, dict) and "pooled" in v for v in d.values()):
            out["eager_pooled"] = pooled_block(d, path)
            what = []
            print(f"sinks: eager_pooled from {path} ({out['eager_pooled']['runs']} runs)")
        else:
            sys.exit(f"sinks: {path}: neither ferry_bench_sinks' JSON (safetensors / shm), an eager_b1 block nor "
                     "eager_pool.py's report (--json)")
        for name in what:
            miss = missing_keys(out[name], name)
            note = f", missing the issue's keys {', '.join(miss)}" if miss else ""
            print(f"sinks: {name} from {path}{note}")
    ordered = {k: out[k] for k in STAMP if k in out}
    ordered.update({k: out[k] for k in ("safetensors", "shm", "eager_b1", "eager_pooled") if k in out})
    ordered.update({k: v for k, v in out.items() if k not in ordered})
    with open(out_path, "w") as fh:
        json.dump(ordered, fh, indent=1)
        fh.write("\n")
    print(f"wrote {out_path}")


def pooled_block(report, path):
    """The "eager_pooled" block from eager_pool.py's report: per preset the pooled figures (median, ci95, rounds,
    runs of each contestant's overhead and of the targets' paired differences) and the runs they pool."""
    src = next((r["rounds_json"] for r in report.values() if r.get("rounds_json")), path)
    block = {"source": f"{src} (bench/torch/eager_pool.py report --json)"}
    runs = set()
    for preset, r in report.items():
        block[preset.replace("-", "_")] = {k: {x: v[x] for x in ("median", "ci95", "rounds", "runs") if x in v}
                                           for k, v in r["pooled"]["figures"].items()}
        runs |= {(x["commit"], x["date"]) for x in r["runs"]}
    block["runs"] = len(runs)
    block["run_ids"] = [f"{c} {dt}" for c, dt in sorted(runs, key=lambda x: x[1])]
    return block


# ---- the table ------------------------------------------------------------------------------------------------
def _num(v, nd=2, unit=""):
    return None if v is None else f"{v:.{nd}f}{unit}"


def _pct(v):
    return None if v is None else f"{v:+.2f}%"


UNDECIDED = "undecided"


def _met(ok):
    if ok == UNDECIDED:
        return "**undecided** (the median meets it, its ci95 does not)"
    return NOT_YET if ok is None else ("yes" if ok else "**no**")


def _decide(median, ci, bound):
    """A target `value <= bound`: met only where the 95% interval of the median lies at or below the bound (noise
    cannot decide it), not met where the median is above it, undecided in between; the median alone where the
    run gave no interval."""
    if median is None:
        return None
    if median > bound:
        return False
    return True if ci is None or ci[1] <= bound else UNDECIDED


def _both(a, b):
    if a is None or b is None:
        return a if b is None else b
    if a is False or b is False:
        return False
    return UNDECIDED if UNDECIDED in (a, b) else True


def _row(what, value, target, ok):
    met = NOT_YET if not value else ("-" if target == "-" else _met(ok))
    return f"| {what} | {value if value else NOT_YET} | {target} | {met} |"


# The eager contestants in the order the rows list them, with their names there; ferry's modes for the best-mode
# target (immediate, per-hook deferred, the Collector's hand-over).
EAGER_KINDS = (("ferry", "ferry"), ("deferred", "deferred"), ("collect", "Collector"), ("bounce", "bounce"),
               ("torch", "torch copies"), ("hooks", "no-op hooks"))
BEST_MODES = ("ferry", "deferred", "collect")


def table(d):
    """The markdown of the native-sinks section for sinks.json's content `d` ({} : nothing measured)."""
    st, shm, eg = d.get("safetensors") or {}, d.get("shm") or {}, d.get("eager_b1") or {}
    lines = []
    if d.get("commit"):
        backend = f" ({d['backend']})" if d.get("backend") else ""
        lines.append(f"Measured at: commit {d['commit']}, {d.get('date', '?')}, {d.get('device', '?')}{backend}: "
                     f"`{d.get('command', '?')}` ([sinks.json](h200/sinks.json)).")
    else:
        lines.append(f"{NOT_YET.capitalize()}: no [sinks.json](h200/sinks.json) (on the H200: "
                     "`bash bench/device/drivers/h200.sh sinks`, then `publish.sh`).")
    fw = d.get("forward") or {}
    lines.append(f"The forward: {fw.get('layers', 28)} layers of a spin kernel, {fw.get('hooks', 341)} hooks of DMI's "
                 f"vllm-full sizes at {fw.get('tokens', 16)} tokens per step"
                 + (f" ({fw['step_bytes'] / 1e6:.1f} MB per step)" if fw.get("step_bytes") else "")
                 + ", captured with `capture_deferred`, CUDA graph replay; overheads vs the forward alone, medians of "
                   "interleaved rounds. Every captured byte is checked (the shards read back; the stream in the reader "
                   "process).")
    lines += ["", "| benchmark | figure | target | met |", "|---|---|---|---|"]
    disk, sink = st.get("disk_write_gbps"), st.get("sink_write_gbps")
    ratio = sink / disk * 100 if disk and sink is not None else None
    lines.append(_row("safetensors sink, policy block, fsync on: sustained write while the forward runs",
                      sink is not None and f"**{_num(sink, 3)} GB/s** vs the disk's {_num(disk, 3)} GB/s (O_DIRECT, "
                                           f"same filesystem and size, same run): {_num(ratio, 1)}%",
                      ">= 90% of the disk", None if ratio is None else ratio >= 90))
    fo, no = st.get("forward_overhead_pct"), st.get("null_consumer_overhead_pct")
    drop = st.get("drop") or {}
    lines.append(_row("safetensors sink, policy drop: the forward's cost",
                      fo is not None and f"{_pct(fo)} (null in-process consumer {_pct(no)}); "
                                         f"{drop.get('dropped_forwards', '?')} of {drop.get('forwards_captured', '?')} "
                                         "forwards dropped whole", "-", None))
    blk = st.get("block") or {}
    chk = st.get("entries_checked")
    lines.append(_row("safetensors: shards read back",
                      chk is not None and f"{chk:,} entries checked, {st.get('entries_bad')} bad; block: "
                                          f"{blk.get('forwards_missing', '?')} forwards missing, "
                                          f"{blk.get('stalls', '?')} stalls; torn forwards: "
                                          f"{(blk.get('forwards_torn') or 0) + (drop.get('forwards_torn') or 0)}",
                      "0 bad, none missing or torn",
                      None if chk is None else st.get("entries_bad") == 0 and chk > 0
                      and not blk.get("forwards_missing") and not blk.get("forwards_torn") and not drop.get("forwards_torn")))
    thr = shm.get("throughput") or {}
    rg = shm.get("reader_gbps")
    lines.append(_row(f"shm stream: a reader process receives {(thr.get('entry_bytes') or 64 << 20) >> 20} MiB entries",
                      rg is not None and f"**{_num(rg)} GB/s** (pinned D2H memcpy {_num(thr.get('memcpy_d2h_gbps'))} GB/s "
                                         "in the same run)", ">= 50 GB/s", None if rg is None else rg >= 50))
    so, si = shm.get("forward_overhead_pct"), shm.get("in_process_overhead_pct")
    gap = so - si if so is not None and si is not None else None
    lines.append(_row("shm stream: the forward's cost with the reader process attached",
                      so is not None and f"**{_pct(so)}** vs {_pct(si)} with an in-process null consumer "
                                         f"(gap {_num(gap)} pp)", "within 0.5 pp", None if gap is None else gap <= 0.5))
    sc = shm.get("entries_checked")
    lines.append(_row("shm stream: entries checked in the reader process",
                      sc is not None and f"{sc:,} checked, {shm.get('entries_bad')} bad ({shm.get('check', '')})",
                      "0 bad", None if sc is None else shm.get("entries_bad") == 0 and sc > 0))
    base = eg.get("no_capture_ms")
    src = eg.get("source") or {}
    for preset, label in (("hidden_states", "hidden-states (28 hooks)"), ("vllm_full", "vllm-full (341 hooks)")):
        p = eg.get(preset) or {}
        f, df, tc = p.get("ferry_ms"), p.get("deferred_ms"), p.get("torch_copy_ms")
        paired, spread, ci95 = p.get("overhead_pct") or {}, p.get("spread_pct") or {}, p.get("ci95_pct") or {}

        def over(kind, x):
            # the bench's own figure where it gives one: the median over rounds of each round's overhead against
            # the same round's no-capture turn; else the ratio of the medians
            if kind in paired:
                return paired[kind]
            return None if x is None or not base else (x / base - 1) * 100

        def cell(kind, name, x):
            sp, ci = spread.get(kind), ci95.get(kind)
            tail = f" [p10..p90 {_pct(sp[0])}..{_pct(sp[1])}]" if sp else ""
            tail += f" [ci95 {_pct(ci[0])}..{_pct(ci[1])}]" if ci else ""
            return f"{name} {_num(x, 3)} ms ({_pct(over(kind, x))}{tail})"

        value = f is not None and base and (
            ", ".join(cell(k, n, p.get({"torch": "torch_copy_ms", "hooks": "hooks_only_ms"}.get(k, k + "_ms")))
                      for k, n in EAGER_KINDS
                      if k in paired or k not in ("bounce", "hooks", "collect") or p.get(k + "_ms") is not None
                      and k == "collect")
            + f"; no capture {_num(base, 3)} ms; {eg.get('rounds', '?')} rounds of {eg.get('tokens_per_round', '?')}"
              f" steps, main-thread CPU per step{'; commit ' + src['commit'] if src.get('commit') else ''}")
        fo, do, to = over("ferry", f), over("deferred", df), over("torch", tc)
        comp = p.get("comparisons_pp") or {}

        def diff(name, a, b):  # the bench's paired difference (median, ci95) where it gives one
            c = comp.get(name) or {}
            if "median" in c:
                return c["median"], c.get("ci95")
            return (None if a is None or b is None else a - b), None

        modes = {k: (over(k, p.get(k + "_ms")), ci95.get(k)) for k in BEST_MODES}
        pair = {"ferry_minus_torch_pp": diff("ferry_minus_torch_pp", fo, to),
                "deferred_minus_ferry_pp": diff("deferred_minus_ferry_pp", do, fo) if do is not None else (None, None)}
        lines.append(_row(f"eager B=1, Qwen3-0.6B-shaped, a sink running: {label}", value,
                          *_eager_verdict(preset, modes, pair)))
    lines += pooled_rows(d.get("eager_pooled") or {})
    return "\n".join(lines) + "\n"


def _eager_verdict(preset, modes, pair):
    """(target, met) of an eager row: hidden-states, ferry's best mode <= +1% (`modes`: {kind: (overhead %, ci95)},
    None where not timed); vllm-full, ferry - torch copies <= 0; both, deferred - immediate <= 0 where measured
    (`pair`: {difference name: (median pp, ci95)}), each decided by _decide."""
    if preset == "hidden_states":
        timed = {k: m for k, m in modes.items() if m[0] is not None}
        best = min(timed, key=lambda k: timed[k][0]) if timed else None
        target = "ferry <= +1%" + (f" (best mode: {best})" if best else "")
        ok = None if best is None else _decide(*timed[best], 1)
    else:
        target, ok = "ferry <= the torch copies", _decide(*pair.get("ferry_minus_torch_pp", (None, None)), 0)
    deferred = _decide(*pair.get("deferred_minus_ferry_pp", (None, None)), 0)
    if ok is not None and deferred is not None:
        ok = _both(ok, deferred)
    return target + "; deferred <= immediate", ok


def pooled_rows(pb):
    """The eager rows of every kept run pooled ("eager_pooled": eager_pool.py's figures), each target decided as
    the published run's are (_decide on the pooled median and ci95)."""
    rows = []
    for preset, label in (("hidden_states", "hidden-states (28 hooks)"), ("vllm_full", "vllm-full (341 hooks)")):
        f = pb.get(preset)
        if not f:
            continue

        most = max(((x.get("runs", 0), x.get("rounds", 0)) for x in f.values()), default=(0, 0))

        def cell(name, x, unit):
            ci = x.get("ci95")
            tail = f" [ci95 {x['ci95'][0]:+.2f}..{x['ci95'][1]:+.2f}]" if ci else ""
            fewer = (x.get("runs", 0), x.get("rounds", 0)) != most  # a contestant only some runs timed
            return f"{name} {x['median']:+.2f}{unit}{tail}" + (f" ({x.get('rounds')} rounds of {x.get('runs')} runs)"
                                                                 if fewer else "")

        parts = [cell(n, f[k], "%") for k, n in EAGER_KINDS if k in f]
        pairs = ("deferred_minus_ferry_pp", "collect_minus_ferry_pp", "ferry_minus_torch_pp")
        parts += [cell(k.replace("_minus_", " - ").replace("_pp", ""), f[k], " pp") for k in pairs if k in f]

        def median_ci(k):
            return (f[k]["median"], f[k].get("ci95")) if k in f else (None, None)

        rows.append(_row(f"eager B=1, {label}: every kept run pooled ({most[0]} runs, {most[1]} rounds, "
                         "[eager_rounds.json](h200/eager_rounds.json))", "; ".join(parts),
                         *_eager_verdict(preset, {k: median_ci(k) for k in BEST_MODES},
                                         {k: median_ci(k) for k in pairs})))
    return rows


def main(argv):
    from perf_tables import generated_block
    generated_block(argv, "sinks", merge, table, DEFAULT_JSON, "<!-- sinks-tables -->", "sink_tables", "the native-sinks table", __doc__)


if __name__ == "__main__":
    main(sys.argv)
