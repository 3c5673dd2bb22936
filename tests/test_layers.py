"""The package's floors (docs/architecture.md) hold: import-linter's contracts of
``[tool.importlinter]`` in pyproject.toml -- the layers (each floor imports only those below
it; ``cli/`` and ``desktop/`` not each other), no import circle between the modules of any
package (imports under ``if TYPE_CHECKING:`` included), and ``desktop/`` never importing the
server or the reconciler. The same contracts are shown to break on a copy of the package
given a circle or an upward import. And no class in ``daemon/`` outgrows 700 lines."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` of the running interpreter's environment on the package and the
    contracts under ``root``, without a cache (nothing written into the tree)."""
    script = Path(sys.executable).parent / "lint-imports"
    assert script.exists(), f"{script}: missing; `make deps` installs import-linter (dev extra)"
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(script), "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_import_contracts_are_kept() -> None:
    run = lint_imports(REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout, run.stdout


# (file under schedswitchd/, the line after which an import is put, the import, what breaks)
BREAKS = {
    "type-checking circle in daemon/": (
        "daemon/connection.py",
        "from __future__ import annotations\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from schedswitchd.daemon.server import Server\n",
        "No cycles are allowed in schedswitchd.daemon.",
    ),
    "the standby hit reaching past its HitHost": (
        "daemon/direct_switch.py",
        "from __future__ import annotations\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from schedswitchd.daemon.reconcile import Reconciler\n",
        "No cycles are allowed in schedswitchd.daemon.",
    ),
    "kernel/ importing daemon/": (
        "kernel/lru.py",
        "from __future__ import annotations\n",
        "import schedswitchd.daemon.config\n",
        "schedswitchd.kernel.lru -> schedswitchd.daemon.config",
    ),
    "profile/ importing kernel/": (
        "profile/model.py",
        "from __future__ import annotations\n",
        "import schedswitchd.kernel.lru\n",
        "schedswitchd.profile.model -> schedswitchd.kernel.lru",
    ),
    "daemon/ starting desktop/'s faces": (
        "daemon/service.py",
        "    loop = asyncio.get_running_loop()\n",
        "    from schedswitchd.desktop.faces import start_faces\n",
        "schedswitchd.daemon.service -> schedswitchd.desktop.faces",
    ),
    "profile/ running cli/'s commands": (
        "profile/model.py",
        "from __future__ import annotations\n",
        "import schedswitchd.cli.profile_cmd\n",
        "schedswitchd.profile.model -> schedswitchd.cli.profile_cmd",
    ),
    "cli/ reaching up to the composed command": (
        "cli/ctl.py",
        "from __future__ import annotations\n",
        "import schedswitchd.app\n",
        "schedswitchd.cli.ctl -> schedswitchd.app",
    ),
    "desktop/ importing the server": (
        "desktop/faces.py",
        "from __future__ import annotations\n",
        "import schedswitchd.daemon.server\n",
        "schedswitchd.desktop.faces -> schedswitchd.daemon.server",
    ),
}


@pytest.mark.parametrize("case", sorted(BREAKS))
def test_a_circle_or_an_upward_import_breaks_a_contract(tmp_path: Path, case: str) -> None:
    rel, anchor, text, expected = BREAKS[case]
    shutil.copytree(
        REPO / "schedswitchd", tmp_path / "schedswitchd", ignore=shutil.ignore_patterns("*.pyc")
    )
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path / "schedswitchd" / rel
    source = path.read_text()
    assert anchor in source, (rel, anchor)
    path.write_text(source.replace(anchor, anchor + text, 1))
    run = lint_imports(tmp_path)
    assert run.returncode != 0, run.stdout + run.stderr
    assert expected in run.stdout, run.stdout


#: The most lines a class in ``schedswitchd/daemon/`` may span (decorators to its last line).
DAEMON_CLASS_LINES_MAX = 700


def test_no_class_in_the_daemon_package_is_over_700_lines() -> None:
    """The daemon's classes stay small enough to read whole: each at most
    :data:`DAEMON_CLASS_LINES_MAX` lines."""
    import ast

    too_long = []
    for path in sorted((REPO / "schedswitchd" / "daemon").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = (node.end_lineno or node.lineno) - first + 1
                if lines > DAEMON_CLASS_LINES_MAX:
                    too_long.append(f"{path.name}: {node.name} {lines} lines")
    assert not too_long, too_long
