import ctypes
import functools
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest
from _device import child_env
from numba import carray

import numba_hostfn as nh

REC = np.dtype([("x", np.float64), ("n", np.int64)])


@nh.host_callback
def add_one(p):
    a = carray(p, (1,), np.int64)
    a[0] += 1


@nh.host_callback(dtype=REC)
def bump_record(d):
    d.x += 0.5
    d.n += 1


@nh.host_callback(dtype=np.float32)
def halve(d):
    d[0] /= 2


@nh.host_callback
def divide_by_zero(p):
    a = carray(p, (2,), np.float64)
    a[1] = a[0] / 0.0


@nh.host_callback
def raises(p):
    raise ValueError("raised inside a host function")


def test_both_hostfunction_forms_give_host_functions():
    assert isinstance(add_one, nh.HostFunction)
    assert isinstance(bump_record, nh.HostFunction)
    assert add_one.py_func.__name__ == "add_one"
    assert add_one.__name__ == "add_one"
    assert add_one.__qualname__ == "add_one"
    assert bump_record.dtype == REC
    assert add_one.dtype is None


def test_address_and_repr():
    assert isinstance(add_one.address, int) and add_one.address
    text = repr(add_one)
    assert "add_one" in text and hex(add_one.address) in text
    assert "dtype=" in repr(bump_record)


def test_ctypes_is_exactly_cuhostfn_and_keeps_function_alive():
    pointer = add_one.ctypes
    assert type(pointer) is nh.CUhostFn
    assert type(pointer)._restype_ is None
    assert type(pointer)._argtypes_ == (ctypes.c_void_p,)
    assert ctypes.cast(pointer, ctypes.c_void_p).value == add_one.address
    assert pointer._numba_hostfn_owner is add_one
    assert add_one.ctypes is pointer


def test_direct_call_runs_compiled_code():
    x = np.zeros(1, np.int64)
    add_one(nh.by_ref(x))
    add_one(x.ctypes.data)
    assert x[0] == 2


def test_direct_call_through_ctypes_pointer():
    x = np.full(1, 41, np.int64)
    add_one.ctypes(x.ctypes.data)
    assert x[0] == 42


def test_record_layout_reads_and_writes_fields_by_name():
    r = np.zeros(1, REC)
    bump_record(nh.by_ref(r))
    bump_record(nh.by_ref(r))
    assert r[0]["x"] == 1.0 and r[0]["n"] == 2


def test_scalar_layout_gives_one_element_array():
    x = np.array([3.0], np.float32)
    halve(nh.by_ref(x))
    assert x[0] == 1.5


def test_layout_checked_on_call():
    with pytest.raises(ValueError, match="dtype"):
        bump_record(nh.by_ref(np.zeros(2, REC)))
    with pytest.raises(ValueError, match="declares user_data"):
        bump_record(None)
    with pytest.raises(ValueError, match="has dtype int64"):
        halve(nh.by_ref(np.zeros(1, np.int64)))


def test_error_model_numpy_gives_inf_not_exception(unraisables):
    a = np.array([1.0, 0.0])
    divide_by_zero(nh.by_ref(a))
    assert np.isinf(a[1])
    assert unraisables == []


def test_exception_in_body_is_reported_naming_the_host_function(unraisables):
    raises.ctypes(None)  # the machine code the driver calls: nobody to raise to
    assert len(unraisables) == 1
    report = unraisables[0]
    assert report.exc_type is ValueError
    assert "raised inside a host function" in str(report.exc_value)
    assert "CPUContext" not in str(report.object)
    assert "host function" in str(report.object) and "raises" in str(report.object)


def test_a_direct_call_raises_what_the_body_raises(unraisables):
    """Called directly, on the caller's thread, a host function raises like a function."""
    with pytest.raises(ValueError, match="raised inside a host function"):
        raises(None)

    @nh.host_callback(boundscheck=True)
    def out_of_bounds(p):
        carray(p, (2,), np.int64)[2] = 1

    with pytest.raises(IndexError):
        out_of_bounds(nh.by_ref(np.zeros(2, np.int64)))
    assert unraisables == []


@pytest.mark.parametrize(
    "options, call, result",
    [
        ({}, "int_div", 0),  # error_model='numpy' (the default): integer // 0 gives 0
        ({"error_model": "python"}, "int_div", ZeroDivisionError),
        ({"boundscheck": True}, "oob", IndexError),
        ({"boundscheck": False}, "oob", None),
    ],
)
def test_numba_options_pass_through(options, call, result):
    def int_div(p):
        a = carray(p, (2,), np.int64)
        a[0] = a[0] // a[1]

    def oob(p):
        a = carray(p, (4,), np.int64)[:2]
        a[3] = 7  # inside the buffer, outside the view

    fn = nh.host_callback(int_div if call == "int_div" else oob, **options)
    data = np.array([5, 0, 0, 0], np.int64)
    if isinstance(result, type):
        with pytest.raises(result):
            fn(nh.by_ref(data))
    else:
        fn(nh.by_ref(data))
        if result is not None:
            assert data[0] == result


@pytest.mark.parametrize(
    "option, why",
    [("parallel", "HostExecutor"), ("nopython", "always"), ("nogil", "never holds"), ("x", "")],
)
def test_numba_options_that_make_no_sense_are_refused_by_name(option, why):
    with pytest.raises(TypeError, match=f"option '{option}'.*{why}"):
        nh.host_callback(**{option: True})
    with pytest.raises(ValueError, match="error_model"):
        nh.host_callback(error_model="c")


def _noop(p):
    pass


