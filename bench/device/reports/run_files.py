#!/usr/bin/env python3
"""The run files of docs/perf/h200 from a device run's outputs (stdlib only, no GPU needed); perf_page.py renders
the page from them.

  run_files.py d2h-summary GBENCH_JSON OUT_JSON
      The D2H summary (docs/perf/h200/d2h.json's keys: per-variant us, overheads vs no capture, publication above
      the copy-only baseline, per-hook us, variants, drain GB/s, entries checked) from ferry_bench_d2h's Google
      Benchmark JSON. commit/date/command: FERRY_COMMIT / FERRY_DATE / FERRY_COMMAND, else the benchmark's context.
  run_files.py sinks [SINKS_RAW] [EAGER_B1] [POOLED] OUT_JSON
      Merges into OUT_JSON (kept where it exists: each input replaces only its own blocks) the "safetensors" and
      "shm" blocks of ferry_bench_sinks' JSON (SINKS_RAW; with it the top-level device, commit, date and command),
      the "eager_b1" block of the eager Python benchmark (EAGER_B1: {"eager_b1": {...}} or the block itself; its
      own commit/date/command, when they differ, go into the block's "source") and, from bench/torch/eager_pool.py's
      report --json, the "eager_pooled" block (every kept eager run's rounds pooled). Each input is recognised by its
      keys; a path that does not exist or "-" is skipped (say so).
  run_files.py select [SELECT_RAW] [QWEN3_CB] OUT_JSON
      Merges into OUT_JSON the d2h_t256_select16, d2h_t16_full and prefill_last_token blocks derived from
      ferry_bench_select's JSON (medians in us, overheads vs no capture) and the qwen3_cb block of
      bench/torch/qwen3_cb.py's JSON (its own commit/date/command go into the block's "source"). With SELECT_RAW,
      device/commit/date/command come from FERRY_DEVICE / FERRY_COMMIT / FERRY_DATE / FERRY_COMMAND (else
      OUT_JSON's), and the blocks it replaces move, with the old commit and date, to "previous_run" (unless the
      commit is the same). Other keys (targets, method, k1024) stay.
  run_files.py carry OLD_JSON NEW_JSON
      Copies OLD_JSON's "targets" and "anchors" blocks (the page's bounds and reference figures) into NEW_JSON, a
      new run's file of the same name (publish.sh, before it replaces OLD_JSON).
"""
import json
import os
import re
import sys

STAMP = ("device", "commit", "date", "command")
KEPT = ("targets", "anchors")  # the page's blocks of a run file, carried from run to run


def _load(path):
    with open(path) as fh:
        return json.load(fh)


def _inputs(who, paths):
    """(path, content) of each merge input; a path that does not exist or "-" is skipped (and said so)."""
    for path in paths:
        if path == "-" or not os.path.exists(path):
            print(f"{who}: {path}: skipped (absent)")
            continue
        yield path, _load(path)


def _write(out_path, ordered, out):
    """A merged run file: the keys of `ordered` first, then the rest of `out`, indent 1."""
    ordered.update({k: v for k, v in out.items() if k not in ordered})
    with open(out_path, "w") as fh:
        json.dump(ordered, fh, indent=1)
        fh.write("\n")
    print(f"wrote {out_path}")


def r4(v):
    return None if v is None else round(v, 4)


SIZES = (4096, 16384, 65536, 1048576, 16777216, 67108864)
FWD_KEYS = ("no_capture", "copy_only", "old_volatile", "per_entry_release", "event_per_hook", "ferry", "ferry_pinned",
            "copy_only_plain", "ferry_plain", "ferry_inline", "ferry_gather", "ferry_gather_fused", "ferry_gather_k32")
HOOK_KEYS = ("copy_only", "old_volatile", "per_entry_release", "ferry_k1", "ferry_k4", "ferry_k16", "ferry_k64",
             "ferry_k16_pinned", "copy_only_plain", "ferry_k16_plain", "ferry_k16_inline", "ferry_k64_inline")
CHECK_KEYS = ("entries_checked", "entries_bad", "baseline_entries_checked", "baseline_entries_bad")


