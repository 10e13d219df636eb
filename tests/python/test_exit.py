# SPDX-License-Identifier: Apache-2.0
# Interpreter exit with a daemon thread inside ferry (common.hpp, exit_state): CPython before 3.14 ends such a
# thread with pthread_exit when it takes the GIL back during finalization, which aborted the process
# ("terminate called without an active exception") while the thread was in Channel.poll.
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import threading, time
    import numpy as np
    import ferry
    ch = ferry.Channel(0, ring_bytes=1 << 20, publish_every=4, backend="host")
    s = ferry.Stream(0, backend="host")
    def run():
        while True:
            for e in ch.poll(64, {timeout}):
                e.release()
    for _ in range(3):
        threading.Thread(target=run, daemon=True).start()
    ch.begin_forward(s)
    for i in range(10):
        ch.capture(1, np.arange(10, dtype=np.int32), s)
    {end}
    time.sleep(0.2)
    raise SystemExit("exit with the pollers running")
    """
)


@pytest.mark.parametrize("timeout", ["0.02", "None"])
@pytest.mark.parametrize("end", ["ch.end_forward(s)", "pass"])
def test_exit_with_daemon_threads_polling_does_not_abort(timeout, end):
    r = subprocess.run([sys.executable, "-c", SCRIPT.format(timeout=timeout, end=end)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])  # SystemExit("..."), not SIGABRT (-6)
    assert "terminate called" not in r.stderr
    assert "exit with the pollers running" in r.stderr
