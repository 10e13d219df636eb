# SPDX-License-Identifier: Apache-2.0
# The native sinks behind a CUDA-backend channel (skipped without a CUDA build, a GPU or torch): the safetensors
# sink and the shared-memory stream get torch CUDA tensors captured eagerly and from a replayed torch.cuda.graph;
# every tensor read back (ferry.shards, the safetensors package, a reader process) is compared bit-exact with the
# source. The host-backend suites (test_sink_safetensors.py, test_shm_stream.py) test the protocols and faults;
# these test the CUDA staging (pinned, and host-registered shared memory for the stream).
import hashlib
import os

import numpy as np
import pytest
from test_shm_stream import Reader  # the reader process of the host suite (it needs no GPU)

import ferry

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif("cuda" not in ferry.available_backends() or not torch.cuda.is_available(),
                                reason="needs ferry built with FERRY_PYTHON_CUDA=ON, a GPU and torch")

SCHEMA = {0: ("resid", np.float32, (64,)), 1: ("token_ids", np.int64, ()), 2: ("attn", np.uint16, (32,))}


def sources(step, rows=3):
    """The step's three CUDA tensors (random, never all zero; bf16 travels as its uint16 bits)."""
    g = torch.Generator(device="cuda").manual_seed(1234 + step)
    resid = torch.randn(rows, 64, device="cuda", generator=g) + 1.0
    ids = torch.randint(1, 1 << 40, (rows,), device="cuda", generator=g)
    attn = torch.randn(rows, 32, device="cuda", generator=g).to(torch.bfloat16).view(torch.int16)
    return resid, ids, attn


def capture_step(ch, s, step, tensors):
    ch.begin_forward(s, tag=500 + step)
    for h, t in enumerate(tensors):
        ch.capture(h, t, s)
    ch.end_forward(s)


def expected(tensors):
    resid, ids, attn = (t.cpu().numpy() for t in tensors)
    return {"resid": resid, "token_ids": ids, "attn": attn.view(np.uint16)}


def test_safetensors_sink_writes_eager_and_graphed_cuda_captures_bit_exact(tmp_path):
    run_dir = str(tmp_path / "run")
    s = torch.cuda.Stream()
    want = {}
    with ferry.sinks.safetensors(run_dir, SCHEMA, shard_bytes=4 << 10) as sink, \
            ferry.Channel(0, ring_bytes=1 << 20, publish_every=2, backend="cuda", sink=sink) as ch:
        with torch.cuda.stream(s):
            for step in range(4):  # eager
                src = sources(step)
                capture_step(ch, s, step, src)
                want[500 + step] = expected(src)
            static = [t.clone() for t in sources(100)]  # the graph's inputs: refilled before each replay
            for w in range(2):
                capture_step(ch, s, 90 + w, static)  # warm-up on the side stream (torch's rule): tags 590, 591
            s.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                ch.begin_forward(s)
                for h, t in enumerate(static):
                    ch.capture(h, t, s)
                plan = ch.end_forward(s)
            for step in range(4, 10):  # replays, the data changing every step
                for dst, src in zip(static, sources(step)):
                    dst.copy_(src)
                ch.plan(plan, tag=500 + step)
                g.replay()
                want[500 + step] = expected(static)
                s.synchronize()  # the next step overwrites the inputs
    assert sink.stats()["failed_entries"] == 0 and sink.stats()["refused_entries"] == 0
    run = ferry.shards.open(run_dir)
    assert run.complete and len(run.shards) > 1  # 4 KiB shards (about 1 KiB per forward): several
    got = {}
    for tag, hook, array in run:
        got.setdefault(tag, {})[hook] = array
    for tag, arrays in want.items():
        for hook, a in arrays.items():
            np.testing.assert_array_equal(got[tag][hook], a, err_msg=f"tag {tag} hook {hook}")
    # the safetensors package reads the same tensors
    st = pytest.importorskip("safetensors.numpy")
    seen = 0
    for shard in run.shards:
        tensors = st.load_file(os.path.join(run_dir, shard))
        for name, a in tensors.items():
            tag = int(name.split("/")[0])
            if tag in want:
                np.testing.assert_array_equal(a, want[tag][name.split("/")[1]])
                seen += 1
    assert seen == 3 * len(want)


def test_shm_stream_delivers_cuda_captures_to_a_reader_process_bit_exact(tmp_path):
    name = f"pytest-cuda-{tmp_path.name}"[:100]
    s = torch.cuda.Stream()
    digests = []
    with ferry.sinks.shm_stream(name, staging_bytes=256 << 10, descriptors=32, timeout=30) as sink:
        reader = Reader(name, count=60)
        try:
            assert reader.line()[0] == "attached"
            with ferry.Channel(0, ring_bytes=1 << 20, publish_every=3, backend="cuda", sink=sink) as ch, \
                    torch.cuda.stream(s):
                for step in range(20):
                    src = sources(step, rows=7)
                    capture_step(ch, s, step, src)
                    digests += [hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest() for t in src]
            recs, last = reader.until("done")
        finally:
            reader.close()
    assert len(recs) == 60
    for i, (index, hook, seq, forward, tag, status, digest) in enumerate(recs):
        assert (index, hook, seq, forward, tag, status) == (i, i % 3, i, i // 3, 500 + i // 3, "ok")
        assert digest == digests[i], f"entry {i}: the reader's bytes differ from the CUDA source"
