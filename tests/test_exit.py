"""Interpreter exit with launches pending neither crashes nor hangs."""

import subprocess
import sys
import textwrap
import time

import pytest
from _device import child_env

EXIT_SCRIPT = textwrap.dedent("""
    import numpy as np
    from numba import carray
    import numba_hostfn as nh
    from _device import Device

    @nh.host_callback
    def increment(p):
        carray(p, (1,), np.int64)[0] += 1

    device = Device()
    stream = device.create_stream()
    counter = np.zeros(1, np.int64)
    calls = []
    device.delay(stream, {delay})
    for i in range({n}):
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter))
        nh.host_launch(stream, lambda: calls.append(1))
        nh.host_launch(stream, increment, user_data=bytes(8))
    print("pending", nh.pending(), flush=True)
""")


@pytest.mark.parametrize("delay", [0.0, 0.5])
def test_exit_with_thousands_of_launches_pending(delay):
    n = 3000
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT.format(n=n, delay=delay)],
        capture_output=True, text=True, timeout=120, env=child_env(),
    )
    assert run.returncode == 0, run.stderr
    assert "pending" in run.stdout
    pending = int(run.stdout.split()[1])
    assert 0 < pending <= 3 * n
    # "promptly": no wait for the queue to drain, bounded by the exit guard
    assert time.monotonic() - started < 110
