"""The narrow import of pyroute2's uevent socket: events still arrive from the real kernel, the
rest of pyroute2 is not imported, and the package stays whole for anyone who asks for more."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from schedswitchd.kernel.narrow_import import import_submodule, package_completed

REPO = Path(__file__).resolve().parents[2]
LO_UEVENT = Path("/sys/class/net/lo/uevent")
# Modules that only `pyroute2/__init__.py` pulls in (IPRoute, NDB, nftables).
EAGER_ONLY = ("pyroute2.iproute", "pyroute2.ndb", "pyroute2.netlink.nfnetlink.nftsocket")


def _run(code: str, tmp_path: Path | None = None) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter (clean ``sys.modules``); its last stdout line is
    JSON."""
    env = dict(os.environ)
    if tmp_path is not None:
        env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env.get('PYTHONPATH', '')}"
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["stderr"] = proc.stderr
    return result


@pytest.mark.skipif(
    os.geteuid() != 0 or not LO_UEVENT.exists(), reason="needs root and /sys/class/net/lo"
)
def test_uevent_listener_gets_kernel_event_without_importing_all_of_pyroute2() -> None:
    got = _run(
        """
        import json, sys, threading
        from pathlib import Path
        from schedswitchd.kernel.uevents import UeventListener
        from schedswitchd.kernel.narrow_import import package_completed

        seen = threading.Event()
        events = []
        def on_net(ev):
            if ev.devpath == "/devices/virtual/net/lo" and ev.action == "change":
                events.append(ev.env.get("INTERFACE"))
                seen.set()
        with UeventListener() as listener:
            listener.subscribe("net", on_net)
            for _ in range(5):  # another writer's event may arrive first; ours is a "change"
                Path("/sys/class/net/lo/uevent").write_text("change")
                if seen.wait(2.0):
                    break
        print(json.dumps({
            "interfaces": events[:1],
            "completed": package_completed("pyroute2"),
            "loaded": sorted(m for m in sys.modules if m.startswith("pyroute2")),
        }))
        """
    )
    assert got["interfaces"] == ["lo"]
    assert got["completed"] is False
    loaded = got["loaded"]
    assert isinstance(loaded, list)
    assert "pyroute2.netlink.uevent" in loaded
    assert not [m for m in EAGER_ONLY if m in loaded]
    assert len(loaded) < 40, loaded  # the socket's own chain; the whole package is ~160


def test_bare_package_completes_on_first_other_name() -> None:
    got = _run(
        """
        import json, sys
        from schedswitchd.kernel.narrow_import import import_submodule, package_completed
        mod = import_submodule("pyroute2", "netlink.uevent")
        bare = not package_completed("pyroute2")
        import pyroute2
        from pyroute2 import config  # a submodule: must not complete the package
        still_bare = not package_completed("pyroute2")
        from pyroute2 import IPRoute  # a name only __init__ defines
        from pyroute2.netlink.uevent import AsyncUeventSocket
        print(json.dumps({
            "bare": bare, "still_bare": still_bare,
            "completed": package_completed("pyroute2"),
            "iproute": IPRoute.__name__, "version": pyroute2.__version__,
            "same_class": AsyncUeventSocket is mod.AsyncUeventSocket,
            "config_is_module": type(config).__name__ == "module",
        }))
        """
    )
    assert got["bare"] and got["still_bare"] and got["completed"]
    assert got["iproute"] == "IPRoute"
    assert got["version"] not in ("", "unknown")
    assert got["same_class"] and got["config_is_module"]


def test_already_imported_package_is_used_as_is() -> None:
    got = _run(
        """
        import json, pyroute2
        from schedswitchd.kernel.narrow_import import import_submodule, package_completed
        mod = import_submodule("pyroute2", "netlink.uevent")
        print(json.dumps({"completed": package_completed("pyroute2"),
                          "name": mod.__name__,
                          "hook": "__getattr__" in vars(pyroute2)}))
        """
    )
    assert got == {
        "completed": True,
        "name": "pyroute2.netlink.uevent",
        "hook": False,
        "stderr": "",
    }


def test_narrow_failure_falls_back_to_the_ordinary_import(tmp_path: Path) -> None:
    # A package whose submodule only works after __init__ ran.
    pkg = tmp_path / "needsinit"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("READY = True\n")
    (pkg / "sub.py").write_text(
        "import sys\n"
        "if not sys.modules['needsinit'].__dict__.get('READY'):\n"
        "    raise RuntimeError('package __init__ has not run')\n"
        "VALUE = 42\n"
    )
    got = _run(
        """
        import json, logging
        logging.basicConfig(level=logging.WARNING)
        from schedswitchd.kernel.narrow_import import import_submodule, package_completed
        mod = import_submodule("needsinit", "sub")
        print(json.dumps({"value": mod.VALUE, "completed": package_completed("needsinit")}))
        """,
        tmp_path,
    )
    assert got["value"] == 42 and got["completed"] is True
    assert "narrow import of needsinit.sub failed" in str(got["stderr"])
    assert "package __init__ has not run" in str(got["stderr"])


def test_missing_package_or_submodule_raises_like_import(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ModuleNotFoundError):
        import_submodule("schedswitchd_no_such_package", "x")
    assert "schedswitchd_no_such_package" not in sys.modules
    with caplog.at_level(logging.WARNING), pytest.raises(ModuleNotFoundError):
        import_submodule("schedswitchd", "no_such_submodule")
    assert package_completed("schedswitchd")  # already imported: untouched