@pytest.mark.parametrize(
    "options, error, says",
    [
        ({"fastmath": "yes"}, TypeError, "fastmath=...\\) expected True, False, or a set"),
        ({"fastmath": 1}, TypeError, "fastmath=...\\) expected .* got 1$"),
        ({"fastmath": ["nnan"]}, TypeError, "fastmath=...\\) expected .*'nnan'"),
        ({"fastmath": {"nnan", "fastest"}}, ValueError, "unknown flag\\(s\\) 'fastest'"),
        ({"fastmath": {"fast": True, 3: False}}, ValueError, "unknown flag\\(s\\) 3;"),
        ({"cache": "no"}, TypeError, "cache=...\\) expected True or False, got 'no'"),
        ({"cache": 1}, TypeError, "cache=...\\) expected True or False, got 1"),
        ({"debug": "no"}, TypeError, "debug=...\\) expected True or False, got 'no'"),
        ({"debug": None}, TypeError, "debug=...\\) expected True or False, got None"),
    ],
)
def test_wrong_option_values_are_refused_at_decoration_naming_the_option(options, error, says):
    """fastmath="yes" failed while compiling, in a HostCallbackCompileError from inside
    numba (and not at all when the decorator was made without the function); a truthy
    cache="no" or debug="no" turned the option on.  Refused when decorating, by name."""
    for call in (lambda: nh.host_callback(**options), lambda: nh.host_callback(_noop, **options)):
        with pytest.raises(error, match=says) as info:
            call()
        assert not isinstance(info.value, nh.HostCallbackCompileError)


@pytest.mark.parametrize(
    "fastmath", [True, False, {"nnan", "ninf"}, frozenset({"contract", "afn"}), {"fast": True}]
)
def test_fastmath_takes_a_bool_a_set_of_flags_or_numbas_dict(fastmath):
    _assert_scale_compiles_and_runs(fastmath=fastmath)


def _assert_scale_compiles_and_runs(**options):
    """A host function made with ``options`` compiles, and multiplies when called."""

    @nh.host_callback(**options)
    def scale(p):
        a = carray(p, (2,), np.float64)
        a[0] = a[0] * a[1]

    data = np.array([3.0, 2.0])
    scale(nh.by_ref(data))
    assert data[0] == 6.0


def test_numpy_bools_are_taken_for_the_bool_options():
    """np.True_ (a flag read from an array or a config parsed by numpy) was taken by
    cache= and debug= (and by numba.cfunc) until their values were checked as bools:
    then refused with "expected True or False, got True"; fastmath=np.True_ failed
    inside numba's compile (it reads only True itself as "fast")."""
    _assert_scale_compiles_and_runs(
        cache=np.False_, debug=np.False_, boundscheck=np.True_, fastmath=np.True_
    )


@pytest.mark.parametrize("value", ["no", 0, None])
def test_a_fastmath_dict_value_that_is_not_a_bool_is_refused(value):
    """numba's dict form enables each flag whose value is truthy: {"nnan": "no"}
    turned nnan on, the truthy "no" that cache= and debug= refuse."""
    with pytest.raises(TypeError, match=r"fastmath=\{flag: \.\.\.\}\) expected True or False"):
        nh.host_callback(_noop, fastmath={"nnan": value})


def test_wrong_options_are_refused_before_numba_is_imported():
    """The checks need no numba: a refused decorator leaves it unimported."""
    from _device import run_child

    out = run_child(
        "import sys\n"
        "import numba_hostfn as nh\n"
        "def f(p):\n"
        "    pass\n"
        "for options in ({'fastmath': 'yes'}, {'fastmath': {'x'}}, {'cache': 'no'},\n"
        "                {'debug': 1}):\n"
        "    try:\n"
        "        nh.host_callback(f, **options)\n"
        "    except (TypeError, ValueError) as error:\n"
        "        assert not isinstance(error, nh.HostCallbackCompileError), error\n"
        "    else:\n"
        "        raise AssertionError(options)\n"
        "print('numba' in sys.modules)\n"
    )
    assert out.split() == ["False"]


def test_compile_error_raises_at_decoration_naming_the_function():
    def uses_python_objects(p):
        return {"a": object()}

    with pytest.raises(nh.HostCallbackCompileError, match="uses_python_objects") as info:
        nh.host_callback(uses_python_objects)
    assert isinstance(info.value, TypeError)
    assert info.value.numba_error is not None  # numba's own error, kept
    assert info.value.__cause__ is None and info.value.__suppress_context__  # said once
    import traceback

    printed = "".join(traceback.format_exception(info.value))
    assert printed.count(str(info.value.numba_error).splitlines()[0]) == 1
    assert "object" in str(info.value)


def _returns_a_literal(p):
    carray(p, (1,), np.int64)[0] += 1
    return 0


def _returns_on_one_path(p):
    a = carray(p, (1,), np.int64)
    if a[0] > 0:
        return a[0]


def _record_returns_a_field(d):
    d.n += 1
    return d.n


def _array_returns_an_element(d):
    d[0] /= 2
    return d[0]


