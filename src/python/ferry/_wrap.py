# SPDX-License-Identifier: Apache-2.0
"""ferry.hooks.install(via="forward")'s handle: a module's forward wrapped (an instance attribute) so that a call
skips torch's hook dispatch, restored by remove()."""

from __future__ import annotations

from typing import Any


class Wrapped:
    """install(via="forward")'s handle: the module's forward wrapped to call a hook function of _hook_fn."""

    def __init__(self, module: Any, name: str, when: str, fn: Any) -> None:
        self.module, self.name = module, name
        self.prev = module.__dict__.get("forward")  # an instance forward of its own (another wrap), else None
        orig = module.forward
        if when == "input":
            def forward(*args, **kwargs):
                fn(module, args, kwargs)
                return orig(*args, **kwargs)
        else:
            def forward(*args, **kwargs):
                out = orig(*args, **kwargs)
                fn(module, args, out)
                return out
        self.forward = forward
        module.forward = forward

    def remove(self) -> None:
        m = self.module
        if m is None:
            return
        if m.__dict__.get("forward") is not self.forward:  # kept installed: remove() again after the later one
            from . import LogicError
            raise LogicError(f"ferry.hooks: module {self.name!r}: expected its forward to be this install's wrapper "
                             "(installs wrapping one module are removed in reverse order), got another")
        self.module = None
        if self.prev is None:
            del m.forward
        else:
            m.forward = self.prev
