# SPDX-License-Identifier: Apache-2.0
# One rank of test_tp.py's tensor-parallel MLP: python3 tp_worker.py MODEL.npz RUN_DIR (RANK, WORLD_SIZE,
# MASTER_ADDR and MASTER_PORT in the environment: the parent's TCPStore; gloo). The rank holds its
# slices of W1 (column-parallel: out-features rows) and W2 (row-parallel: in-features columns), captures its slice
# of act = relu(x @ W1.T) with its shard spec through its own host channel and safetensors sink, all-reduces the
# partial outputs into y = act @ W2.T and captures y on rank 0 only (replicated). Nothing is gathered.
import datetime
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

import ferry


def main(model: str, directory: str) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    m = np.load(model)
    w1, w2 = torch.from_numpy(m["w1"]), torch.from_numpy(m["w2"])  # [ffn, hidden], [hidden, ffn]
    part = w1.shape[0] // world
    w1_r = w1[rank * part:(rank + 1) * part].contiguous()     # column-parallel: this rank's out-features
    w2_r = w2[:, rank * part:(rank + 1) * part].contiguous()  # row-parallel: this rank's in-features
    schema = {0: ferry.tp.spec("mlp.act", torch.float32, (part,), dim=0, rank=rank, world=world)}
    if rank == 0:
        schema[1] = ("mlp.out", torch.float32, (w2.shape[0],))  # replicated: rank 0 captures it
    # the parent holds the rendezvous store (a port the OS chose: no race for a free port); a rank that waits on a
    # peer that died fails after 60 s instead of hanging
    wait = datetime.timedelta(seconds=60)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False, timeout=wait)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=wait)
    sink = ferry.sinks.safetensors(directory, schema)
    stream = ferry.Stream(backend="host")
    keep = []  # the captured tensors stay alive until the channel closed (the host backend copies on its thread)
    with ferry.Channel(backend="host", ring_bytes=1 << 20, sink=sink) as ch:
        for tag in m["tags"].tolist():
            x = torch.from_numpy(m[f"x{tag}"])
            ch.begin_forward(stream, tag=tag)
            act = torch.relu(x @ w1_r.T)
            ch.capture(0, act, stream)
            y = act @ w2_r.T  # this rank's partial sum of the output
            dist.all_reduce(y)
            if rank == 0:
                ch.capture(1, y, stream)
            ch.end_forward(stream)
            keep += [act, y]
    stats = sink.close()
    assert stats["first_error"] is None, stats
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
