"""Interpreter exit with launches pending neither crashes nor hangs."""

import textwrap

import pytest
from _device import CHILD_PREAMBLE, run_child

EXIT_SCRIPT = CHILD_PREAMBLE + textwrap.dedent("""
    counter = np.zeros(1, np.int64)
    calls = []
    device.delay(stream, {delay})
    for i in range({n}):
        nh.host_launch(stream, increment, user_data=nh.by_ref(counter))
        nh.host_launch(stream, lambda: calls.append(1))
        nh.host_launch(stream, increment, user_data=bytes(8))
    print("pending", nh.pending(), flush=True)
""")


@pytest.mark.parametrize(
    "delay, blocked",
    [(0.0, False), (2.0, True)],
    ids=["host-functions-running-at-exit", "stream-blocked-at-exit"],
)
def test_exit_with_thousands_of_launches_pending(delay, blocked):
    n = 3000
    out = run_child(EXIT_SCRIPT.format(n=n, delay=delay), timeout=90)
    assert "pending" in out
    pending = int(out.split()[1])
    assert 0 <= pending <= 3 * n
    if blocked:  # the stream is still in its delay: nothing has run at exit
        assert pending == 3 * n