# ---- d2h-summary -----------------------------------------------------------------------------------
def d2h_summary(gbench_path, out_path):
    g = json.load(open(gbench_path))
    ctx = g.get("context", {})
    forward, per_hook, variants, fwd_variants, capture_cpu = {}, {}, {}, {}, {}
    drain = memcpy = None
    checks = dict.fromkeys(CHECK_KEYS, 0)
    for b in g.get("benchmarks", []):
        if b.get("run_type", "iteration") != "iteration":
            continue
        name = re.sub(r"(/iterations:\d+|/manual_time|/repeats:\d+)+$", "", b["name"])
        for k in CHECK_KEYS:
            checks[k] += int(b.get(k, 0))
        parts = name.split("/")
        if parts[0] == "forward" and len(parts) == 3 and parts[2] == "vllm_full_b1":  # forward/<key>/vllm_full_b1
            forward.setdefault("vllm_full_b1", {})[parts[1]] = b["us_per_forward"]
        elif parts[0] == "forward" and len(parts) == 3:  # forward/<key>/hooks:<H>
            forward.setdefault(int(parts[2].split(":")[1]), {})[parts[1]] = b["us_per_forward"]
        elif parts[0] == "per_hook_graph":  # per_hook_graph/<P>: one counter per contestant
            per_hook[int(parts[1])] = {k: v for k, v in b.items() if k in HOOK_KEYS}
        elif parts[0] == "variants" and parts[1] == "fwd341":
            fwd_variants["/".join(parts[2:])] = b["us_per_forward"]
        elif parts[0] == "variants" and parts[1] == "diag":
            for k, v in b.items():
                if isinstance(v, float) and k not in CHECK_KEYS and k not in ("real_time", "cpu_time"):
                    variants.setdefault("diag/" + k, {})[int(parts[2])] = v
        elif parts[0] == "variants":
            variants.setdefault("/".join(parts[1:-1]), {})[int(parts[-1])] = b["us_per_hook"]
        elif parts[0] == "capture_cpu":  # capture_cpu/<immediate|deferred>/vllm_full_b1: producer CPU us per call
            capture_cpu[parts[1]] = b["us_per_capture"]
        elif name == "drain/ferry_64MiB":
            drain = b["GBps"]
        elif name == "drain/memcpy_ceiling_64MiB":
            memcpy = b["GBps"]

    def env(k, default):
        return os.environ.get(k) or ctx.get(k) or default

    out = {"device": ctx.get("ferry_device", "?"), "commit": env("FERRY_COMMIT", "unknown"),
           "date": env("FERRY_DATE", ctx.get("date", "unknown")), "command": env("FERRY_COMMAND", "ferry_bench_d2h"),
           "backend": ctx.get("ferry_backend", "?"), "forward": {}}
    for H in (28, 341, "vllm_full_b1"):
        m = forward.get(H, {})
        row = {f"{k}_us": r4(m.get(k)) for k in FWD_KEYS}
        base = m.get("no_capture")
        for k in FWD_KEYS[1:]:
            x = m.get(k)
            row[f"{k}_overhead_pct"] = r4((x / base - 1) * 100) if base and x is not None else None

        def over(fer, cop):  # ferry's time above the copy-only baseline launched the same way, % of no capture
            x, c = m.get(fer), m.get(cop)
            return r4((x - c) / base * 100) if base and x is not None and c is not None else None

        row["ferry_publication_over_copy_pct"] = over("ferry", "copy_only")
        row["ferry_plain_publication_over_copy_plain_pct"] = over("ferry_plain", "copy_only_plain")
        row["ferry_inline_publication_over_copy_pct"] = over("ferry_inline", "copy_only")
        row["ferry_gather_over_copy_pct"] = over("ferry_gather", "copy_only")  # gather: one kernel per K hooks
        row["ferry_gather_fused_over_copy_pct"] = over("ferry_gather_fused", "copy_only")
        out["forward"][H if isinstance(H, str) else f"hooks{H}"] = row
    out["per_hook_graph_us"] = {str(P): {k: r4(per_hook[P].get(k)) for k in HOOK_KEYS} for P in SIZES if P in per_hook}
    out["variants"] = {
        "per_hook_graph_us": {n: {str(P): r4(m.get(P)) for P in (4096, 16384, 65536)} for n, m in sorted(variants.items())},
        "forward341_us": {n: r4(v) for n, v in sorted(fwd_variants.items())}}
    out["capture_cpu_us_vllm_full_b1"] = {k: r4(v) for k, v in sorted(capture_cpu.items())}
    out["drain_gbps_64MiB"] = r4(drain)
    out["memcpy_d2h_gbps_64MiB"] = r4(memcpy)
    out.update(checks)
    with open(out_path, "w") as fh:
        json.dump(out, fh, indent=2)
        fh.write("\n")
    print(f"wrote {out_path}: entries checked {checks['entries_checked']}, bad {checks['entries_bad']}")


