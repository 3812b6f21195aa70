"""The documentation keeps up with the code: every public name has a reference entry."""

import pathlib
import re

import numba_hostfn

API = (pathlib.Path(__file__).parent.parent / "docs" / "api.md").read_text()


def test_every_public_name_has_a_reference_entry():
    documented = set(re.findall(r"numba_hostfn\.([A-Za-z_][\w.]*)", API))
    public = {n for n in numba_hostfn.__all__ if n != "simulator"}
    public |= {f"simulator.{n}" for n in numba_hostfn.simulator.__all__}
    public.discard("simulator.SimulatorUnsupportedError")  # the same class, documented once
    assert sorted(public - documented) == []