@pytest.mark.parametrize(
    "body, dtype, result",
    [
        (_returns_a_literal, None, "Literal[int](0)"),
        (_returns_on_one_path, None, "OptionalType(int64)"),
        (_record_returns_a_field, REC, "int64"),
        (_array_returns_an_element, np.float32, "float32"),
    ],
)
def test_a_body_that_returns_a_value_is_refused_saying_results_go_into_user_data(
    body, dtype, result
):
    """A host function returns nothing: numba's "No conversion from Literal[int](0)
    to none" (without dtype=) or a result silently dropped (with it) becomes a
    TypeError that names the function, the type and user_data."""
    with pytest.raises(TypeError) as info:
        nh.host_callback(dtype=dtype)(body)
    message = str(info.value)
    assert not isinstance(info.value, nh.HostCallbackCompileError), message
    assert body.__name__ in message and "returns a value" in message, message
    assert f"({result})" in message and "user_data" in message, message
    assert "No conversion" not in message and info.value.__suppress_context__


def test_a_body_that_returns_none_explicitly_compiles():
    @nh.host_callback
    def bare_return(p):
        a = carray(p, (1,), np.int64)
        if a[0] > 0:
            return
        a[0] = 7
        return None

    data = np.zeros(1, np.int64)
    bare_return(nh.by_ref(data))
    assert data[0] == 7


@pytest.mark.parametrize("bad", [1, "fn", len])
def test_hostfunction_rejects_non_functions(bad):
    with pytest.raises(TypeError, match="Python function"):
        nh.host_callback(bad)


@pytest.mark.parametrize(
    "given, says",
    [
        (REC, r"dtype is keyword-only: @host_callback\(dtype=\.\.\.\)"),
        (np.int64, r"dtype is keyword-only: @host_callback\(dtype=\.\.\.\)"),
        ("void(voidptr)", r"always void\(void\*\)"),
        (add_one, "compiled already"),
    ],
    ids=["dtype", "scalar-type", "signature", "host-function"],
)
def test_a_positional_option_or_a_host_function_is_refused_saying_what_to_write(given, says):
    """@host_callback(REC) (numba.cfunc takes its signature positionally) said only
    "expected a Python function, got VoidDType", not that dtype is keyword-only."""
    with pytest.raises(TypeError, match=says):
        nh.host_callback(given)


def test_a_host_function_copies_as_itself_and_pickles_by_name_or_says_why_not():
    """copy.deepcopy of anything holding a host function (a config, a dataclass) raised
    "cannot pickle 'HostFunction' object", and pickle said no more. Its machine code is
    fixed for its life: a copy is itself, as a function's is. A module-level one pickles
    by name, as a function does; any other says why not and what to do instead."""
    import copy
    import pickle

    holder = {"stage": add_one, "data": np.zeros(2)}
    copied = copy.deepcopy(holder)
    assert copied["stage"] is add_one and copy.copy(add_one) is add_one
    assert pickle.loads(pickle.dumps(add_one)) is add_one

    @nh.host_callback
    def local(p):
        pass

    assert copy.deepcopy([local])[0] is local
    with pytest.raises(TypeError, match="cannot be pickled.*top level of a module"):
        pickle.dumps(local)


def test_a_never_compiled_host_function_has_no_ctypes_pointer():
    """.ctypes of a HostFunction made with __new__ raised AttributeError '_ctypes' (and
    .inspect_llvm() and .cache_hits AttributeError '_cfunc')."""
    blank = nh.HostFunction.__new__(nh.HostFunction)
    with pytest.raises(ValueError, match="no machine code"):
        blank.ctypes  # noqa: B018
    with pytest.raises(ValueError, match="no machine code.*no LLVM IR"):
        blank.inspect_llvm()
    assert blank.cache_hits == 0


def _two(a, b):
    pass


def _with_default(p, q=1):
    carray(p, (1,), np.int64)[0] += q


def _star(*args):
    carray(args[0], (1,), np.int64)[0] += 1


def _keyword_only(p, *, k=2):
    carray(p, (1,), np.int64)[0] += k


def _keywords(p, **kw):
    carray(p, (1,), np.int64)[0] += 1


@pytest.mark.parametrize("function", [_two, _with_default, _star, _keyword_only, _keywords])
def test_hostfunction_rejects_wrong_arity(function):
    """One positional parameter and nothing else (the others once reached numba, whose
    "Signature mismatch" came as a HostCallbackCompileError)."""
    with pytest.raises(TypeError, match="exactly one argument"):
        nh.host_callback(function)


def _wraps_one_parameter(wrapper):
    """A copy of ``wrapper`` as ``functools.wraps`` makes it for a function of one
    parameter (a copy: wraps sets the attributes of the function it is given)."""

    def one(p):
        carray(p, (1,), np.int64)[0] += 1

    copy = types.FunctionType(
        wrapper.__code__, wrapper.__globals__, wrapper.__name__, wrapper.__defaults__
    )
    copy.__kwdefaults__ = wrapper.__kwdefaults__
    return functools.wraps(one)(copy)


@pytest.mark.parametrize("function", [_with_default, _star, _keyword_only, _keywords])
def test_hostfunction_rejects_wrong_arity_behind_functools_wraps(function):
    """The arity is the code's, which numba compiles: the check read inspect.signature,
    which follows ``__wrapped__``, so a wrapper made with functools.wraps passed as the
    wrapped function's one parameter; ``def w(*args, **kwargs)`` compiled, and one with
    a default failed in numba ("Variable 'q' is not defined"), blaming the wrapped
    function."""
    with pytest.raises(TypeError, match="exactly one argument") as info:
        nh.host_callback(_wraps_one_parameter(function))
    assert not isinstance(info.value, nh.HostCallbackCompileError), info.value


@pytest.mark.parametrize("dtype", ["not a dtype", object, np.dtype([("o", object)])])
def test_hostfunction_rejects_bad_dtype(dtype):
    with pytest.raises(TypeError):
        nh.host_callback(dtype=dtype)(lambda p: None)


