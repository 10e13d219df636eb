# SPDX-License-Identifier: Apache-2.0
"""transformers continuous batching with ferry as its capture layer (issue 40's benchmark; a benchmark, not a test).

A Qwen3-0.6B-shaped model with random bf16 weights built from its config; per round, the same requests (prompt
lengths uniform in [--min-prompt, --max-prompt], --new-tokens each, greedy) through each contestant, in a fresh
random order per round; every contestant has its own copy of the model and its own persistent manager (its cache
and CUDA graphs made once, before the rounds):

- none:      no capture, CUDA graphs;
- naive:     what a user writes today: torch forward hooks that index the step's tokens and ``.cpu()`` them
             (synchronous; graphs off because the copy syncs), rows filed per request on the CPU, one safetensors
             file per request at the end (EAGLE-3 taps);
- eagle3:    ferry, EAGLE-3 taps (layers 2, N//2, N-3, final), prompt + generated tokens, per-request files on disk;
- all-layers: ferry, every hidden state (N + 1 taps), every token, per-request files on disk;
- eagle3@shm, all-layers@shm: the same, the files on /dev/shm (no disk); eagle3@null, all-layers@null: the same
             samples assembled, none written (where a disk contestant's cost goes; printed and kept under
             "variants", not verified against the plain forward);
- sae:       ferry, one middle layer's residual, every token, to a shared-memory stream read by another process
             (``--reader``: ferry.engine.stream_rows, every row's request and position checked, a few requests' rows
             kept for the verification).

tokens/s = (prompt + generated tokens) / wall time from the first add_request to the last result: the engine's
serving rate. A round of a ferry contestant then waits until every sample is written; that tail (a round's last
requests finish together, so their samples are written after the engine went idle, which a serving engine overlaps
with its next requests) is reported apart: ``write_tail_s`` and ``ferry_tok_s_written`` (tokens over the time until
the last sample is written). After the rounds
every ferry sample of the last round is verified: its positions and token ids, and each row against the plain
forward of its sequence (cosine >= 0.99 with its own row; a row closer to another position's reference counts as
misattributed). The disk's sequential write rate is measured in the same run (dd-like, O_DIRECT off, fsync).
Writes a JSON (engine.json's fields) to --json and a log to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
import transformers
from transformers import GenerationConfig

import ferry
import ferry.engine as fe
from ferry.cli import embedded_model  # the Qwen3-0.6B-shaped model with seeded random bf16 weights

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "torch"))
from qwen3bench.timing import write_rate  # noqa: E402  (bench/torch's helpers: the medium's write rate)


STEPS = {}  # id(model) -> [steps, seconds in compute_batch, seconds of it in ferry's part (outside the model's)]


def time_steps():
    """Times every ``ModelRunner.compute_batch`` per model, and the part of a ferry step outside the original
    compute_batch (its selection, upload, plan and producer handover): the host cost ferry adds to a step."""
    from transformers.generation.continuous_batching import model_runner as mr
    from ferry.engine import step as fstep

    fstep.runner_patch()
    outer = mr.ModelRunner.compute_batch
    inner = fstep.StepCapture._compute_batch

    def compute_batch(self, model, batch_data):
        t0 = time.perf_counter()
        try:
            return outer(self, model, batch_data)
        finally:
            st = STEPS.setdefault(id(model), [0, 0.0, 0.0])
            st[0] += 1
            st[1] += time.perf_counter() - t0

    def ferry_step(cap, runner, model, batch_data, orig):
        t0, spent = time.perf_counter(), [0.0]

        def timed(*a):
            t = time.perf_counter()
            try:
                return orig(*a)
            finally:
                spent[0] += time.perf_counter() - t
        try:
            return inner(cap, runner, model, batch_data, timed)
        finally:
            STEPS.setdefault(id(model), [0, 0.0, 0.0])[2] += time.perf_counter() - t0 - spent[0]

    def part(k, fn):  # seconds of ferry's host part in one of its methods: STEPS[...][3 + k]
        def timed_part(cap, *a, **kw):
            t = time.perf_counter()
            try:
                return fn(cap, *a, **kw)
            finally:
                st = STEPS.setdefault(id(cap.model), [0, 0.0, 0.0])
                st.extend([0.0] * (6 - len(st)))
                st[3 + k] += time.perf_counter() - t
        return timed_part

    upload = fstep.StepCapture._upload.__wrapped__  # the generator under the contextmanager

    def upload_gen(cap, step, stream):  # the upload before the step (enter) and the publisher's close after it
        g = upload(cap, step, stream)  # the generator: nothing runs until next()
        part(1, lambda c: next(g))(cap)
        try:
            yield
        finally:
            part(1, lambda c: next(g, None))(cap)

    compute_batch._ferry_orig = outer._ferry_orig
    mr.ModelRunner.compute_batch = compute_batch
    fstep.StepCapture._compute_batch = ferry_step
    fstep.StepCapture._select = part(0, fstep.StepCapture._select)
    fstep.StepCapture._upload = contextlib.contextmanager(upload_gen)
    fstep.StepCapture._release = part(2, fstep.StepCapture._release)


def host_parts(c):
    """us per step of ferry's host part: select, upload (the publisher, both halves), release, and the rest (the
    plan, the graph lookup)."""
    out = {}
    for k, name in enumerate(("select", "upload", "release")):
        out[name] = statistics.median(x[3 + k] / max(x[0], 1) for x in c.steps if len(x) > 5) * 1e6 \
            if any(len(x) > 5 for x in c.steps) else 0.0
    out["plan_and_rest"] = max(statistics.median(x[2] / max(x[0], 1) for x in c.steps) * 1e6 - sum(out.values()), 0.0)
    return out


def tiny_cpu_model():
    cfg = transformers.Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, vocab_size=256, tie_word_embeddings=True)
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()


def cb_config(args, graphs):
    graphs = graphs and torch.cuda.is_available()
    return fe.cb_config(use_cuda_graph=graphs, num_blocks=args.blocks, max_batch_tokens=args.batch_tokens,
                        max_requests_per_batch=args.max_requests, page_size=256)


class Contestant:
    """One contestant: its own model copy, its Capture (ferry contestants: made before the manager's warm-up, so
    the CUDA graphs hold ferry's kernels and plans) and its persistent manager, warmed up once."""

    def __init__(self, name, model, args, graphs, capture=None, out=None):
        self.name, self.model, self.args, self.capture_kind, self.out = name, model, args, capture, out
        self.cap = None
        self.gc = GenerationConfig(max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
        self.reader = None
        kind, _, variant = (capture or "").partition("@")
        if kind in ("eagle3", "all-layers"):
            if variant == "shm":
                out = os.path.join("/dev/shm", f"ferry-engine-bench-{os.getpid()}", name)
                self.out = out
            self.cap = fe.Capture(model, taps=kind, out=out, overwrite=True, ring_bytes=args.ring_mib << 20)
            if variant == "null":  # assembled, not written
                self.cap.assembler.writer.write = lambda sample: None
            elif variant not in ("", "shm"):
                raise SystemExit(f"cb_capture: expected a contestant variant '@shm' or '@null', got {capture!r}")
        elif capture == "sae":
            name = f"ferry-bench-{os.getpid()}"
            sink = ferry.sinks.shm_stream(name, staging_bytes=256 << 20, descriptors=1 << 14)
            self.cap = fe.Capture(model, taps="sae", out=sink, ring_bytes=256 << 20)
            os.makedirs(out, exist_ok=True)
            self.reader_out = os.path.join(out, "reader.json")
            self.reader = subprocess.Popen([sys.executable, __file__, "--reader", name, "--json", self.reader_out])
        self.manager = model.init_continuous_batching(generation_config=self.gc,
                                                      continuous_batching_config=cb_config(args, graphs))
        if self.cap is not None:
            self.cap.attach(self.manager)
        self.naive = Naive(model, fe.resolve_taps(model, "eagle3")) if capture == "naive" else None
        self.tok_s, self.cpu_s, self.steps, self.round, self.expected = [], [], [], 0, 0
        self.written_tok_s, self.tail_s = [], []  # tokens over the time until every sample is written; that tail
        t0 = time.perf_counter()
        if graphs:
            self.manager.warmup()
        self.manager.start()
        self.warmup_s = time.perf_counter() - t0

    def _written(self):
        if self.cap.assembler is None:  # a stream: the reader process has them once the channel drained them
            st = self.cap.ch.stats()
            return self.expected if st["entries_drained"] >= st["entries_reserved"] else -1
        r = self.cap.assembler.report
        return r["samples"] + len(r["lost"]) + len(r["dropped"])

    def run(self, prompts):
        """One round: every prompt through this contestant's manager, until every result is back and (ferry)
        every sample is written; returns (tokens/s, outputs, report so far)."""
        m = self.manager
        ids = [f"{self.name}-{self.round}-{i}" for i in range(len(prompts))]
        if self.naive is not None:
            self.naive.begin(m)
        self._prune()
        STEPS.pop(id(self.model), None)
        t0, c0 = time.perf_counter(), time.process_time()
        for rid, p in zip(ids, prompts):
            if self.cap is not None:
                self.cap.add_request(p, request_id=rid, capture=fe.Spec("all"), max_new_tokens=self.args.new_tokens)
            else:
                m.add_request(p, request_id=rid, max_new_tokens=self.args.new_tokens)
        outs = {}
        while len(outs) < len(ids):
            o = m.get_result(timeout=60)
            if o is None:
                raise RuntimeError(f"{self.name}: no result in 60 s ({len(outs)}/{len(ids)})")
            if o.is_finished():
                outs[o.request_id] = o
        t_res = time.perf_counter() - t0  # the last result: the engine's part of the round
        if self.naive is not None:
            self.naive.end(os.path.join(self.out, f"r{self.round}"), outs)
        rep = None
        if self.cap is not None:
            self.expected += len(ids)
            end = time.perf_counter() + 120
            while self._written() < self.expected and time.perf_counter() < end:
                time.sleep(0.001)
            rep = dict(self.cap.assembler.report) if self.cap.assembler is not None else None
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        self.steps.append(STEPS.get(id(self.model), [0, 0.0, 0.0]))
        toks = sum(len(o.prompt_ids) + len(o.generated_tokens) for o in outs.values())
        self.tok_s.append(toks / t_res)
        self.written_tok_s.append(toks / dt)
        self.tail_s.append(dt - t_res)
        self.cpu_s.append(cpu)
        self.round += 1
        return toks / t_res, outs, rep, dt

    def _prune(self):
        """The disk contestants keep one round's files (the last one is verified): a round of every layer's
        residual is about 20 GB at 512 requests."""
        if self.out is None or not os.path.isdir(self.out) or self.round < 1:
            return
        old = f"{self.name}-{self.round - 1}-"
        for n in os.listdir(self.out):
            if n.startswith(old) and n.endswith(".safetensors"):
                os.unlink(os.path.join(self.out, n))

    def close(self):
        self.manager.stop(block=True)
        rep = self.cap.close() if self.cap is not None else None
        if self.name.endswith("@shm"):  # not verified: its files go with it
            shutil.rmtree(os.path.dirname(self.out), ignore_errors=True)
        if self.reader is not None:
            self.reader.wait(timeout=120)
            with open(self.reader_out) as f:
                rep["reader"] = json.load(f)
        return rep


class Naive:
    """torch forward hooks: the step's real tokens of each tap, ``.cpu()`` per step (synchronous), filed per
    request on the CPU from the batch's requests; one safetensors file per request at the end."""

    def __init__(self, model, taps):
        self.model, self.taps, self.rows = model, taps, {}
        self.handles, self.batch = [], None
        mods = dict(model.named_modules())
        for i, t in enumerate(taps):
            self.handles.append(mods[t.module].register_forward_hook(self._hook(i)))
        from transformers.generation.continuous_batching import input_outputs as io
        orig = io.ContinuousBatchingIOs.prepare_batch_tensors
        naive = self

        def prepare(io_self, requests_in_batch, *a, **k):
            r = orig(io_self, requests_in_batch, *a, **k)
            if getattr(io_self, "_naive_model", None) is naive.model or naive.active:
                naive.batch = [(fs.state.request_id, int(fs.query_length), int(fs.state.position_offset))
                               for fs in requests_in_batch]
            return r

        self.active = False
        io.ContinuousBatchingIOs.prepare_batch_tensors = prepare

    def _hook(self, i):
        def hook(mod, args, out):
            if not self.active or self.batch is None:
                return
            o = out[0] if isinstance(out, tuple) else out
            n = sum(q for _, q, _ in self.batch)
            rows = o.reshape(-1, o.shape[-1])[:n].cpu()  # the user's copy: synchronous
            row = 0
            for rid, q, end in self.batch:
                self.rows.setdefault(rid, {}).setdefault(i, []).append((end - q, rows[row:row + q]))
                row += q
        return hook

    def begin(self, manager):
        self.rows, self.active = {}, True

    def end(self, out_dir, outs):
        from safetensors.torch import save_file
        self.active = False
        os.makedirs(out_dir, exist_ok=True)
        for rid, per_tap in self.rows.items():
            hs = []
            for i in range(len(self.taps)):
                parts = sorted(per_tap.get(i, []), key=lambda x: x[0])
                hs.append(torch.cat([p for _, p in parts]))
            save_file({"hidden_states": torch.stack(hs, dim=1).contiguous()}, os.path.join(out_dir, f"{rid}.safetensors"))


def verify(model, out_dir, outs, taps, sample_limit):
    """Every sample's positions and token ids; each row against the plain forward of ``model`` (the untouched base
    model: sdpa attention, the same weights), up to sample_limit samples. Returns (samples, bad, misattributed,
    checked_rows)."""
    ref = model
    names = [t.name for t in taps]
    n_layers = model.config.num_hidden_layers
    from safetensors import safe_open

    samples = bad = mis = rows = 0
    k = -1
    with open(os.path.join(out_dir, "samples.jsonl")) as f:
        listed = [json.loads(x) for x in f if x.strip()]
    for rec in listed:
        o = outs.get(rec.get("request_id"))
        if o is None:  # an earlier round's sample (its file is pruned) or the run's header line
            continue
        with safe_open(os.path.join(out_dir, rec["file"]), framework="pt") as fh:  # as a user reads it
            meta = fh.metadata()
            t = {n: fh.get_tensor(n) for n in ("hidden_states", "token_ids", "positions")}
        k += 1
        samples += 1
        seq = list(o.prompt_ids) + list(o.generated_tokens)
        pos = t["positions"]
        ok = meta["complete"] == "true" and pos.tolist() == list(range(len(seq) - 1)) and \
            t["token_ids"].tolist() == seq[:-1]
        if ok and k < sample_limit:
            with torch.no_grad():
                hs = ref(torch.tensor([seq[:-1]], device=model.device), output_hidden_states=True).hidden_states
            got = t["hidden_states"].to(model.device).float()
            for j, name in enumerate(names):
                if name == "final":
                    r = hs[n_layers][0]
                elif name == "embeddings":
                    r = hs[0][0]
                else:
                    li = int(name.split(".")[1])
                    if li >= n_layers - 1:
                        continue
                    r = hs[li + 1][0]
                r = r.float()
                g = got[:, j]
                cos = torch.nn.functional.cosine_similarity(g, r, dim=-1)
                rows += len(cos)
                if (cos < 0.99).any():
                    ok = False
                    shifted = torch.nn.functional.cosine_similarity(g[1:], r[:-1], dim=-1)
                    mis += int((shifted > cos[1:]).sum())
        bad += not ok
    return samples, bad + max(0, len(outs) - samples), mis, rows  # a request without its sample is a bad one


BLOCKS = ("eagle3", "sae_shm", "all_layers_disk", "naive")


def merge(paths, out):
    """engine.json from several runs of this benchmark: each block (its contestant and the no-capture contestant
    of the same run) as its run measured it, with that run's command, commit and date; a top-level list of runs."""
    res = {"runs": []}
    for p in paths:
        with open(p) as f:
            r = json.load(f)
        run = {k: r.get(k) for k in ("device", "commit", "date", "command", "requests", "rounds", "transformers",
                                      "no_capture_tok_s_rounds", "disk_write_gbps", "steps")}
        run["blocks"] = [b for b in BLOCKS if b in r]
        res["runs"].append(run)
        for k in ("device", "commit", "date", "command", "requests", "transformers"):
            res.setdefault(k, r.get(k))
        for b in run["blocks"]:
            res[b] = dict(r[b], run=len(res["runs"]) - 1)
        res["misattributed"] = res.get("misattributed", 0) + r.get("misattributed", 0)
    if "naive" in res and "eagle3" in res:
        res["eagle3"]["naive_tok_s"] = res["naive"]["naive_tok_s"]
    devices = {r["device"] for r in res["runs"]}
    if len(devices) != 1:
        raise SystemExit(f"merge: expected runs on one device, got {sorted(devices)}")
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))


