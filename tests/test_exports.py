import numba_hostfn
import numba_hostfn.simulator

PUBLIC = {
    "MEMCPY_2D_LAYOUT",
    "MEMCPY_LAYOUT",
    "SIMULATOR_ENV",
    "BackendUnavailableError",
    "ByRef",
    "CUhostFn",
    "CudaDriverError",
    "HostCallbackCompileError",
    "HostExecutor",
    "HostFunction",
    "SimulatorUnsupportedError",
    "as_voidptr",
    "backend_name",
    "by_ref",
    "drain",
    "host_copy",
    "host_memcpy",
    "host_memcpy_2d",
    "release_after",
    "host_callback",
    "host_launch",
    "pending",
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
    }
    assert (
        numba_hostfn.simulator.SimulatorUnsupportedError is numba_hostfn.SimulatorUnsupportedError
    )


def test_error_classes_are_the_builtin_kinds():
    assert issubclass(numba_hostfn.HostCallbackCompileError, TypeError)
    assert issubclass(numba_hostfn.CudaDriverError, RuntimeError)
    assert issubclass(numba_hostfn.BackendUnavailableError, RuntimeError)
    assert issubclass(numba_hostfn.SimulatorUnsupportedError, NotImplementedError)


def test_py_typed_ships():
    import pathlib

    assert (pathlib.Path(numba_hostfn.__file__).parent / "py.typed").exists()
