"""Man pages and shell completions of the commands, generated from their argparse parsers.

The parsers are the programs' own (``build_parser()`` of :mod:`schedswitchd.daemon.service`,
:mod:`schedswitchd.cli.ctl`, :mod:`schedswitchd.cli.run` and
:mod:`schedswitchd.desktop.gamemode`), so ``--help``, the man page and the completions cannot
drift apart. Man pages (roff; the daemon's in section 8, system administration, the
commands' in section 1) come from argparse-manpage,
completions (bash, zsh) from shtab: both are development dependencies (``.[dev]``), never
needed at run time.

``python -m tools.cli_docs --man DIR --completions DIR`` writes

- ``DIR/NAME.SECTION`` for each command: ``schedswitchd.8``, ``schedswitchctl.1``,
  ``schedswitch-run.1`` (``man -l DIR/schedswitchctl.1`` to read one);
- ``DIR/bash/NAME`` (for ``/usr/share/bash-completion/completions/``) and ``DIR/zsh/_NAME``
  (for a directory on ``$fpath``, e.g. ``/usr/share/zsh/vendor-completions/``).

``make man completions`` runs it into ``build/man`` and ``build/completions``; ``make install``
copies the results under ``$(DESTDIR)$(PREFIX)``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from argparse_manpage.manpage import Manpage  # type: ignore[import-untyped]
from shtab import DIRECTORY, FILE, complete

from schedswitchd import __version__
from schedswitchd.cli import ctl, run
from schedswitchd.daemon import service
from schedswitchd.daemon.config_dropins import DROPIN_DIR
from schedswitchd.daemon.launcher_wire import DEFAULT_SOCKET
from schedswitchd.desktop import gamemode

#: Shells whose completion scripts are generated, with the file name each expects.
SHELLS: dict[str, Callable[[str], str]] = {
    "bash": lambda prog: prog,
    "zsh": lambda prog: f"_{prog}",
}

#: Destinations completed as file names, and as directories (the rest: no completion).
FILE_DESTS = frozenset({"config", "socket", "global_socket", "object", "path", "vmlinux"})
DIR_DESTS = frozenset({"pin", "dir", "sysfs"})


@dataclass(frozen=True)
class Command:
    """One installed command: its name, a one-line description for the man page's NAME
    section, the function building its parser, and its manual section (``man-pages(7)``:
    1 user commands, 8 system administration commands and daemons)."""

    prog: str
    summary: str
    build_parser: Callable[[], argparse.ArgumentParser]
    section: int = 1
    #: The man page's FILES section: (path, what it is), none when empty.
    files: tuple[tuple[str, str], ...] = ()

    @property
    def man_file(self) -> str:
        """The man page's file name, ``NAME.SECTION``."""
        return f"{self.prog}.{self.section}"


COMMANDS: tuple[Command, ...] = (
    Command(
        "schedswitchd",
        "switch sched_ext CPU schedulers on demand",
        service.build_parser,
        8,
        (
            (service.DEFAULT_CONFIG, "the configuration (--config)"),
            (
                str(Path(service.DEFAULT_CONFIG).parent / DROPIN_DIR / "*.toml"),
                "drop-ins beside it, merged over it in name order: tables key by key, a "
                "later value replaces",
            ),
            (DEFAULT_SOCKET, "the socket (systemd's schedswitchd.socket, or --socket)"),
        ),
    ),
    Command("schedswitchctl", "control and inspect schedswitchd; BPF objects", ctl.build_parser),
    Command("schedswitch-run", "run a command under a schedswitchd hint", run.build_parser),
    Command(
        "schedswitch-gamemode",
        "hold a schedswitchd hint for every game GameMode's launchers register",
        gamemode.build_parser,
    ),
)


def _roff(text: str) -> str:
    """``text`` with roff's hyphen escaped (a bare ``-`` may render as a dash)."""
    return text.replace("-", "\\-")


def _see_also(command: Command) -> str:
    """The other commands' pages (never ``command``'s own), then systemd.socket(5)."""
    pages = [rf"\fB{_roff(c.prog)}\fR({c.section})" for c in COMMANDS if c is not command]
    return ", ".join([*pages, r"\fBsystemd.socket\fR(5)"])


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every sub-command of ``parser``, nested ones as ``"object load"``: name -> parser."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:  # argparse has no public walk over sub-parsers
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = sub
                for nested, subsub in subcommands(sub).items():
                    found[f"{name} {nested}"] = subsub
    return found


def _mark_completions(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Tell shtab which arguments are paths (an attribute shtab reads off each action)."""
    for p in (parser, *subcommands(parser).values()):
        for action in p._actions:
            if action.dest in FILE_DESTS:
                action.complete = FILE  # type: ignore[attr-defined]
            elif action.dest in DIR_DESTS:
                action.complete = DIRECTORY  # type: ignore[attr-defined]
    return parser


def man_page(command: Command) -> str:
    """The roff source of ``command``'s man page (in its section)."""
    page = Manpage(command.build_parser())
    page.section = command.section
    page.source = f"schedswitchd {__version__}"
    page.manual = "schedswitchd manual"
    page.description = command.summary
    page.add_section(
        "environment",
        "=",
        r".TP"
        "\n"
        r"\fBSCHEDSWITCHD_SOCKET\fR"
        "\n" + _roff(f"The daemon's socket when no --socket is given (default {DEFAULT_SOCKET})."),
    )
    if command.files:
        page.add_section(
            "files",
            "=",
            "\n".join(rf".TP" "\n" rf"\fI{_roff(p)}\fR" "\n" + _roff(w) for p, w in command.files),
        )
    page.add_section("see also", "=", _see_also(command))
    text: str = str(page)
    return text


def completion(command: Command, shell: str) -> str:
    """``command``'s completion script for ``shell`` (one of :data:`SHELLS`)."""
    parser = _mark_completions(command.build_parser())
    return complete(parser, shell=shell)


def write_man(directory: Path) -> list[Path]:
    """Write every command's man page into ``directory``; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for command in COMMANDS:
        path = directory / command.man_file
        path.write_text(man_page(command))
        written.append(path)
    return written


def write_completions(directory: Path) -> list[Path]:
    """Write every command's completion scripts into ``directory/<shell>/``."""
    written = []
    for shell, file_name in SHELLS.items():
        (directory / shell).mkdir(parents=True, exist_ok=True)
        for command in COMMANDS:
            path = directory / shell / file_name(command.prog)
            path.write_text(completion(command, shell))
            written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--man", type=Path, metavar="DIR", help="write the man pages here")
    parser.add_argument(
        "--completions", type=Path, metavar="DIR", help="write the completions here"
    )
    args = parser.parse_args(argv)
    if args.man is None and args.completions is None:
        parser.error("nothing to do: give --man DIR and/or --completions DIR")
    for path in [
        *(write_man(args.man) if args.man else []),
        *(write_completions(args.completions) if args.completions else []),
    ]:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
