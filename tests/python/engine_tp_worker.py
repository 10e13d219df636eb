# SPDX-License-Identifier: Apache-2.0
"""One rank of test_engine_tp.py: the tiny Qwen3 model loaded with transformers' TP plan (gloo, CPU), served by
continuous batching with a ferry.engine.Capture; each rank also keeps a witness of its own tapped tensors (plain
torch hooks) for the test to compare the assembled samples with.

    python engine_tp_worker.py MODEL_DIR OUT FORMAT TAPS WITNESS [manager]   (WITNESS.rank<r>.npz per rank)
"""
import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
from engine_support import Witness, cb_config, gen_config, prompts  # noqa: E402

import ferry.engine as fe  # noqa: E402

TAPS = {"mixed": lambda: [1, fe.Tap("up.1", "model.layers.1.mlp.up_proj")],
        "sharded": lambda: [fe.Tap("up.1", "model.layers.1.mlp.up_proj"),
                            fe.Tap("gate.2", "model.layers.2.mlp.gate_proj")],
        "z": lambda: [fe.Tap("z.1", "model.layers.1.self_attn.o_proj", "input")],
        "eagle3": lambda: "eagle3"}
LENGTHS, MAX_NEW = (9, 21, 5, 14), 6


def main() -> int:
    model_dir, out, fmt, taps, witness_path = sys.argv[1:6]
    manager = len(sys.argv) > 6 and sys.argv[6] == "manager"
    import datetime
    wait = datetime.timedelta(seconds=120)  # the test's TCPStore (ranks_support.run_ranks): a client of it
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False, timeout=wait)
    dist.init_process_group("gloo", store=store, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=wait)
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, tp_plan="auto", dtype=torch.float32).eval()
    cap = fe.Capture(model, taps=TAPS[taps](), out=out, format=fmt, backend="host")
    wit = Witness(model, cap.taps) if cap.taps and all(t.when == "output" for t in cap.taps) else None
    ps = prompts(LENGTHS, seed=3)
    specs = [fe.Spec("all"), fe.Spec((2, 12)), fe.Spec("prompt"), None]
    if manager:  # the manager path: only the driver's add_request counts, the others are no-ops
        with model.continuous_batching_context_manager(generation_config=gen_config(MAX_NEW), block=True, timeout=5,
                                                       continuous_batching_config=cb_config()) as m:
            cap.attach(m)
            ids = [cap.add_request(p, f"r{i}", capture=s, max_new_tokens=MAX_NEW) for i, (p, s) in
                   enumerate(zip(ps, specs))]
            got = 0
            while got < len(ps):
                o = m.get_result(timeout=1)
                got += o is not None and o.is_finished()
        ids = [f"r{i}" for i in range(len(ps))]
    else:
        res = cap.generate_batch(ps, generation_config=gen_config(MAX_NEW), capture=specs,
                                 continuous_batching_config=cb_config())
        ids = list(res)
    rep = cap.close()
    if wit is not None:
        wit.remove()
        arrays = {}
        for rid in ids:
            for i, t in enumerate(cap.taps):
                rows = wit.rows(rid, i)
                for p, row in rows.items():
                    arrays[f"{rid}|{t.name}|{p}"] = row.numpy()
        np.savez(f"{witness_path}.rank{dist.get_rank()}.npz", **arrays)
    print("report", json.dumps({k: rep[k] for k in ("samples", "complete", "incomplete", "tp")}))
    dist.destroy_process_group()
    return 0 if not rep.get("disabled") and not rep.get("lost") else 1


if __name__ == "__main__":
    sys.exit(main())