def written_block(c, none_tok_s):
    """A ferry contestant's rate until its last sample is written, and that tail past the last result (medians)."""
    w = statistics.median(c.written_tok_s)
    return {"ferry_tok_s_written": w, "ratio_written": w / none_tok_s if none_tok_s else None,
            "write_tail_s": statistics.median(c.tail_s), "write_tail_s_rounds": c.tail_s}


def reader_main(name, out):
    """The stream's reader process: every (step, tap, request, first position, rows) of the run; per request the
    positions seen (each once), and the rows of every 16th request of a round (for verification)."""
    reader = fe.open_reader(name)
    seen, dup, rows_kept, n_rows = {}, 0, {}, 0
    with reader:
        for step, tap, h, p0, rows in fe.stream_rows(reader):
            if rows is None:
                seen.setdefault(h, set()).add(-1)
                continue
            n = rows.shape[0]
            n_rows += n
            s_ = seen.setdefault(h, set())
            for p in range(p0, p0 + n):
                dup += p in s_
                s_.add(p)
            if int(h.rsplit("-", 1)[1]) % 16 == 0:  # ids "<contestant>-<round>-<i>"
                rows_kept.setdefault(h, []).append((p0, np.array(rows)))
    kept = {}
    for h, parts in rows_kept.items():
        parts.sort(key=lambda x: x[0])
        kept[str(h)] = [parts[0][0], np.concatenate([p for _, p in parts]).tolist()]
    with open(out, "w") as f:
        json.dump({"requests": {str(h): [min(v), max(v), len(v)] for h, v in seen.items()}, "duplicates": dup,
                   "rows": n_rows, "kept": kept}, f)


