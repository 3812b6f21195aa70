import os
import sys

import pytest
from _device import run_child

import numba_hostfn
import numba_hostfn.simulator

PUBLIC = {
    "MEMCPY_2D_LAYOUT",
    "MEMCPY_LAYOUT",
    "SIMULATOR_ENV",
    "BackendUnavailableError",
    "ByRef",
    "Record",
    "CUhostFn",
    "CudaDriverError",
    "DeviceFaultError",
    "HostCallbackCompileError",
    "HostExecutor",
    "HostFunction",
    "SimulatorUnsupportedError",
    "add_callback",
    "as_voidptr",
    "async_done",
    "backend_name",
    "by_ref",
    "create_stream",
    "done_future",
    "drain",
    "dropped_callbacks",
    "host_copy",
    "host_memcpy",
    "host_memcpy_2d",
    "release_after",
    "host_callback",
    "host_launch",
    "pending",
    "record",
    "simulate_without_gpu",
    "simulator",
}


def test_public_names_are_exactly_the_documented_ones():
    assert set(numba_hostfn.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(numba_hostfn, name) is not None


def test_simulator_module_exports():
    assert set(numba_hostfn.simulator.__all__) == {
        "Graph",
        "GraphBuilder",
        "Stream",
        "SimulatorUnsupportedError",
        "new_context",
    }
    assert (
        numba_hostfn.simulator.SimulatorUnsupportedError is numba_hostfn.SimulatorUnsupportedError
    )


def test_error_classes_are_the_builtin_kinds():
    assert issubclass(numba_hostfn.HostCallbackCompileError, TypeError)
    assert issubclass(numba_hostfn.CudaDriverError, RuntimeError)
    assert issubclass(numba_hostfn.DeviceFaultError, numba_hostfn.CudaDriverError)
    assert issubclass(numba_hostfn.BackendUnavailableError, RuntimeError)
    assert issubclass(numba_hostfn.SimulatorUnsupportedError, NotImplementedError)


def test_py_typed_ships():
    import pathlib

    assert (pathlib.Path(numba_hostfn.__file__).parent / "py.typed").exists()


def _elf_segment_types(path: str) -> list[int]:
    """The p_type of each program header of the 64-bit little-endian ELF file path."""
    import struct

    with open(path, "rb") as f:
        header = f.read(64)
        assert header[:4] == b"\x7fELF" and header[4] == 2 and header[5] == 1, path
        (phoff,) = struct.unpack_from("<Q", header, 32)
        phentsize, phnum = struct.unpack_from("<HH", header, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return [struct.unpack_from("<I", table, i * phentsize)[0] for i in range(phnum)]


@pytest.mark.skipif(sys.platform != "linux", reason="reads the extension as an ELF file")
def test_the_native_core_has_no_thread_local_storage():
    # A dlopen'ed module's _Thread_local takes its block from glibc's dynamic TLS,
    # allocated lazily by __tls_get_addr and freed by a later thread that reuses the
    # stack: a race ThreadSanitizer reports at thread exit (CI's TSan stage failed on
    # it once in many runs).  Per-thread values are pthread keys' (records.c, enqueue.c,
    # simulator.c, trampolines.c), so the extension has no PT_TLS segment.
    from numba_hostfn import _core

    pt_tls = 7
    types = _elf_segment_types(_core.__file__)
    assert types and pt_tls not in types, (
        f"{_core.__file__} has a TLS segment: a _Thread_local in numba_hostfn/native/; "
        "keep the value in a pthread key instead (util.c, nhf_key_create_once)"
    )


SCRIPT_THAT_RUNS_ANYWHERE = """
import numpy as np
from numba import carray
import numba_hostfn as nh
from numba_hostfn._cuda import cuda_driver_usable

simulated = nh.simulate_without_gpu()
stream = nh.create_stream()

@nh.host_callback
def add_one(p):
    carray(p, (1,), np.int64)[0] += 1

data = np.zeros(1, np.int64)
nh.host_launch(stream, add_one, user_data=nh.by_ref(data))
stream.sync()
print(simulated, not cuda_driver_usable(), type(stream).__module__, int(data[0]))
"""


def test_one_script_runs_on_a_gpu_or_the_simulator():
    """With NUMBA_HOSTFN_SIMULATOR unset: the simulator exactly when there is no driver."""
    from _device import child_env, run_child

    env = child_env()
    env.pop("NUMBA_HOSTFN_SIMULATOR", None)
    simulated, no_driver, module, value = run_child(SCRIPT_THAT_RUNS_ANYWHERE, env=env).split()
    assert simulated == no_driver and value == "1"
    assert module.startswith("numba_hostfn" if simulated == "True" else "cuda.core")


def test_a_first_launch_imports_neither_numba_nor_asyncio():
    """Start-up pays only for what a first launch uses: numba comes with @host_callback,
    asyncio with async_done, concurrent.futures with done_future, hashlib with a cached
    compile, decimal with the user's Decimal (bench_startup).  What the backend's own
    stack imports is left out: numpy 1's import brings hashlib (numpy.random,
    secrets), and so does cuda.core's (on the CUDA backend)."""
    stack = "import numpy" + ("\nimport cuda.core" if numba_hostfn.backend_name() == "cuda" else "")
    out = run_child(
        "import sys\n"
        f"{stack}\n"
        "by_stack = set(sys.modules)\n"
        "import numba_hostfn as nh\n"
        "stream = nh.create_stream()\n"
        "ran = []\n"
        "nh.host_launch(stream, lambda: ran.append(1))\n"
        "stream.sync()\n"
        "nh.drain()\n"
        "names = ('numba', 'asyncio', 'concurrent.futures', 'hashlib', 'decimal')\n"
        "print(ran, [n for n in names if n in sys.modules and n not in by_stack])\n"
        "nh.done_future(stream).result(timeout=60)\n"
        "print('concurrent.futures' in sys.modules)\n"
    )
    assert out.splitlines() == ["[1] []", "True"], out


def test_a_star_import_binds_every_public_name_and_so_imports_numba():
    """``from numba_hostfn import *`` binds every name of ``__all__``, ``as_voidptr``
    too, and so imports numba: ``as_voidptr`` is a numba intrinsic, a name the package
    resolves lazily, and a star import must bind it.  That is inherent, and documented
    (docs/api.md, docs/install.md): ``import numba_hostfn`` still imports no numba."""
    out = run_child(
        "import sys\n"
        "import numba_hostfn\n"
        "before = 'numba' in sys.modules\n"
        "from numba_hostfn import *\n"
        f"missing = sorted(n for n in {sorted(PUBLIC)!r} if n not in globals())\n"
        "print(before, missing, 'numba' in sys.modules)\n"
    )
    assert out.splitlines() == ["False [] True"], out


def test_a_child_imports_the_package_this_suite_imported():
    """A child (child_env) imports the numba_hostfn this process did: the checkout's in a
    checkout, the installed one in a run against an installed wheel (from a checkout
    too, where the checkout on the child's path used to win)."""
    from _device import child_env, run_child

    out = run_child("import numba_hostfn; print(numba_hostfn.__file__)", env=child_env())
    assert os.path.samefile(out.split()[-1], numba_hostfn.__file__), out


def test_simulate_without_gpu_names_the_backend_in_use_once_one_is_chosen(monkeypatch):
    """Once the backend is chosen, simulate_without_gpu() says whether it is the
    simulator, whatever NUMBA_HOSTFN_SIMULATOR says now: it answered from the variable
    and the driver alone, so a process on the simulator whose variable was since unset
    heard False on a machine with a driver (and went on with simulated streams), and
    one on CUDA whose variable was since set heard True."""
    from numba_hostfn import _process

    simulated = numba_hostfn.backend_name() == "simulator"
    if simulated:
        monkeypatch.delenv("NUMBA_HOSTFN_SIMULATOR", raising=False)
        monkeypatch.setattr(_process, "cuda_driver_usable", lambda: True)  # a GPU machine's
    else:
        monkeypatch.setenv("NUMBA_HOSTFN_SIMULATOR", "1")
    assert numba_hostfn.simulate_without_gpu() is simulated
    assert numba_hostfn.backend_name() == ("simulator" if simulated else "cuda")


@pytest.mark.parametrize(
    "value, requested",
    [("1", True), (" Yes ", True), ("on", True), ("TRUE", True)]
    + [("", False), ("0", False), ("off", False), ("No", False), ("false", False)],
)
def test_the_simulator_variable_reads_on_and_off(monkeypatch, value, requested):
    """NUMBA_HOSTFN_SIMULATOR's words for on and off; "off" selected the simulator."""
    from numba_hostfn import _process

    monkeypatch.setenv("NUMBA_HOSTFN_SIMULATOR", value)
    assert _process.simulator_requested() is requested


def test_a_simulator_variable_neither_on_nor_off_is_refused_at_first_use():
    """A value that says neither is a ValueError naming the variable and what to set,
    at the first use, and no backend chosen (it selected the simulator)."""
    from _device import child_env, run_child

    out = run_child(
        "import numba_hostfn as nh\n"
        "try:\n"
        "    nh.create_stream()\n"
        "except ValueError as e:\n"
        "    print(e)\n"
        "from numba_hostfn import _process\n"
        "print(_process._backend is None)\n",
        env=child_env(NUMBA_HOSTFN_SIMULATOR="maybe"),
    )
    assert out.splitlines() == [
        "NUMBA_HOSTFN_SIMULATOR='maybe' is neither on nor off: set it to 1 to run on the "
        "simulator, or to 0 not to (unset, it is 0)",
        "True",
    ], out


def test_a_watchdog_variable_neither_on_nor_off_is_refused_at_first_use():
    """NUMBA_HOSTFN_CUDA_WATCHDOG=off left the watchdog on (only 0, false and no were
    off); a value that says neither is refused before the CUDA backend loads
    anything, on a machine without a driver too."""
    from _device import child_env, run_child

    env = child_env(NUMBA_HOSTFN_CUDA_WATCHDOG="maybe")
    env.pop("NUMBA_HOSTFN_SIMULATOR", None)
    out = run_child(
        "import numba_hostfn as nh\n"
        "try:\n"
        "    nh.create_stream()\n"
        "except ValueError as e:\n"
        "    print(e)\n",
        env=env,
    )
    assert out.splitlines() == [
        "NUMBA_HOSTFN_CUDA_WATCHDOG='maybe' is neither on nor off: set it to 1 to watch "
        "for device faults, or to 0 not to (unset, it is 1)"
    ], out
