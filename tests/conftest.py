"""One suite, two backends.

With a usable CUDA driver the suite runs against it and nothing is skipped;
without one it selects the simulator (NUMBA_HOSTFN_SIMULATOR=1) and skips only
the tests marked ``gpu``.  NUMBA_HOSTFN_REQUIRE_GPU=1 turns a missing driver
into an error instead (use it on GPU machines, so a broken driver cannot pass
as a simulator run).
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import time

import pytest

from numba_hostfn._process import cuda_driver_usable, simulator_unless_driver

if os.environ.get("NUMBA_HOSTFN_REQUIRE_GPU") and not cuda_driver_usable():
    raise pytest.UsageError("NUMBA_HOSTFN_REQUIRE_GPU=1 but no usable CUDA driver was found")
SIMULATOR = simulator_unless_driver()
# A suite started as a background job (`python -m pytest &` in a script) inherits
# SIGINT ignored, and Python then installs no KeyboardInterrupt handler: a Ctrl-C is
# dropped, and one a callback raises is reported as unraisable, not delivered again
# (PyErr_SetInterrupt would drop it).  The interrupt tests need
# Python's own handler, as at a terminal; the children they start get it back too
# (exec resets a handled signal to its default, and Python installs its handler).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, os.path.dirname(__file__))

from _device import SOURCES, Device  # noqa: E402

import numba_hostfn  # noqa: E402

#: Whether the package's sources are at hand: beside tests/ (a checkout), or where
#: NUMBA_HOSTFN_SOURCE_TREE says (_device.SOURCES).  A copy of tests/ run against an
#: installed wheel with neither (.ci/run's wheel stage) skips the tests marked
#: ``checkout``, which read them.
CHECKOUT = os.path.isdir(os.path.join(SOURCES, "numba_hostfn", "native"))


def pytest_report_header(config):
    backend = numba_hostfn.backend_name()
    why = " (no usable CUDA driver)" if SIMULATOR else ""
    package = os.path.dirname(os.path.abspath(numba_hostfn.__file__))
    return [f"numba_hostfn backend: {backend}{why}", f"numba_hostfn imported from: {package}"]


def pytest_collection_modifyitems(config, items):
    skips = {}
    if SIMULATOR:
        skips["gpu"] = pytest.mark.skip(reason="needs a real CUDA device (simulator run)")
    if not CHECKOUT:
        skips["checkout"] = pytest.mark.skip(
            reason="needs a source checkout: reads the package's sources (numba_hostfn/), "
            "which are not beside these tests"
        )
    for item in items:
        for marker, skip in skips.items():
            if marker in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def device():
    dev = Device()
    yield dev
    dev.close()


@pytest.fixture
def stream(device):
    s = device.create_stream()
    yield s
    s.sync()
    numba_hostfn.drain()
    device.close_stream(s)


@pytest.fixture
def unraisables(monkeypatch):
    """Collect what reaches sys.unraisablehook (from any thread) during the test."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    return seen


@pytest.fixture(autouse=True)
def _nothing_left_pending(device):
    """Every test must leave no launch unreleased once its streams are synchronized.

    CUDA destroys a graph's user objects (which complete what the graph owned)
    asynchronously once the graph is gone: a graph a test dropped is collected,
    and the device synchronized, before the check (for about a second).
    """
    yield
    for _ in range(100):
        numba_hostfn.drain()
        if numba_hostfn.pending() == 0:
            return
        gc.collect()
        device.synchronize()
        time.sleep(0.01)
    assert numba_hostfn.pending() == 0, "a test left launches pending"


@pytest.fixture(params=["fast", "python"])
def launch_path(request):
    """Run a test once through host_launch's native path and once through Python.

    "python" sends every launch to the Python implementation; "fast" lets the
    native builtin take the common launches, as it always does (everything else
    falls through to Python).
    """
    from numba_hostfn import _launch

    if request.param == "python":
        with _launch.python_path():
            yield request.param
        return
    yield request.param
