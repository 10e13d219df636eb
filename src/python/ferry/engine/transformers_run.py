# SPDX-License-Identifier: Apache-2.0
"""``Capture.generate_batch``: transformers' ``generate_batch`` loop (a manager in a context, every request added,
results collected until each finished) with the capture attached to the manager and a spec per request."""

from __future__ import annotations

import inspect
from typing import Any

from .spec import Spec


def _specs(capture: Any, n: int) -> list:
    from .. import LogicError
    if capture is None or isinstance(capture, Spec):
        return [capture] * n
    specs = list(capture)
    if len(specs) != n:
        raise LogicError(f"ferry.engine.generate_batch: expected one capture spec (or None) per input, {n}, got "
                         f"{len(specs)}")
    return specs


def cb_config(**kwargs: Any) -> Any:
    """A ``ContinuousBatchingConfig`` for capture: ``allow_block_sharing=False`` unless given, and ``page_size``
    passed as this transformers names it (``block_size`` before 5.2x)."""
    from transformers import ContinuousBatchingConfig

    kwargs.setdefault("allow_block_sharing", False)
    params = inspect.signature(ContinuousBatchingConfig).parameters
    if "page_size" in kwargs and "page_size" not in params:
        kwargs["block_size"] = kwargs.pop("page_size")
    return ContinuousBatchingConfig(**kwargs)


def _cb_config(cap: Any, cfg: Any) -> Any:
    """The continuous batching config with block (prefix) sharing off: a shared prefix is never run through the
    model again, so its hidden states would be missing."""
    from .. import LogicError

    if cfg is None:
        return cb_config()
    if getattr(cfg, "allow_block_sharing", False):
        from .transformers import PREFIX_SHARING
        raise LogicError(PREFIX_SHARING)
    return cfg


def generate_batch(cap: Any, inputs: list, generation_config: Any, capture: Any, cb_config: Any,
                   max_new_tokens: int | None, warmup: bool, progress: Any) -> dict:
    model = cap.model
    inputs = [list(map(int, x)) for x in inputs]
    specs = _specs(capture, len(inputs))
    gen_cfg = model.generation_config if generation_config is None else generation_config
    if getattr(gen_cfg, "num_return_sequences", None) not in (None, 1):
        from .. import LogicError
        raise LogicError(f"ferry.engine.generate_batch: expected num_return_sequences 1 (forked children share "
                         f"their parent's prompt cache), got {gen_cfg.num_return_sequences}")
    max_new = gen_cfg.max_new_tokens if max_new_tokens is None else max_new_tokens
    base = cap._batch_ids  # ids go on across calls: a Capture refuses an id twice
    ids = [f"req_{base + i}" for i in range(len(inputs))]
    cap._batch_ids = base + len(inputs)
    driver = cap.tp is None or cap.tp.rank == 0  # under TP the other ranks get each spec with its request
    for rid, x, s in zip(ids, inputs, specs):
        if driver:
            cap.register(rid, x, max_new, s)
    kwargs: dict[str, Any] = dict(generation_config=generation_config, block=True, timeout=5,
                                  continuous_batching_config=_cb_config(cap, cb_config), warmup=warmup)
    params = inspect.signature(model.continuous_batching_context_manager).parameters
    if "workload_hints" in params:
        from transformers.generation.continuous_batching.continuous_api import WorkloadHints
        kwargs["workload_hints"] = WorkloadHints(max_prompt_length=max(len(x) for x in inputs),
                                                 max_generated_length=max_new or 0, num_requests=len(inputs))
    kwargs = {k: v for k, v in kwargs.items() if k in params}
    results: dict = {}
    mgr_cm = model.continuous_batching_context_manager(**kwargs)
    with mgr_cm as manager:
        cap.attach(manager)
        for rid, x in zip(ids, inputs):
            manager.add_request(x, request_id=rid, max_new_tokens=max_new)
        while len(results) < len(inputs):
            out = manager.get_result(timeout=1)
            if out is not None:
                if out.is_finished():
                    results[out.request_id] = out
                    if progress is not None:
                        progress(out)
            elif not manager.is_running():
                break
    return {rid: results[rid] for rid in ids if rid in results}
