# SPDX-License-Identifier: Apache-2.0
"""The consumer: a thread that polls a ferry.Channel in batches and releases the entries (and, while checking,
records a digest of each)."""

from __future__ import annotations

import hashlib
import threading
import time


def digest(buf) -> bytes:
    return hashlib.blake2b(buf, digest_size=16).digest()


class Drain(threading.Thread):
    """The consumer: polls the channel in batches and releases the entries; with ``check`` set, records
    (hook, blake2b(bytes)) of every entry."""

    def __init__(self, ch):
        super().__init__(daemon=True)
        self.ch, self.count, self.check, self.items, self.error = ch, 0, False, [], None
        self.batch = 256
        self._halt = threading.Event()
        self._paused = threading.Event()

    def pause(self):
        """Stop polling until resume() (a diagnostic: bench/torch/step_probe.py --drain-during off)."""
        self._paused.set()

    def resume(self):
        self._paused.clear()

    def run(self):
        try:
            while not self._halt.is_set():
                if self._paused.is_set():
                    time.sleep(0.001)
                    continue
                got = self.ch.poll(self.batch, 0.02)  # small batches: short GIL holds
                if self.check:
                    for e in got:
                        self.items.append((e.hook, digest(e.numpy())))
                        e.release()
                else:
                    for e in got:
                        e.release()
                self.count += len(got)
                del got
        except Exception as err:  # reported by wait()
            self.error = err

    def wait(self, n, timeout=120.0):
        end = time.perf_counter() + timeout
        while self.count < n:
            if self.error is not None:
                raise self.error
            if time.perf_counter() > end:
                raise RuntimeError(f"drain: expected {n} entries, got {self.count} after {timeout} s")
            time.sleep(0.001)

    def stop(self):
        self._halt.set()
        self.join()


def settle_sink(ch, sink, who: str, timeout: float = 120.0, poll: float = 0.001) -> None:
    """Waits until every entry `ch` reserved so far reached its native `sink` and the sink's queue is empty (the
    next contestant must not share the CPU with this one's backlog); RuntimeError naming `who` after `timeout` s."""
    end = time.monotonic() + timeout
    while True:
        c, q = ch.stats(), sink.stats()
        if c["entries_drained"] == c["entries_reserved"] and q["queue_entries"] == 0:
            return
        if time.monotonic() > end:
            raise RuntimeError(f"{who}: not settled after {timeout} s: channel {c}, sink {q}")
        time.sleep(poll)
