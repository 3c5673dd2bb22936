"""Glue between a VM test module and its driver (``tests/vm/*_driver.py``): the script line
that runs a driver inside the VM, and the reading of one part of the JSON it leaves.

A driver runs as ``python -m tests.vm.NAME ARGS`` from the checkout, which the VM sees at
``$REPO`` (with ``$PY`` its interpreter and ``$RESULTS`` the writable share; see
:func:`tools.vm.run_in_vm`). Each records its observations in parts keyed by case; a
part whose case raised holds ``exception`` (and ``tb``, the traceback) instead.
"""

from __future__ import annotations

from typing import Any


def driver_line(module: str, *args: str) -> str:
    """The VM script's line (``\\n``-terminated) that runs ``tests.vm.<module>`` with
    ``args``, which are pasted as they are: quote them for the shell, ``"$RESULTS/x.json"``."""
    return f'cd "$REPO" && PYTHONPATH="$REPO" "$PY" -m tests.vm.{module} {" ".join(args)}\n'


def driver_part(observed: dict[str, Any], key: str) -> dict[str, Any]:
    """``observed[key]``, failing the test with the driver's traceback if that case raised."""
    part: dict[str, Any] = observed[key]
    assert "exception" not in part, part.get("tb") or part["exception"]
    return part
