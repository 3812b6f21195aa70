"""Load: a million launches, thousands of failures, many exits, threads for seconds.

Marked ``stress``.  With a GPU the sizes are the full ones (1,000,000 launches,
10,000 failures, 100 exits of 10,000 pending launches, 10 s of threads); on the
simulator (CI) they are reduced, the same tests otherwise.  No timing is
asserted, except the bound on an exit (a hang is what it guards against).
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import select
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from _device import CHILD_PREAMBLE, child_env
from numba import carray, cfunc

import numba_hostfn as nh

pytestmark = pytest.mark.stress
FULL = os.environ.get("NUMBA_HOSTFN_STRESS", "") == "full" or (
    os.environ.get("NUMBA_HOSTFN_STRESS", "") != "reduced" and nh.backend_name() == "cuda"
)
LAUNCHES = 1_000_000 if FULL else 30_000
FAILURES = 10_000 if FULL else 1_000
EXITS, EXIT_PENDING = (100, 10_000) if FULL else (4, 1_000)
THREAD_SECONDS = 10.0 if FULL else 2.0
ADD = np.dtype([("out", np.uint64), ("value", np.int64)])
MiB = 1 << 20


@nh.host_callback
def increment(p):
    carray(p, (1,), np.int64)[0] += 1


@nh.host_callback(dtype=ADD)
def add_value(d):
    carray(nh.as_voidptr(d.out), (1,), np.int64)[0] += d.value


@cfunc("void(voidptr)")
def plain_cfunc(p):
    carray(p, (1,), np.int64)[0] += 1


@nh.host_callback
def raise_index_error(p):
    a = carray(p, (1,), np.int64)
    if a[0] >= 0:
        raise IndexError("index out of bounds (on purpose)")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]  # fmt: skip


def _malloc_in_use() -> int | None:
    """Bytes malloc has handed out and not had back (glibc's mallinfo2: uordblks +
    hblkhd), or None where there is no mallinfo2 (another libc, glibc < 2.33) or it
    counts nothing (a sanitizer's allocator)."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except AttributeError:
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return (info.uordblks + info.hblkhd) or None


def _settle(streams) -> tuple[int | None, int, int]:
    """Every launch run and released: (malloc in use, Python's allocated blocks, RSS)."""
    for s in streams:
        s.sync()
    for _ in range(3):
        nh.drain()
        import gc

        gc.collect()
    return _malloc_in_use(), sys.getallocatedblocks(), _rss()


#: The million launches come in this many rounds; the first warms up.
ROUNDS = 5
#: Growth of the memory in use over one round that counts as a leak: 4 MiB, or 16
#: bytes a launch where a round is larger (a leak of 32 bytes a launch grows a round
#: of the full size, 200,000 launches, by 6.4 MB); and of Python's allocated blocks,
#: one per 100 launches (a leaked object a launch is one per launch).
LEAK_BOUND = max(4 * MiB, 16 * (LAUNCHES // ROUNDS))
BLOCKS_BOUND = LAUNCHES // ROUNDS // 100


def test_a_million_mixed_launches_from_two_threads_on_four_streams(device):
    """Six kinds of launch, counts exact; memory flat after the first round.

    A leak grows the memory in use every round; the driver's or an allocator's
    one-time growth shows in one round only.  So the *smallest* growth of a round
    after the first must stay below LEAK_BOUND, for the bytes malloc has handed out
    and not had back, where the libc says (else the RSS), and for Python's allocated
    blocks.  Not the RSS where malloc says: with the Python callables' host functions
    queued behind the GIL, it grew by 5-8 MiB in each round of a loaded H200 run (and
    in two of four rounds of Python callables alone, by 4.8 and 6.9 MiB, none in the
    other two): freed memory an allocator keeps, not memory in use.
    """
    streams = [device.create_stream() for _ in range(4)]
    counters = np.zeros(6, np.int64)
    py_calls = [0]

    def bump():
        py_calls[0] += 1

    record = np.array([(counters[2:3].ctypes.data, 1)], ADD)
    by_ref = nh.by_ref(counters[1:2])
    addresses = [counters[k : k + 1].ctypes.data for k in range(6)]
    per_thread = LAUNCHES // ROUNDS // 2 // 6 * 6  # a multiple of the six kinds

    def launch(thread: int) -> None:
        for i in range(per_thread):
            s = streams[2 * thread + (i & 1)]
            k = i % 6
            if k == 0:
                nh.host_launch(s, increment, user_data=addresses[0])
            elif k == 1:
                nh.host_launch(s, increment, user_data=by_ref)
            elif k == 2:
                nh.host_launch(s, add_value, user_data=record)  # copied each time
            elif k == 3:
                nh.host_launch(s, increment.ctypes, user_data=addresses[3])
            elif k == 4:
                nh.host_launch(s, plain_cfunc, user_data=addresses[4])
            else:
                nh.host_launch(s, bump)

    settled = []
    for _ in range(ROUNDS):
        threads = [threading.Thread(target=launch, args=(t,)) for t in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        settled.append(_settle(streams))
    each = ROUNDS * 2 * per_thread // 6
    assert list(counters[[0, 1, 2, 3, 4]]) == [each] * 5 and py_calls[0] == each
    assert nh.pending() == 0
    in_use, blocks, rss = ([after[i] for after in settled] for i in range(3))
    what = "the RSS" if None in in_use else "the memory malloc has in use"
    measured = rss if None in in_use else in_use
    grown = [measured[k + 1] - measured[k] for k in range(1, ROUNDS - 1)]
    assert min(grown) <= LEAK_BOUND, (
        f"{what} grew by at least {min(grown) / MiB:.1f} MiB in every round of "
        f"{2 * per_thread} launches after the first (a leak of "
        f"{min(grown) / (2 * per_thread):.0f} bytes a launch; bound "
        f"{LEAK_BOUND / MiB:.1f} MiB): growths {[f'{g / MiB:.1f}' for g in grown]} MiB, "
        f"after each round {measured}; RSS {rss}"
    )
    grown_blocks = [blocks[k + 1] - blocks[k] for k in range(1, ROUNDS - 1)]
    assert min(grown_blocks) <= BLOCKS_BOUND, (
        f"Python's allocated blocks grew by at least {min(grown_blocks)} in every round "
        f"(bound {BLOCKS_BOUND}): after each round {blocks}"
    )
    for s in streams:
        device.close_stream(s)


def test_thousands_of_failures_are_all_reported_and_the_stream_goes_on(stream, unraisables):
    def fail():
        raise RuntimeError("a callable that raises (on purpose)")

    cell = np.zeros(1, np.int64)
    for _ in range(FAILURES):
        nh.host_launch(stream, fail)
        nh.host_launch(stream, raise_index_error, user_data=nh.by_ref(cell))
    counter = np.zeros(1, np.int64)
    nh.host_launch(stream, increment, user_data=nh.by_ref(counter))
    stream.sync()
    nh.drain()
    assert counter[0] == 1  # the stream went on
    python = [u for u in unraisables if u.object is fail]
    compiled = [u for u in unraisables if "raise_index_error" in str(u.object)]
    assert len(python) == FAILURES and len(compiled) == FAILURES, len(unraisables)
    assert all(isinstance(u.exc_value, RuntimeError) for u in python)
    assert all(isinstance(u.exc_value, IndexError) for u in compiled)


STALLED_EXIT = CHILD_PREAMBLE + textwrap.dedent("""
    import ctypes

    _sleep = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint)(("usleep", ctypes.CDLL(None)))

    @nh.host_callback
    def stall(p):
        for _ in range(600):  # 60 s: longer than the exit may take
            _sleep(100_000)

    counter = np.zeros(1, np.int64)
    nh.host_launch(stream, stall)
    for i in range({n}):
        if i % 2:
            nh.host_launch(stream, increment, user_data=nh.by_ref(counter))
        else:
            nh.host_launch(stream, lambda: None)
    print("pending", nh.pending(), flush=True)
""")


def test_many_exits_with_launches_pending_behind_a_stalled_host_function():
    def one(_) -> tuple[int, float, str]:
        # The exit is timed from the child's last line, printed just before it: its
        # start (importing numba, compiling, on a machine that runs as many of them
        # at once, under a sanitizer in CI) is not ours to bound.
        child = subprocess.Popen(
            [sys.executable, "-c", STALLED_EXIT.format(n=EXIT_PENDING)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        line, printed = "", time.monotonic()
        if select.select([child.stdout], [], [], 120)[0]:
            line = child.stdout.readline()
            printed = time.monotonic()
        try:
            out, err = child.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
        return child.returncode, time.monotonic() - printed, line + out + err

    workers = min(8, os.cpu_count() or 2)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(one, range(EXITS)))
    for rc, seconds, output in results:
        assert rc == 0, output
        assert f"pending {EXIT_PENDING + 1}" in output, output
        assert seconds < 5.0, f"an exit took {seconds:.1f} s: {output}"


def test_threads_launching_and_synchronizing_for_seconds_do_not_deadlock(device):
    """Three threads launch Python callables and compiled functions and synchronize."""
    streams = [device.create_stream() for _ in range(3)]
    counts = [0, 0, 0]
    cells = np.zeros(3, np.int64)
    stop = time.monotonic() + THREAD_SECONDS
    errors = []

    def work(t: int) -> None:
        try:
            s, cell = streams[t], nh.by_ref(cells[t : t + 1])
            i = 0
            while time.monotonic() < stop:
                nh.host_launch(s, lambda t=t: counts.__setitem__(t, counts[t] + 1))
                nh.host_launch(s, increment, user_data=cell)
                i += 1
                if i % 50 == 0:
                    s.sync()
            s.sync()
        except BaseException as exc:  # reported below, with the thread
            errors.append((t, exc))

    threads = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(3)]
    # A deadlock fails the test with every thread's stack instead of hanging the run.
    faulthandler.dump_traceback_later(THREAD_SECONDS + 60, exit=True)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        faulthandler.cancel_dump_traceback_later()
    assert not errors, errors
    nh.drain()
    assert list(cells) == counts and min(counts) > 0
    for s in streams:
        device.close_stream(s)