@pytest.mark.parametrize(
    "dtype, says",
    [
        (np.dtype(("i8", 3)), "subarray dtype"),
        (np.dtype((np.int64, (1,))), "subarray dtype"),
        (np.dtype((np.dtype([("x", "f8")]), 2)), "subarray dtype"),
        (np.dtype([("flags", "?", 2)]), "field 'flags' is a subarray"),
        (np.dtype([("n", "i8"), ("r", [("name", "S4", 2)])]), "field 'r.name' is a subarray"),
        (np.dtype([("r", [("t", "M8[s]", 2)], 3)]), "field 'r.t' is a subarray"),
    ],
)
def test_a_subarray_numba_cannot_view_is_refused_at_decoration(dtype, says):
    """numba fails on these deep inside (an LLVM "Invalid store of [1 x i64]", or
    "'Boolean' object has no attribute 'bitwidth'"): refused by name, before compiling,
    when the decorator is made."""
    with pytest.raises(ValueError, match=says) as info:
        nh.host_callback(dtype=dtype)
    assert "instead" in str(info.value) or "Make the array a field" in str(info.value)


@pytest.mark.parametrize(
    "dtype, says",
    [
        (np.dtype("V8"), "raw bytes without fields"),
        (np.dtype([("n", "i8"), ("blob", "V4")]), "field 'blob' is raw bytes"),
        (np.dtype([("r", [("blob", "V2")])]), "field 'r.blob' is raw bytes"),
    ],
)
def test_an_unstructured_void_dtype_is_refused_at_decoration(dtype, says):
    """numba cannot type a void dtype without fields: it failed while compiling, with a
    HostCallbackCompileError that blamed the body and named the package's internal
    wrapper ("Untyped global name 'layout': |V8")."""
    with pytest.raises(ValueError, match=says) as info:
        nh.host_callback(dtype=dtype)
    assert "layout" not in str(info.value)


def _fills_subarrays(d):
    d.a[0] = 7
    d.m[1, 2] = 2.5
    d.r[1].v[0] = 3


def test_subarray_fields_of_numbers_and_records_work():
    """What the refusal above points to: a record's subarray fields of numbers or
    records, (1,) included, compile and are written in place."""
    layout = np.dtype([("a", np.int64, (1,)), ("m", "f8", (2, 3)), ("r", [("v", "i4", 2)], 2)])
    fn = nh.host_callback(dtype=layout)(_fills_subarrays)
    data = np.zeros(1, layout)
    fn(data)
    assert data["a"][0, 0] == 7 and data["m"][0, 1, 2] == 2.5 and data["r"][0, 1]["v"][0] == 3