# ---- sinks (issue 28) -------------------------------------------------------------------------------------------
# The keys issue 28 asks for, per block (medians; eager: per step).
ISSUE_KEYS = {
    "safetensors": ("disk_write_gbps", "sink_write_gbps", "forward_overhead_pct", "null_consumer_overhead_pct",
                    "entries_checked", "entries_bad"),
    "shm": ("reader_gbps", "forward_overhead_pct", "in_process_overhead_pct", "entries_checked", "entries_bad"),
    "eager_b1": ("rounds", "no_capture_ms", "hidden_states", "vllm_full"),
}
EAGER_PRESET_KEYS = ("ferry_ms", "deferred_ms", "torch_copy_ms")


def missing_keys(block, name):
    """The issue's keys absent from `block` (eager_b1: its presets' keys too)."""
    miss = [k for k in ISSUE_KEYS[name] if k not in block]
    if name == "eager_b1":
        for preset in ("hidden_states", "vllm_full"):
            miss += [f"{preset}.{k}" for k in EAGER_PRESET_KEYS if k not in (block.get(preset) or {})]
    return miss


def merge_sinks(inputs, out_path):
    """Writes out_path: its current content, with the blocks of each input replaced (see the module's doc)."""
    out = _load(out_path) if os.path.exists(out_path) else {}
    for path, d in _inputs("sinks", inputs):
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
    ordered.update({k: out[k] for k in ("targets", "safetensors", "shm", "eager_b1", "eager_pooled") if k in out})
    _write(out_path, ordered, out)


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


# ---- select (issue 27) ------------------------------------------------------------------------------------------
D2H_BLOCKS = ("d2h_t256_select16", "d2h_t16_full", "prefill_last_token")
ORDER = STAMP + ("targets", "method",) + D2H_BLOCKS + ("qwen3_cb", "k1024", "previous_run")
QWEN3_KEYS = ("no_capture_ms", "hidden_states_ms", "vllm_full_ms", "cpu_select_ms", "torch_select_ms", "rows_checked",
              "rows_bad", "misattributed", "per_preset")
PRESETS = ("hidden_states", "vllm_full")
K = 128  # ferry_bench_select's publish_every: the page's K column


def over(x, none):
    return None if x is None or not none else round((x / none - 1) * 100, 2)


def _checks(*blocks):
    return {"entries_checked": sum(b.get("entries_checked", 0) for b in blocks),
            "entries_bad": sum(b.get("entries_bad", 0) for b in blocks)}


def from_raw(raw):
    """select.json's d2h blocks from ferry_bench_select's JSON (those it has)."""
    out = {}
    t = raw.get("d2h_t256_select16")
    if t:
        none = t.get("none_us")
        out["d2h_t256_select16"] = {
            "no_capture_us": none, "ferry_us": t.get("select_us"), "ferry_gather_us": t.get("select_gather_us"),
            "full_capture_us": t.get("full_gather_us"), **_checks(t),
            "overhead_pct": {"ferry": over(t.get("select_us"), none),
                             "ferry_gather": over(t.get("select_gather_us"), none),
                             "full_capture": over(t.get("full_gather_us"), none)}}
    t = raw.get("d2h_t16_full")
    if t:
        out["d2h_t16_full"] = {"no_capture_us": t.get("none_us"), "ferry_gather_us": t.get("full_gather_us"),
                               **_checks(t),
                               "overhead_pct": {"ferry_gather": over(t.get("full_gather_us"), t.get("none_us"))}}
    pre = {p: raw["prefill_last_token_" + p] for p in PRESETS if raw.get("prefill_last_token_" + p)}
    if pre:
        nones = {p: b.get("none_us") for p, b in pre.items()}
        block = {"no_capture_us": round(sum(nones.values()) / len(nones), 2)}
        block.update({f"{p}_us": b.get("select_gather_us") for p, b in pre.items()})
        block.update(_checks(*pre.values()))
        block["no_capture_us_per_preset"] = nones
        block["overhead_pct"] = {p: over(b.get("select_gather_us"), b.get("none_us")) for p, b in pre.items()}
        out["prefill_last_token"] = block
    return out


