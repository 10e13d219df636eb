# SPDX-License-Identifier: Apache-2.0
# Interpreter exit with a daemon thread inside ferry (gil.hpp, exit_state): CPython before 3.14 ends such a
# thread with pthread_exit when it takes the GIL back during finalization, which aborted the process
# ("terminate called without an active exception") while the thread was in Channel.poll.
import subprocess
import sys
import textwrap
import time

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


# Interpreter exit with a forward open (begin_forward without end_forward). Before: module teardown destroyed
# the stream first (it was created first), the channel's destructor then failed to publish the forward's last
# entries on it and waited its whole close timeout for them (5 s), and printed a long invalidation message.
# Now ferry's atexit hook ends the forward while the stream is alive and says so in one line, once.
FORWARD_OPEN = textwrap.dedent(
    """
    import threading, time
    import numpy as np
    import ferry
    {first} = ferry.{first_cls}(0, {first_args})
    {second} = ferry.{second_cls}(0, {second_args})
    if {pollers}:
        def run():
            while True:
                for e in ch.poll(64, 0.02):
                    e.release()
        threading.Thread(target=run, daemon=True).start()
    if {captured}:
        s.begin_capture()
    ch.begin_forward(s)
    for i in range(10):
        ch.capture(1, np.arange(10, dtype=np.int32), s)
    for i in range({deferred}):
        ch.capture_deferred(2, np.arange(4, dtype=np.int32), s)
    print(time.time(), flush=True)  # the script's end: what follows is the exit
    """
)
CH_ARGS = 'ring_bytes=1 << 20, publish_every=4, backend="host"'
ST_ARGS = 'backend="host"'
AT_EXIT = ("ferry: Channel(host, device 0) had a forward open at exit (begin_forward without end_forward); ")
WHAT_TO_DO = "; call end_forward(stream) before exiting"


def _run_forward_open(stream_first=True, pollers=False, captured=False, deferred=0):
    names = [("s", "Stream", ST_ARGS), ("ch", "Channel", CH_ARGS)]
    if not stream_first:
        names.reverse()
    (a, ac, aa), (b, bc, ba) = names
    code = FORWARD_OPEN.format(first=a, first_cls=ac, first_args=aa, second=b, second_cls=bc, second_args=ba,
                               pollers=pollers, captured=captured, deferred=deferred)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    exit_s = time.time() - float(r.stdout.split()[-1])
    return r, exit_s


@pytest.mark.parametrize("stream_first", [True, False], ids=["stream_first", "channel_first"])
@pytest.mark.parametrize("pollers", [False, True], ids=["no_poller", "daemon_poller"])
def test_exit_with_a_forward_open_is_fast_and_says_what_to_do(stream_first, pollers):
    r, exit_s = _run_forward_open(stream_first, pollers)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert exit_s < 1.0, f"exit took {exit_s:.2f} s after the script ended (was 5 s: the close timeout)"
    lines = r.stderr.strip().splitlines()
    assert lines == [AT_EXIT + "ferry ended it with abort_forward (its entries were published)" + WHAT_TO_DO], r.stderr
    assert "terminate called" not in r.stderr


def test_exit_with_a_forward_open_names_the_dropped_deferred_entries():
    r, exit_s = _run_forward_open(deferred=3)
    assert r.returncode == 0 and exit_s < 1.0, (r.returncode, exit_s, r.stderr[-2000:])
    assert r.stderr.strip().splitlines() == [
        AT_EXIT + "ferry ended it with abort_forward (its entries were published, 3 pending deferred entries "
        "dropped)" + WHAT_TO_DO], r.stderr


def test_exit_with_a_captured_forward_open_drops_it_in_one_line():
    r, exit_s = _run_forward_open(captured=True)
    assert exit_s < 1.0, (exit_s, r.stderr[-2000:])
    assert r.stderr.count("ferry: Channel(host, device 0) had a forward open at exit") == 1, r.stderr
    assert (AT_EXIT + "ferry dropped it with abort_forward (its captured entries were never planned)" + WHAT_TO_DO
            in r.stderr), r.stderr
    assert "terminate called" not in r.stderr


def test_a_closed_forward_prints_nothing_at_exit():
    code = FORWARD_OPEN.format(first="s", first_cls="Stream", first_args=ST_ARGS, second="ch", second_cls="Channel",
                               second_args=CH_ARGS, pollers=False, captured=False, deferred=0)
    code = code.replace("print(time.time()", "ch.end_forward(s); ch.poll(64, 1.0); print(time.time()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_channel_outliving_its_forward_stream_in_a_function_does_not_stall():
    # The forward's stream is a local created before the channel: when the function returns, the stream went
    # first and the channel's close could not publish on it (a 5 s wait). The channel holds the stream of its
    # open forward until the forward ends.
    code = textwrap.dedent(
        """
        import time
        import numpy as np
        import ferry
        def run():
            s = ferry.Stream(0, backend="host")
            ch = ferry.Channel(0, ring_bytes=1 << 20, publish_every=4, backend="host")
            ch.begin_forward(s)
            for i in range(10):
                ch.capture(1, np.arange(10, dtype=np.int32), s)
        t0 = time.monotonic()
        run()
        print(time.monotonic() - t0)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert float(r.stdout.split()[-1]) < 1.0, r.stderr
    assert "invalidated" not in r.stderr and "stream was destroyed" not in r.stderr, r.stderr


def test_exit_with_a_forward_open_on_another_thread_closes_the_channel_in_one_line():
    # abort_forward is the producer thread's call: from the exit hook it is refused, so the hook closes the
    # channel (close() has no thread rule) and the destructor's second close says nothing
    code = textwrap.dedent(
        """
        import threading, time
        import numpy as np
        import ferry
        s = ferry.Stream(0, backend="host")
        ch = ferry.Channel(0, ring_bytes=1 << 20, publish_every=4, backend="host")
        def work():
            ch.begin_forward(s)
            for i in range(10):
                ch.capture(1, np.arange(10, dtype=np.int32), s)
        t = threading.Thread(target=work)
        t.start()
        t.join()
        print(time.time(), flush=True)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    exit_s = time.time() - float(r.stdout.split()[-1])
    assert r.returncode == 0 and exit_s < 1.0, (r.returncode, exit_s, r.stderr[-2000:])
    assert r.stderr.strip().splitlines() == [
        AT_EXIT + "ferry closed the channel (close() published the forward's entries)" + WHAT_TO_DO], r.stderr