def _twice_in_new_processes(script, cwd):
    """script's stdout in two new processes in turn, in cwd (numba's cache is written
    by the first, read by the second); each must exit 0."""
    outs = []
    for _ in range(2):
        run = subprocess.run(
            [sys.executable, "-c", script],
            cwd=cwd,
            capture_output=True,
            env=child_env(),
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr
        outs.append(run.stdout)
    return outs


def test_cache_true_loads_machine_code_in_a_new_process(tmp_path):
    module = tmp_path / "cached_hostfns.py"
    module.write_text(
        textwrap.dedent("""
        import numpy as np
        from numba import carray
        import numba_hostfn as nh

        @nh.host_callback(cache=True)
        def raw(p):
            carray(p, (1,), np.int64)[0] += 3

        @nh.host_callback(cache=True, dtype=np.dtype([("v", np.int64)]))
        def typed(d):
            d.v += 4
    """)
    )
    script = textwrap.dedent("""
        import numpy as np, numba_hostfn as nh, cached_hostfns as m
        a = np.zeros(1, np.int64); m.raw(nh.by_ref(a))
        r = np.zeros(1, np.dtype([("v", np.int64)])); m.typed(nh.by_ref(r))
        assert a[0] == 3 and r[0]["v"] == 4, (a, r)
        print(m.raw.cache_hits, m.typed.cache_hits)
        for fn in (m.raw, m.typed):
            try:
                print("ir" if "define" in fn.inspect_llvm() else "no-ir")
            except RuntimeError as error:
                print("refused" if "without cache=True" in str(error) else error)
    """)
    first, second = _twice_in_new_processes(script, tmp_path)
    assert first.split() == ["0", "0", "ir", "ir"]
    # Loaded code has no LLVM IR: numba returned an "Invalid result" (and a
    # UserWarning); inspect_llvm says so instead.
    assert second.split() == ["1", "1", "refused", "refused"], second


def test_cached_host_functions_of_one_factory_keep_their_own_layout_and_closure(tmp_path):
    """Two cache=True host functions of one name and line (made by one factory), with
    another dtype or another closure, each launch their own machine code, from the
    cache too: numba keys the dtype= wrapper by its template's bytecode, the same for
    all, so it once loaded the first one's code for the second (the larger layout's
    offsets written into the smaller buffer, or the other closure's constant)."""
    (tmp_path / "factory_hostfns.py").write_text(
        textwrap.dedent("""
        import numpy as np
        import numba_hostfn as nh

        SMALL = np.dtype([("x", np.int64)])
        LARGE = np.dtype([("pad", np.int64, (3,)), ("x", np.int64)])

        def bump(layout):
            @nh.host_callback(dtype=layout, cache=True)
            def fn(d):
                d.x += 1
            return fn

        def add(k):
            @nh.host_callback(dtype=SMALL, cache=True)
            def fn(d):
                d.x += k
            return fn
    """)
    )
    script = textwrap.dedent("""
        import numpy as np, numba_hostfn as nh, factory_hostfns as m
        nh.simulate_without_gpu()
        stream = nh.create_stream()
        small, large = m.bump(m.SMALL), m.bump(m.LARGE)
        one, five = m.add(1), m.add(5)
        a = np.zeros(1, m.LARGE)
        b = np.zeros(1, m.SMALL)
        nh.host_launch(stream, large, user_data=a)
        nh.host_launch(stream, five, user_data=b)
        stream.sync()
        print(a[0]["pad"].tolist(), a[0]["x"], b[0]["x"], large.cache_hits, five.cache_hits)
    """)
    hits = []
    for out in _twice_in_new_processes(script, tmp_path):  # compiled, then loaded
        assert out.split()[:5] == ["[0,", "0,", "0]", "1", "5"], out
        hits.append(out.split()[5:])
    assert hits == [["0", "0"], ["1", "1"]]


def test_cached_host_functions_of_one_body_keep_their_own_numba_options(tmp_path):
    """Two cache=True host functions of one body (one factory) with other numba options
    each run their own machine code: numba keys its cache by bytecode and closure, not
    by options, so the second loaded the first's code, in the same process too, and
    boundscheck=True or error_model='python' was silently dropped on the stream (the
    direct call, compiled apart, still raised, so testing it that way hid it)."""
    (tmp_path / "option_hostfns.py").write_text(
        textwrap.dedent("""
        import numpy as np
        from numba import carray
        import numba_hostfn as nh

        PAIR = np.dtype([("a", np.int64), ("b", np.int64)])

        def past_the_view(check):
            @nh.host_callback(cache=True, boundscheck=check)
            def fn(p):
                carray(p, (4,), np.int64)[:2][3] = 7
            return fn

        def divide(model):
            @nh.host_callback(dtype=PAIR, cache=True, error_model=model)
            def fn(d):
                d.a = d.a // d.b
            return fn
    """)
    )
    script = textwrap.dedent("""
        import sys
        import numpy as np, option_hostfns as m
        seen = []
        sys.unraisablehook = lambda report: seen.append(report.exc_type.__name__)
        for fn in (m.past_the_view(False), m.past_the_view(True)):
            fn.ctypes(np.zeros(4, np.int64).ctypes.data)  # the code a launch runs
        for fn in (m.divide("numpy"), m.divide("python")):
            fn.ctypes(np.array([(5, 0)], m.PAIR).ctypes.data)
        print(*seen)
    """)
    for out in _twice_in_new_processes(script, tmp_path):  # compiled, then loaded
        assert out.split() == ["IndexError", "ZeroDivisionError"], out


def test_cached_host_functions_of_one_line_keep_their_own_constants_and_names(tmp_path):
    """Two cache=True lambdas on one line differ only in a constant or a global's name,
    which numba's cache key leaves out (it hashes the bytecode, co_code, alone): the
    second loaded the first's machine code, and wrote its value or called its
    function."""
    (tmp_path / "line_hostfns.py").write_text(
        textwrap.dedent("""
        import numpy as np
        from numba import carray, njit
        import numba_hostfn as nh

        @njit
        def three(p):
            carray(p, (1,), np.int64)[0] = 3

        @njit
        def four(p):
            carray(p, (1,), np.int64)[0] = 4

        FNS = [nh.host_callback(lambda p: carray(p, (1,), np.int64).fill(1), cache=True), nh.host_callback(lambda p: carray(p, (1,), np.int64).fill(2), cache=True), nh.host_callback(lambda p: three(p), cache=True), nh.host_callback(lambda p: four(p), cache=True)]
    """)  # noqa: E501 - one line is the point
    )
    script = textwrap.dedent("""
        import numpy as np, line_hostfns as m
        out = np.zeros(len(m.FNS), np.int64)
        for i, fn in enumerate(m.FNS):
            fn.ctypes(out[i:].ctypes.data)  # the code a launch runs
        print(*out)
    """)
    for out in _twice_in_new_processes(script, tmp_path):  # compiled, then loaded
        assert out.split() == ["1", "2", "3", "4"], out


def _generator(p):
    carray(p, (1,), np.int64)[0] += 1
    yield


async def _coroutine(p):
    carray(p, (1,), np.int64)[0] += 1


async def _async_generator(p):
    carray(p, (1,), np.int64)[0] += 1
    yield


@pytest.mark.parametrize("function", [_generator, _coroutine, _async_generator])
def test_a_generator_or_coroutine_function_is_refused_at_decoration(function):
    """A call of one makes a generator or coroutine and never runs the body: a
    generator body once failed with an internal "address cannot be NULL", and an
    async def body compiled and ran, unawaited, on the driver's thread."""
    with pytest.raises(TypeError, match="generator or coroutine function.*plain def"):
        nh.host_callback(function)


def _add_ten(p):
    carray(p, (1,), np.int64)[0] += 10


def test_a_second_init_is_refused_and_changes_nothing():
    """HostFunction.__init__ again on a compiled one once renamed it (py_func, repr)
    before refusing, while launches still ran the first body."""
    text, address, py_func = repr(add_one), add_one.address, add_one.py_func
    with pytest.raises(RuntimeError, match="compiled already"):
        nh.HostFunction.__init__(add_one, _add_ten)
    assert add_one.py_func is py_func and repr(add_one) == text and add_one.address == address
    a = np.zeros(1, np.int64)
    add_one(nh.by_ref(a))
    assert a[0] == 1


def test_a_never_compiled_host_function_has_a_repr_and_refuses_a_direct_call():
    blank = nh.HostFunction.__new__(nh.HostFunction)
    assert "never compiled" in repr(blank)
    with pytest.raises(ValueError, match="no machine code"):
        blank(np.zeros(1, np.int64))


def test_a_non_native_byte_order_dtype_is_refused_clearly():
    """A big-endian dtype= fails deep in numba with "Untyped global name 'layout'"."""
    for dt in (np.dtype(">i8"), np.dtype([("a", "<i8"), ("b", ">f8")])):
        with pytest.raises(ValueError, match="byte order"):

            @nh.host_callback(dtype=dt)
            def f(d):
                pass


def test_a_refused_direct_call_keeps_no_buffer_exported_while_its_error_lives():
    """Invariant 3 for a direct call: user data the body's layout refuses was kept
    exported (a bytearray could not be resized) by the frames of the error's
    traceback, for as long as the error lived."""
    buf = bytearray(REC.itemsize - 1)  # one byte short of the declared layout
    try:
        bump_record(buf)
    except ValueError as caught:
        error = caught
    assert "dtype" in str(error)
    buf.append(0)  # BufferError while the error kept the export


def test_a_refused_direct_call_of_a_by_ref_keeps_no_buffer_exported():
    """As above with ``by_ref(buf)`` made in the call: the direct call's own frame
    kept it as its argument, so buf stayed unresizable while the error lived."""
    buf = bytearray(REC.itemsize - 1)
    error = None
    try:
        bump_record(nh.by_ref(buf))
    except ValueError as caught:
        error = caught
    assert "dtype" in str(error)
    buf.append(0)  # BufferError while the error kept the ByRef


def test_a_non_native_subarray_field_is_refused_clearly():
    """numpy says a dtype whose only non-native part is a subarray field's base is
    native (``np.dtype([("a", ">i4", (2,))]).isnative`` is True), so the byte-order
    check let it through and numba failed with "Untyped global name 'layout'"."""
    for dt in (
        np.dtype([("a", ">i4", (2,))]),
        np.dtype([("x", "<f8"), ("inner", [("a", ">i4", (2,))])]),
    ):
        with pytest.raises(ValueError, match="byte order"):

            @nh.host_callback(dtype=dt)
            def f(d):
                pass


def test_a_refused_direct_call_keeps_no_view_it_was_given_while_its_error_lives():
    """Invariant 3: the direct call's own frame kept its user_data argument in the
    error's traceback, so a memoryview made for the call kept its bytearray exported."""
    buf = bytearray(REC.itemsize - 1)
    try:
        bump_record(memoryview(buf))
    except ValueError as caught:
        error = caught
    assert "dtype" in str(error)
    buf.append(0)  # BufferError while the error kept the memoryview


_LONG_DOUBLE = pytest.mark.skipif(
    np.dtype(np.longdouble).itemsize == 8, reason="long double is double on this platform"
)


@pytest.mark.parametrize(
    "dtype, says, instead",
    [
        (np.float16, "host_callback\\(dtype=...\\) is float16", "np.float32"),
        (np.dtype([("n", "i8"), ("h", np.float16)]), "field 'h' is float16", "np.uint16"),
        (np.dtype([("h", np.float16, (4,))]), "field 'h' is float16", "np.float32"),
        (np.dtype([("r", [("h", "e")], 2)]), "field 'r.h' is float16", "np.float32"),
        pytest.param(np.longdouble, "is float", "np.float64", marks=_LONG_DOUBLE),
        pytest.param(
            np.dtype([("z", np.clongdouble)]),
            "field 'z' is complex",
            "np.complex128",
            marks=_LONG_DOUBLE,
        ),
    ],
)
def test_a_float16_or_long_double_is_refused_at_decoration_naming_the_field(dtype, says, instead):
    """numba's CPU target has no float16: the compile failed with a
    HostCallbackCompileError whose whole explanation was "float16" (a long double:
    "Untyped global name 'layout': float128", naming the package's wrapper)."""
    with pytest.raises(ValueError, match=says) as info:
        nh.host_callback(dtype=dtype)
    message = str(info.value)
    assert "numba cannot compile" in message and instead in message, message
    assert "layout" not in message


def test_numba_still_cannot_compile_float16_on_the_cpu():
    """Why float16 is refused: should numba learn it, this fails, and the refusal
    (_hostfunction._check_number_types) can go."""
    import numba

    @numba.njit
    def double(a):
        a[0] = a[0] * 2

    with pytest.raises(Exception, match="float16"):
        double(np.ones(1, np.float16))


@pytest.mark.parametrize(
    "dtype, says",
    [
        (np.dtype("M8[s]"), "host_callback\\(dtype=...\\) is datetime64\\[s\\]"),
        (np.dtype("m8"), "host_callback\\(dtype=...\\) is timedelta64"),
        (np.dtype([("t", "M8[ns]"), ("n", "i8")]), "field 't' is datetime64\\[ns\\]"),
        (np.dtype([("r", [("dt", "m8[us]")])]), "field 'r.dt' is timedelta64\\[us\\]"),
    ],
)
def test_a_datetime_layout_no_array_can_be_passed_for_is_refused_at_decoration(dtype, says):
    """numpy cannot export datetime64 or timedelta64 through the buffer protocol, so an
    array of such a layout could not be given to the host function (nor by_ref'd): the
    decorator took the dtype, and every launch or direct call of the array failed with
    numpy's bare "cannot include dtype 'M' in a buffer"; only bytes or a raw address
    got through.  Refused when decorating, saying what to declare instead."""
    with pytest.raises(ValueError, match="cannot include dtype"):
        memoryview(np.zeros(1, dtype))  # why: should numpy learn it, this fails
    with pytest.raises(ValueError, match=says) as info:
        nh.host_callback(dtype=dtype)
    message = str(info.value)
    assert "np.int64" in message and ".view(np.int64)" in message, message


@pytest.mark.parametrize(
    "dtype",
    [
        np.dtype({"names": ["a", "b"], "formats": ["i8", "i8"], "offsets": [8, 0]}),
        np.dtype({"names": ["a", "b"], "formats": ["i8", "i4"], "offsets": [0, 0]}),
        np.dtype(
            [("n", "i8"), ("r", {"names": ["x", "y"], "formats": ["i4", "i4"], "offsets": [4, 0]})]
        ),
    ],
)
def test_a_layout_numpy_cannot_share_as_a_buffer_is_refused_at_decoration(dtype):
    """Fields out of the order of their offsets, or overlapping: numpy cannot export an
    array of such a layout ("not representable as buffers"), so the decorator took a
    dtype that every launch or direct call of the array then failed on."""
    with pytest.raises(ValueError, match="not representable"):
        memoryview(np.zeros(1, dtype))  # why: should numpy learn it, this fails
    with pytest.raises(ValueError, match="cannot share an array of it") as info:
        nh.host_callback(dtype=dtype)
    assert "order of their offsets" in str(info.value)


def test_a_direct_call_of_a_body_with_objmode_warns_nothing():
    """A direct call (the documented way to unit-test a host function) of a body with
    ``numba.objmode`` warned "Code running in object mode won't allow parallel
    execution despite nogil=True", from the package's own direct-call wrapper: a
    failure under warnings-as-errors, which its launches never gave."""
    import warnings

    import numba

    @nh.host_callback
    def boxes(p):
        with numba.objmode():
            pass
        carray(p, (1,), np.int64)[0] += 1

    data = np.zeros(1, np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        boxes(nh.by_ref(data))
    assert data[0] == 1


def _misspells_a_field(d):
    d.n += 1
    d.count += 1  # REC has x and n: no count


def test_a_misspelled_record_field_names_the_field_the_fields_and_the_line():
    """numba types an unknown field of a record with a bare KeyError: the compile error
    said only "'count'", not that it is a field the record lacks, nor where."""
    with pytest.raises(nh.HostCallbackCompileError) as info:
        nh.host_callback(_misspells_a_field, dtype=REC)
    message = str(info.value)
    line = _misspells_a_field.__code__.co_firstlineno + 2
    assert "no field 'count'" in message, message
    assert "'x', 'n'" in message, message
    assert f"test_hostfunction.py:{line}" in message, message
    assert isinstance(info.value.numba_error, KeyError)


def _types_badly_on_its_third_line(d):
    d.n += 1
    d.x += 1.0
    d.n = "text" + d.n


def test_a_typed_body_s_compile_error_points_at_no_innocent_line():
    """With dtype=, the body is called from a wrapper whose code was placed on the
    body's first line: numba's message ended with "typing of call at ...(first
    line)" and quoted that line (``d.n += 1``, which is fine) under a caret, as if
    the error were there."""
    with pytest.raises(nh.HostCallbackCompileError) as info:
        nh.host_callback(_types_badly_on_its_third_line, dtype=REC)
    message = str(info.value)
    first = _types_badly_on_its_third_line.__code__.co_firstlineno
    assert f"line {first + 3}:" in message, message  # the error's own line
    assert f"line {first + 1}:" not in message and f"({first + 1})" not in message, message


def test_a_body_s_frozen_globals_are_part_of_its_cache_key(tmp_path):
    """numba compiles a global's value into the machine code and keys its cache by
    the bytecode alone: a cache=True host function made again after a global it
    reads changed (a constant, an array, a module's attribute, a jitted function it
    calls) loaded the old value's machine code, in the same process too, and in the
    next process wherever the value came from elsewhere (an environment variable)."""
    (tmp_path / "frozen_settings.py").write_text("SCALE = 10\n")
    (tmp_path / "frozen_hostfns.py").write_text(
        textwrap.dedent("""
        import numpy as np
        from numba import carray, njit
        import numba_hostfn as nh
        import frozen_settings

        K = 1
        TABLE = np.array([100])
        REC = np.dtype([("a", np.int64), ("b", np.int64)])

        @njit
        def plus_one(v):
            return v + 1

        @njit
        def plus_two(v):
            return v + 2

        step = plus_one

        def raw():
            @nh.host_callback(cache=True)
            def fn(p):
                a = carray(p, (2,), np.int64)
                a[0] = step(K)
                a[1] = TABLE[0] * frozen_settings.SCALE
            return fn

        def typed():
            @nh.host_callback(cache=True, dtype=REC)
            def fn(d):
                d.a = step(K)
                d.b = TABLE[0] * frozen_settings.SCALE
            return fn
    """)
    )
    script = textwrap.dedent("""
        import numpy as np, frozen_hostfns as m, frozen_settings
        seen = []
        for change in range(2):
            if change:
                m.K, m.TABLE, m.step = 5, np.array([200]), m.plus_two
                frozen_settings.SCALE = 3
            for make in (m.raw, m.typed):
                out = np.zeros(2, np.int64)
                fn = make()
                fn.ctypes(out.ctypes.data)  # the code a launch runs
                seen += [*out.tolist(), fn.cache_hits]
        print(*seen)
    """)
    first, second = _twice_in_new_processes(script, tmp_path)  # compiled, then loaded
    assert first.split() == "2 1000 0 2 1000 0 7 600 0 7 600 0".split(), first
    assert second.split() == "2 1000 1 2 1000 1 7 600 1 7 600 1".split(), second


def test_what_a_module_or_class_holds_is_part_of_the_cache_key(tmp_path):
    """A global read through a module or a class (a jitted function as
    ``helpers.f()``, an enum member as ``E.A``, a constant two modules down as
    ``pkg.sub.CONST``) is compiled into the machine code as a bare global is, but
    only a module's number, one level down, was in the cache key: after a change,
    a cache=True host function loaded the old value's code."""
    package = tmp_path / "frozen_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent("""
        import enum
        from numba import njit
        from . import sub

        @njit
        def f():
            return 1

        @njit
        def g():
            return 2

        def make_enum(value):
            return enum.IntEnum("E", {"A": value})

        E = make_enum(1)
    """)
    )
    (package / "sub.py").write_text("CONST = 10\n")
    (tmp_path / "frozen_members.py").write_text(
        textwrap.dedent("""
        import numpy as np
        from numba import carray
        import numba_hostfn as nh
        import frozen_pkg

        def made():
            @nh.host_callback(cache=True)
            def fn(p):
                a = carray(p, (3,), np.int64)
                a[0] = frozen_pkg.f()
                a[1] = frozen_pkg.E.A
                a[2] = frozen_pkg.sub.CONST
            return fn
    """)
    )
    script = textwrap.dedent("""
        import numpy as np, frozen_members as m, frozen_pkg
        seen = []
        for change in range(2):
            if change:
                frozen_pkg.f, frozen_pkg.E = frozen_pkg.g, frozen_pkg.make_enum(2)
                frozen_pkg.sub.CONST = 20
            out = np.zeros(3, np.int64)
            fn = m.made()
            fn.ctypes(out.ctypes.data)  # the code a launch runs
            seen += [*out.tolist(), fn.cache_hits]
        print(*seen)
    """)
    first, second = _twice_in_new_processes(script, tmp_path)  # compiled, then loaded
    assert first.split() == "1 1 10 0 2 2 20 0".split(), first
    assert second.split() == "1 1 10 1 2 2 20 1".split(), second


@pytest.mark.parametrize("filename", ["<string>", "<ipython-input-1-0123456789ab>"])
def test_cache_true_where_numba_cannot_cache_says_so_not_that_the_body_fails(filename):
    """A function numba finds no cache locator for (made by exec, ``python -c``, a
    notebook cell without IPython) raised HostCallbackCompileError "cannot compile host
    function" with numba's "no locator available" (or "could not get source code"),
    although its body compiles: now a ValueError that says cache=True is the
    problem, raised before anything is compiled."""
    scope = {"carray": carray, "np": np}
    code = compile("def made(p):\n    carray(p, (1,), np.int64)[0] += 1\n", filename, "exec")
    exec(code, scope)
    with pytest.raises(ValueError, match="cache=True") as info:
        nh.host_callback(scope["made"], cache=True)
    message = str(info.value)
    assert not isinstance(info.value, nh.HostCallbackCompileError), message
    assert "'made'" in message and filename in message and "without cache=True" in message


def test_numba_disable_jit_is_refused_saying_so(monkeypatch):
    """With NUMBA_DISABLE_JIT=1 (numba's switch for debugging jitted code in Python)
    numba compiles no callee, and every host function failed to compile with numba's
    "'function' object has no attribute 'get_call_template'" (with dtype=: "Untyped
    global name 'body'", the package's wrapper), blaming the body. Set at run time (as
    here), the body still compiled, and its direct call failed with "<intrinsic
    as_voidptr> is not usable in pure-python"."""
    import numba

    monkeypatch.setattr(numba.config, "DISABLE_JIT", 1)
    with pytest.raises(RuntimeError, match="NUMBA_DISABLE_JIT") as info:
        nh.host_callback(_add_ten)
    assert not isinstance(info.value, nh.HostCallbackCompileError)


class _Holder:
    def method(self, p):
        pass

    @staticmethod
    def static(p):
        pass


def test_a_wrapped_or_compiled_function_is_refused_saying_what_to_decorate():
    """A numba cfunc, a staticmethod or classmethod object (``@host_callback`` above
    ``@staticmethod`` in a class), a bound method and a functools.partial were refused
    with "expected a Python function, got CFunc" (staticmethod, method, partial) and
    nothing on what to write instead."""
    import numba

    cfunc = numba.cfunc("void(voidptr)")(_noop)
    cases = [
        (cfunc, "got CFunc: .*compiled already.*host_launch.*__wrapped__"),
        (_Holder.__dict__["static"], "got staticmethod: decorate the function under it"),
        (classmethod(_noop), "got classmethod: decorate the function under it"),
        (_Holder().method, "got method: .*self.*a plain function of one parameter"),
        (functools.partial(_noop), "got partial: .*user_data"),
    ]
    for given, says in cases:
        with pytest.raises(TypeError, match=says):
            nh.host_callback(given)


def _calls_a_host_function(p):
    add_one(p)


def test_a_body_calling_a_host_function_is_told_to_share_an_njit_function():
    """numba cannot call a HostFunction from compiled code: the error said only
    "Cannot determine Numba type of <class '...HostFunction'>"."""
    with pytest.raises(nh.HostCallbackCompileError) as info:
        nh.host_callback(_calls_a_host_function)
    message = str(info.value)
    assert "Untyped global name 'add_one'" in message, message  # numba's, kept
    assert "cannot call another host function" in message and "@numba.njit" in message