def merge_select(inputs, out_path):
    """Writes out_path: its current content, with the blocks of each input replaced (see the module's doc)."""
    out = _load(out_path) if os.path.exists(out_path) else {}
    for path, d in _inputs("select", inputs):
        if any(k.startswith("prefill_last_token_") for k in d) or "none_us" in (d.get("d2h_t256_select16") or {}) \
                or "none_us" in (d.get("d2h_t16_full") or {}):
            new = from_raw(d)
            stamp = {k: os.environ.get("FERRY_" + k.upper()) or out.get(k) or "unknown" for k in STAMP}
            if not os.environ.get("FERRY_COMMIT"):
                print(f"select: {path}: WARNING: FERRY_COMMIT is not set: the run keeps the commit {stamp['commit']}")
            old = {k: out[k] for k in D2H_BLOCKS if k in out}
            if old and out.get("commit") != stamp["commit"]:
                out["previous_run"] = {"commit": out.get("commit"), "date": out.get("date"), **old}
            out.update(stamp)
            out.update(new)
            if d.get("host_backend"):
                print(f"select: {path}: WARNING: measured on the host backend (host timings say nothing about a GPU)")
            if d.get("publish_every", K) != K:
                print(f"select: {path}: WARNING: publish_every {d['publish_every']}, the table's column says K = {K}")
            print(f"select: {', '.join(new)} from {path}")
        elif ("qwen3_cb" in d or {"no_capture_ms", "per_preset"} <= set(d)) and not any(k in d for k in D2H_BLOCKS):
            src = d.get("qwen3_cb", d)
            block = {k: src[k] for k in QWEN3_KEYS if k in src}
            block["source"] = {"file": os.path.basename(path), **{k: d[k] for k in STAMP[1:] if k in d}}
            out["qwen3_cb"] = block
            for k in STAMP:  # a file of qwen3_cb alone still names where it was measured
                if k not in out and k in d:
                    out[k] = d[k]
            miss = [k for k in QWEN3_KEYS if k not in block]
            print(f"select: qwen3_cb from {path}" + (f", missing {', '.join(miss)}" if miss else ""))
        else:
            sys.exit(f"select: {path}: neither ferry_bench_select's JSON nor bench/torch/qwen3_cb.py's")
    ordered = {k: out[k] for k in ORDER if k in out}
    _write(out_path, ordered, out)


# ---- carry -------------------------------------------------------------------------------------------------
def carry(old_path, new_path):
    """NEW_JSON with OLD_JSON's targets and anchors blocks (each file keeps its own layout: the blocks go after
    the stamp where the file is json.dump's output, else before its closing brace)."""
    old = _load(old_path) if os.path.exists(old_path) else {}
    blocks = {k: old[k] for k in KEPT if k in old}
    if not blocks:
        print(f"carry: {old_path}: no targets or anchors to carry")
        return
    with open(new_path) as fh:
        text = fh.read()
    new = json.loads(text)
    for indent in (1, 2, None):
        if json.dumps(new, indent=indent) + "\n" == text:
            head = {k: new[k] for k in STAMP if k in new}
            merged = {**head, **blocks, **{k: v for k, v in new.items() if k not in head and k not in blocks}}
            text = json.dumps(merged, indent=indent) + "\n"
            break
    else:
        body = text.rstrip()
        if not body.endswith("}"):
            sys.exit(f"carry: {new_path}: expected a JSON object, got text ending in {body[-20:]!r}")
        if any(k in new for k in blocks):
            sys.exit(f"carry: {new_path}: expected a run file without {', '.join(blocks)} (its layout is not "
                     "json.dump's: they cannot be replaced in place), got them")
        text = body[:-1].rstrip() + "".join(f',\n  "{k}": {json.dumps(v)}' for k, v in blocks.items()) + "\n}\n"
    with open(new_path, "w") as fh:
        fh.write(text)
    print(f"carry: {', '.join(blocks)} of {old_path} into {new_path}")


def main(argv):
    cmd, rest = (argv[1] if len(argv) > 1 else ""), argv[2:]
    if cmd == "d2h-summary" and len(rest) == 2:
        d2h_summary(*rest)
    elif cmd == "sinks" and rest:
        merge_sinks(rest[:-1], rest[-1])
    elif cmd == "select" and rest:
        merge_select(rest[:-1], rest[-1])
    elif cmd == "carry" and len(rest) == 2:
        carry(*rest)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
