# SPDX-License-Identifier: Apache-2.0
"""``ferry.h2d_producer``: declares a function as the producer of one H2D group (ATOM's
``@h2d_producer("group", ...)``).

Thin sugar over ``Publisher.producer(group, slot=...)``: every rule (an active slot, the expected slot, reentry
through the group or through a combined group sharing a member, which sources the scope may write) is checked
by the C++ core before the body runs; this module only opens and closes the scope around the call.
See docs/api/python.md ("Producers: ferry.h2d_producer").
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Union

__all__ = ["h2d_producer"]

SlotSpec = Union[None, int, Callable[..., int]]


def h2d_producer(publisher: Any, group: str, *, slot: SlotSpec = None) -> Callable[[Callable], Callable]:
    """Decorator: ``fn(p, *args, **kwargs)`` runs inside ``publisher.producer(group, slot=...)``.

    Each call of the decorated function opens the producer scope of ``group`` in the publisher's active slot
    and epoch, calls ``fn(p, *args, **kwargs)`` with the scope ``p`` (a ``ferry.Producer``: ``source()``,
    ``write()``, ``set_count()``) before the caller's arguments, closes the scope when ``fn`` returns or raises,
    and returns what ``fn`` returned. It does not publish: the caller publishes the group (or a combined group
    containing it) afterwards.

    ``slot``: ``None`` (any active slot), an ``int`` (the slot expected active), or a callable receiving the
    call's arguments and returning the expected slot (``slot=lambda batch: batch.slot``). A slot that is not the
    active one raises ``ferry.LogicError`` naming the group, the expected and the active slot, and the body does
    not run. So does a reentry: another open producer holding one of the group's buffers (the decorated function
    calling itself, or a producer of a group sharing a buffer), or a buffer already published in this epoch
    (also through a combined group); the earlier scope and the sources it wrote are left intact.

    An exception inside ``fn`` closes the scope and propagates; nothing is rolled back (the core's guard rule):
    bytes written stay in the slot's sources and counts set stay set for this epoch, and the group is not
    published. Run the producer again (its new scope rewrites the sources and counts) or leave the group
    unpublished in this epoch. The views ``p.source()`` returned become read-only when the scope closes.
    """
    if not isinstance(group, str):
        raise TypeError(f"ferry.h2d_producer: expected group to be a str, got {type(group).__name__}")
    if not (slot is None or callable(slot) or (isinstance(slot, int) and not isinstance(slot, bool))):
        raise TypeError(f"ferry.h2d_producer: expected slot None, an int or a callable, got {type(slot).__name__}")
    if not callable(getattr(publisher, "producer", None)):
        raise TypeError(f"ferry.h2d_producer: expected a ferry.Publisher, got {type(publisher).__name__}")

    def decorate(fn: Callable) -> Callable:
        if not callable(fn):
            raise TypeError(f"ferry.h2d_producer('{group}'): expected a function, got {type(fn).__name__}")

        @functools.wraps(fn)
        def producer(*args, **kwargs):
            expected: Optional[int] = slot(*args, **kwargs) if callable(slot) else slot
            with publisher.producer(group, slot=expected) as p:
                return fn(p, *args, **kwargs)

        producer.h2d_group = group  # type: ignore[attr-defined]
        return producer

    return decorate
