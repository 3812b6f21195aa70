"""The simulator's own surface: what it models, and the clear errors for what it does not."""

import subprocess
import sys

import numpy as np
import pytest
from _device import child_env, rerun_on_simulator
from numba import carray

import numba_hostfn as nh


@nh.host_callback
def increment(p):
    carray(p, (1,), np.int64)[0] += 1


def test_streams_run_independently(request):
    if rerun_on_simulator(request):
        return
    with nh.simulator.Stream() as slow, nh.simulator.Stream() as fast:
        counter = np.zeros(1, np.int64)
        slow.sleep(5)
        nh.host_launch(fast, increment, user_data=nh.by_ref(counter))
        fast.sync()  # does not wait for the other stream's five seconds
        assert counter[0] == 1
        assert not slow.is_done()
        slow.close()  # runs what is queued, then stops
        assert fast.is_done()


def test_stream_surface(request):
    if rerun_on_simulator(request):
        return
    s = nh.simulator.Stream()
    version, handle = s.__cuda_stream__()
    assert version == 0 and handle == s.handle
    assert "open" in repr(s)
    s.sync()
    assert s.is_done()
    s.close()
    s.close()  # idempotent
    assert "closed" in repr(s)
    with pytest.raises(RuntimeError, match="closed"):
        nh.host_launch(s, increment, user_data=np.zeros(1, np.int64))
    with pytest.raises(RuntimeError, match="closed"):
        s.sync()
    assert nh.pending() == 0


def test_a_host_function_that_waits_for_a_stream_is_refused(request, unraisables):
    """A Python callable on the simulated host-function thread that syncs or
    closes a stream gets RuntimeError, as CUDA forbids a host function any CUDA
    call (it waited for itself: main hung for ever)."""
    if rerun_on_simulator(request):
        return
    seen = []

    def waits(s):
        for wait in (s.sync, s.close):
            try:
                wait()
            except RuntimeError as exc:
                seen.append("host function" in str(exc))

    with nh.simulator.Stream() as s, nh.simulator.Stream() as other:
        nh.host_launch(s, lambda: waits(s))
        nh.host_launch(s, lambda: waits(other))
        s.sync()
        nh.drain()
        assert seen == [True] * 4 and not unraisables
        other.sync()  # both streams still work
        nh.host_launch(other, increment, user_data=np.zeros(1, np.int64))
        other.sync()


def test_sleep_and_launch_validate(request, stream):
    if rerun_on_simulator(request):
        return
    with pytest.raises(TypeError, match="seconds"):
        stream.sleep("1")
    with pytest.raises(ValueError, match="seconds"):
        stream.sleep(-1)
    with pytest.raises(TypeError, match="compiled"):
        stream.launch(lambda: None)


def test_foreign_stream_objects_are_refused(request):
    if rerun_on_simulator(request):
        return

    class Foreign:
        def __cuda_stream__(self):
            return (0, 0xDEAD0000)

    with pytest.raises(TypeError, match="simulator.Stream"):
        nh.host_launch(Foreign(), increment, user_data=np.zeros(1, np.int64))
    assert nh.pending() == 0


_FOREIGN_STREAM = """
import numpy as np
import numba_hostfn as nh

class Foreign:
    def __cuda_stream__(self):
        return (0, 0xDEAD0000)

@nh.host_callback
def body(p):
    pass

{choose}
try:
    nh.host_launch(Foreign(), body, user_data=np.zeros(1, np.int64))
except TypeError as e:
    print(e)
"""


@pytest.mark.parametrize(
    "how, says, never",
    [
        ("NUMBA_HOSTFN_SIMULATOR=1", "NUMBA_HOSTFN_SIMULATOR is set: unset it", "driver"),
        ("simulate_without_gpu(), no GPU", "chosen because no usable CUDA driver", "is set"),
    ],
)
def test_a_refused_stream_is_told_why_the_simulator_is_in_use(how, says, never):
    """The refusal of a foreign stream says why the simulator runs: the variable, or
    simulate_without_gpu() finding no driver (then unsetting anything would not help)."""
    env = child_env(CUDA_VISIBLE_DEVICES="")  # hides every GPU from the driver
    env.pop("NUMBA_HOSTFN_SIMULATOR", None)
    if how.startswith("NUMBA_HOSTFN_SIMULATOR"):
        env["NUMBA_HOSTFN_SIMULATOR"] = "1"
        script = _FOREIGN_STREAM.format(choose="")
    else:
        script = _FOREIGN_STREAM.format(choose="assert nh.simulate_without_gpu()")
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "simulator.Stream" in run.stdout and says in run.stdout, run.stdout
    assert never not in run.stdout, run.stdout


def test_simulator_stream_refused_without_simulator_backend(request):
    if rerun_on_simulator(request):
        return
    script = (
        "import numba_hostfn as nh\n"
        "try:\n    nh.simulator.Stream()\n"
        "except (RuntimeError, nh.BackendUnavailableError) as e:\n    print(e)\n"
    )
    env = child_env(CUDA_VISIBLE_DEVICES="")
    env.pop("NUMBA_HOSTFN_SIMULATOR")
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "NUMBA_HOSTFN_SIMULATOR" in run.stdout


_NO_DRIVER = """
import os
import numba_hostfn as nh
try:
    nh.host_launch(object(), print)
except TypeError:
    pass
for use in (nh.pending, nh.backend_name):
    try:
        use()
    except nh.BackendUnavailableError as e:
        print('unavailable:', e)
{choose}
print('then:', nh.backend_name())
"""


@pytest.mark.parametrize(
    "choose", ["nh.simulate_without_gpu()", "os.environ['NUMBA_HOSTFN_SIMULATOR'] = '1'"]
)
def test_no_driver_and_no_simulator_raises_naming_both_ways(choose):
    """No driver, no simulator: pending() and backend_name() raise, naming
    simulate_without_gpu() and the variable; and what the message says is true:
    either, done after the error (long after the import), selects the simulator."""
    env = child_env(CUDA_VISIBLE_DEVICES="")  # hides every GPU from the driver
    env.pop("NUMBA_HOSTFN_SIMULATOR", None)
    run = subprocess.run(
        [sys.executable, "-c", _NO_DRIVER.format(choose=choose)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    errors = [line for line in run.stdout.splitlines() if line.startswith("unavailable:")]
    assert len(errors) == 2, run.stdout
    for line in errors:
        assert "simulate_without_gpu()" in line and "NUMBA_HOSTFN_SIMULATOR=1" in line, line
        assert "before importing" not in line, line
    assert "then: simulator" in run.stdout, run.stdout


def test_simulated_stream_has_the_cuda_core_stream_surface_it_models():
    """The simulator must not drift from cuda.core's Stream (numba-cuda's simulator did)."""
    import inspect

    from cuda.core import Stream as CudaStream

    for name in ("sync", "close", "handle", "__cuda_stream__", "create_graph_builder"):
        assert hasattr(CudaStream, name), f"cuda.core.Stream no longer has {name}"
        assert hasattr(nh.simulator.Stream, name), f"simulator.Stream lacks {name}"
    for name in ("sync", "close", "__cuda_stream__", "create_graph_builder"):
        params = inspect.signature(getattr(nh.simulator.Stream, name)).parameters
        assert list(params) == ["self"], f"simulator.Stream.{name} takes {list(params)}"