def verify_stream(model, rep, outs_by_round, names):
    """The reader's view against the outputs: every request of every round seen at positions 0 .. len - 2 exactly
    once; the kept requests' rows against the plain forward (cosine >= 0.99). Returns (samples, bad, mis, rows)."""
    rd = rep["reader"]
    samples = bad = mis = rows = 0
    layer = int(names[0].split(".")[1])
    for h, (lo, hi, n) in rd["requests"].items():
        o = outs_by_round.get(h)  # the reader's keys are the engine's request ids
        samples += 1
        if o is None:
            bad += 1
            continue
        L = len(o.prompt_ids) + len(o.generated_tokens) - 1
        ok = lo == 0 and hi == L - 1 and n == L
        k = rd["kept"].get(h)
        if ok and k is not None:
            seq = list(o.prompt_ids) + list(o.generated_tokens)
            with torch.no_grad():
                hs = model(torch.tensor([seq[:-1]], device=model.device), output_hidden_states=True).hidden_states
            ref = hs[layer + 1][0].float()
            got = torch.tensor(np.array(k[1], dtype=np.uint8)).view(torch.bfloat16).to(model.device).float()
            got = got.reshape(ref.shape[0], -1)
            cos = torch.nn.functional.cosine_similarity(got, ref, dim=-1)
            rows += len(cos)
            ok = bool((cos >= 0.99).all())
            if not ok:
                shifted = torch.nn.functional.cosine_similarity(got[1:], ref[:-1], dim=-1)
                mis += int((shifted > cos[1:]).sum())
        bad += not ok
    return samples, bad, mis, rows


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--reader":
        return reader_main(sys.argv[2], sys.argv[4])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--min-prompt", type=int, default=64)
    ap.add_argument("--max-prompt", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup-requests", type=int, default=64, help="requests of the warm-up round (not counted)")
    ap.add_argument("--merge", nargs="+", metavar="RUN.json", help="no run: merge these runs' JSONs (each with its "
                    "own no-capture contestant, e.g. none,eagle3,sae in one device call and none,all-layers,naive "
                    "in the next) into --json")
    ap.add_argument("--contestants", default="none,eagle3,all-layers,sae,naive")
    ap.add_argument("--blocks", type=int, default=256)
    ap.add_argument("--batch-tokens", type=int, default=1024)
    ap.add_argument("--max-requests", type=int, default=128)
    ap.add_argument("--ring-mib", type=int, default=1024)
    ap.add_argument("--out", default="/tmp/ferry-engine-bench")
    ap.add_argument("--verify", type=int, default=1 << 30, help="samples of each ferry contestant checked against "
                    "the plain forward (default: all; all are checked for positions and token ids)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.merge:
        return merge(args.merge, args.json)

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    time_steps()
    base = embedded_model("0.6b", "cuda") if dev.type == "cuda" else tiny_cpu_model()  # CPU: a dry run of the harness
    names = args.contestants.split(",")
    shutil.rmtree(args.out, ignore_errors=True)
    cs = []
    for n in names:
        m = copy.deepcopy(base)
        graphs = n != "naive"
        cs.append(Contestant(n, m, args, graphs, capture=n if n != "none" else None, out=os.path.join(args.out, n)))
    for c in cs:
        print(f"{c.name}: warm-up (graphs) {c.warmup_s:.1f} s", flush=True)
    rng = random.Random(0)
    vocab = base.config.vocab_size
    prompts_all = [[[rng.randrange(1, vocab) for _ in range(rng.randint(args.min_prompt, args.max_prompt))]
                    for _ in range(args.warmup_requests if r == 0 else args.requests)] for r in range(args.rounds + 1)]
    print(f"ferry engine bench: {torch.cuda.get_device_name() if dev.type == 'cuda' else 'CPU dry run'}, transformers {transformers.__version__}, torch "
          f"{torch.__version__}, {args.requests} requests x {args.rounds} rounds (+1 warm-up), contestants {names}",
          flush=True)
    last, written, all_outs = {}, {}, {}
    for r in range(args.rounds + 1):
        order = list(cs)
        rng.shuffle(order)
        for c in order:
            before = c.cap.writer.bytes_written if c.cap is not None and c.cap.writer is not None else 0
            tps, outs, rep, dt = c.run(prompts_all[r])
            if r == 0:
                c.tok_s.clear()
                c.written_tok_s.clear()
                c.tail_s.clear()
                c.cpu_s.clear()
                c.steps.clear()
            last[c.name] = outs
            all_outs.setdefault(c.name, {}).update(outs)
            extra = ""
            if rep is not None and c.cap.writer is not None:
                gb = (c.cap.writer.bytes_written - before) / 1e9
                if r:
                    written.setdefault(c.name, []).append(gb / dt)
                extra = f" samples {rep['samples']} complete {rep['complete']} lost {len(rep['lost'])} dropped " \
                    f"{len(rep['dropped'])}, {gb:.2f} GB written ({gb / dt:.2f} GB/s)"
            tail = f", samples written {c.tail_s[-1]:.2f} s after the last result" if c.cap is not None and c.tail_s else ""
            print(f"round {r}{' (warm-up)' if r == 0 else ''} {c.name:>10}: {tps:,.0f} tokens/s{extra}{tail}",
                  flush=True)
    reports = {c.name: c.close() for c in cs}
    disk = write_rate(os.path.join(args.out, "disk"), 2 << 30)
    res = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "commit": os.environ.get("FERRY_COMMIT", "unknown"),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv),
           "requests": args.requests, "rounds": args.rounds, "transformers": transformers.__version__}
    tps = {c.name: c.tok_s for c in cs}
    med = {k: statistics.median(v) for k, v in tps.items()}
    for c in cs:
        print(f"{c.name:>10}: median {med[c.name]:,.0f} tokens/s over {len(c.tok_s)} rounds "
              f"[{min(c.tok_s):,.0f} .. {max(c.tok_s):,.0f}], process CPU {statistics.median(c.cpu_s):.1f} s/round, "
              f"{statistics.median(x[0] for x in c.steps):,.0f} steps/round, compute_batch "
              f"{statistics.median(x[1] / max(x[0], 1) for x in c.steps) * 1e3:.2f} ms/step, of it ferry's host part "
              f"{statistics.median(x[2] / max(x[0], 1) for x in c.steps) * 1e6:.0f} us/step "
              f"({', '.join(f'{k} {v:.0f}' for k, v in host_parts(c).items())})"
              + (f"; until every sample is written {statistics.median(c.written_tok_s):,.0f} tokens/s (tail "
                 f"{statistics.median(c.tail_s):.2f} s)" if c.cap is not None else ""))
    mis_total = 0
    for name, taps_name in (("eagle3", "eagle3"), ("all-layers", "all-layers")):
        if name not in med:
            continue
        outs, rep = last[name], reports[name]
        c = next(x for x in cs if x.name == name)
        taps = fe.resolve_taps(c.model, taps_name)
        s, bad, mis, rows = verify(base, os.path.join(args.out, name), outs, taps, args.verify)
        mis_total += mis
        block = {"no_capture_tok_s": med.get("none"), "ferry_tok_s": med[name], "ratio": med[name] / med["none"]
                 if "none" in med else None, "samples": s, "samples_bad": bad, "rows_checked": rows,
                 "tok_s_rounds": tps[name], **written_block(c, med.get("none"))}
        if name == "eagle3":
            block["naive_tok_s"] = med.get("naive")
            res["eagle3"] = block
        else:
            block["sink_write_gbps"] = statistics.median(written[name])
            block["disk_write_gbps"] = disk
            res["all_layers_disk"] = block
        print(f"{name}: {s} samples, {bad} bad, {mis} misattributed rows, {rows} rows checked against the plain "
              f"forward", flush=True)
    variants = {c.name: {"ferry_tok_s": med[c.name], "ratio": med[c.name] / med["none"] if "none" in med else None,
                         "tok_s_rounds": tps[c.name], "process_cpu_s": statistics.median(c.cpu_s),
                         "samples": reports[c.name]["samples"], **written_block(c, med.get("none"))}
                for c in cs if "@" in c.name}
    if variants:
        res["variants"] = variants
    if "sae" in med:
        c = next(x for x in cs if x.name == "sae")
        s_, bad, mis, rows = verify_stream(base, reports["sae"], all_outs["sae"], c.cap.names)
        mis_total += mis
        res["sae_shm"] = {"no_capture_tok_s": med.get("none"), "ferry_tok_s": med["sae"],
                          "ratio": med["sae"] / med["none"] if "none" in med else None, "samples": s_,
                          "samples_bad": bad, "rows_checked": rows, "tok_s_rounds": tps["sae"],
                          **written_block(c, med.get("none")),
                          "reader_rows": reports["sae"]["reader"]["rows"],
                          "reader_duplicates": reports["sae"]["reader"]["duplicates"]}
        print(f"sae (shm): {s_} requests seen by the reader, {bad} bad, {mis} misattributed rows, {rows} rows "
              f"checked against the plain forward", flush=True)
    res["no_capture_tok_s_rounds"] = tps.get("none")
    res["misattributed"] = mis_total
    res["disk_write_gbps"] = disk
    res["steps"] = {c.name: {"steps_per_round": statistics.median(x[0] for x in c.steps),
                             "compute_batch_ms": statistics.median(x[1] / max(x[0], 1) for x in c.steps) * 1e3,
                             "ferry_host_us": statistics.median(x[2] / max(x[0], 1) for x in c.steps) * 1e6,
                             "ferry_host_parts_us": host_parts(c)}
                    for c in cs if c.steps}
    if "naive" in med:
        res["naive"] = {"naive_tok_s": med["naive"], "no_capture_tok_s": med.get("none"),
                        "ratio": med["naive"] / med["none"] if "none" in med else None, "tok_s_rounds": tps["naive"],
                        "command": res["command"], "commit": res["commit"], "date": res["date"]}
    print(json.dumps(res, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
