"""Import one submodule of a package without running the package's ``__init__`` first: how
:mod:`schedswitchd.kernel.uevents` imports pyroute2's uevent socket (its one user).

Why: ``import pyroute2.netlink.uevent`` runs ``pyroute2/__init__.py`` first, and that
re-exports *every* pyroute2 API (IPRoute, NDB, IPDB, nftables, wireguard, ...), most of it
resident memory a daemon that only reads kernel uevents does not need (docs/performance.md,
"Memory"). Python imports a submodule's parent packages, but it
only needs each parent's ``__path__`` to find the child.

:func:`import_submodule` registers the package as a module object built from its spec
(``__path__``, ``__spec__``, ``__file__``, loader) whose ``__init__`` has *not* run, then
imports the submodule normally. The package is not broken for anyone else in the process: a
module-level ``__getattr__`` (PEP 562) runs the real ``__init__`` into that same module object
on the first access to a name it does not have yet that is not a submodule
(``pyroute2.IPRoute``, ``from pyroute2 import NDB``), so later users see the whole package;
``from pyroute2 import config`` (which pyroute2's own modules do) imports just that submodule.

The narrow path is taken only when the package is not imported yet; when anything in it fails,
the partial modules are removed and the ordinary import runs (logged), so the worst case is
the memory cost of the plain import, never a missing module.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import threading
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

_lock = threading.RLock()


def import_submodule(package: str, submodule: str) -> ModuleType:
    """``package.submodule`` (e.g. ``"pyroute2"``, ``"netlink.uevent"``), imported without
    running ``package/__init__.py`` when ``package`` is not imported yet.

    ``package`` must be a top-level package. Raises ``ImportError`` (or what the module's
    code raises) exactly as ``importlib.import_module(f"{package}.{submodule}")`` would.
    """
    full = f"{package}.{submodule}"
    with _lock:
        if package in sys.modules:
            return importlib.import_module(full)
        try:
            _register_bare_package(package)
            return importlib.import_module(full)
        except Exception as exc:
            _forget(package)
            log.warning("narrow import of %s failed (%s); importing all of %s", full, exc, package)
            return importlib.import_module(full)


def _register_bare_package(package: str) -> None:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.submodule_search_locations is None or spec.loader is None:
        raise ImportError(f"{package} is not an importable package", name=package)
    module = importlib.util.module_from_spec(spec)  # attributes set, code not executed
    loader = spec.loader

    def complete(name: str) -> Any:
        # PEP 562: called only for names the module lacks, so never for __path__/__spec__.
        # ``from package import submodule`` asks for the attribute first: a submodule is
        # imported on its own (what the import system does next anyway), anything else
        # needs the real __init__.
        if not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}"):
            return importlib.import_module(f"{package}.{name}")
        with _lock:
            if module.__dict__.get("__getattr__") is complete:
                del module.__dict__["__getattr__"]
                loader.exec_module(module)  # the real __init__, into the same module object
        try:
            return module.__dict__[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    module.__dict__["__getattr__"] = complete
    sys.modules[package] = module


def _forget(package: str) -> None:
    prefix = package + "."
    for name in [n for n in sys.modules if n == package or n.startswith(prefix)]:
        del sys.modules[name]


def package_completed(package: str) -> bool:
    """True if ``package`` is imported and its ``__init__`` has run (False while it is only
    the bare package of :func:`import_submodule`, or not imported)."""
    module = sys.modules.get(package)
    return module is not None and not _is_bare(module)


def _is_bare(module: ModuleType) -> bool:
    hook = module.__dict__.get("__getattr__")
    return hook is not None and getattr(hook, "__qualname__", "").startswith(
        "_register_bare_package"
    )
