"""Man pages and shell completions generated from the parsers (tools/cli_docs.py), and the
parts of the CLI contract they document: every positional argument has help, and every
command that talks to the daemon says its default socket."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("argparse_manpage", reason="a dev dependency: make deps")
pytest.importorskip("shtab", reason="a dev dependency: make deps")

from schedswitchd.daemon.launcher_wire import DEFAULT_SOCKET
from tools import cli_docs

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli_docs")
    assert cli_docs.main(["--man", str(out / "man"), "--completions", str(out / "comp")]) == 0
    return out


def _leaves(parser: argparse.ArgumentParser) -> list[str]:
    """Sub-command paths that take no further sub-command (``object load``, ``status``)."""
    subs = cli_docs.subcommands(parser)
    return [name for name, sub in subs.items() if not cli_docs.subcommands(sub)]


@pytest.mark.parametrize("command", cli_docs.COMMANDS, ids=lambda c: c.prog)
def test_man_page_names_every_subcommand_and_option(
    generated: Path, command: cli_docs.Command
) -> None:
    text = (generated / "man" / command.man_file).read_text()
    roff = command.prog.replace("-", "\\-")  # roff escapes every hyphen
    assert text.startswith(f'.TH {roff.upper()} "{command.section}"'), text[:80]
    assert f"{roff} \\- {command.summary}" in text  # the NAME line whatis(1) reads
    parser = command.build_parser()
    for path in cli_docs.subcommands(parser):
        assert f"'{command.prog} {path}'" in text, f"{path} missing from {command.man_file}"
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue  # argparse-manpage leaves out -h/--help, as man pages do
        for option in action.option_strings:
            assert option.replace("-", "\\-") in text, option
    assert "SCHEDSWITCHD_SOCKET" in text


@pytest.mark.parametrize("command", cli_docs.COMMANDS, ids=lambda c: c.prog)
def test_see_also_names_the_other_pages_not_itself(
    generated: Path, command: cli_docs.Command
) -> None:
    text = (generated / "man" / command.man_file).read_text()
    see_also = text.split(".SH SEE ALSO", 1)[1].split(".SH ", 1)[0]
    for other in cli_docs.COMMANDS:
        roff = other.prog.replace("-", "\\-")
        named = f"\\fB{roff}\\fR({other.section})" in see_also
        assert named == (other is not command), (other.prog, see_also)


def test_readme_lists_every_man_page() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for command in cli_docs.COMMANDS:
        assert f"`{command.prog}({command.section})`" in readme, command.prog


def test_schedswitchctl_has_its_nested_subcommands(generated: Path) -> None:
    # a walk that stopped at the first level would miss these
    text = (generated / "man" / "schedswitchctl.1").read_text()
    for path in ("object load", "object inspect", "object unload", "profile show"):
        assert f"'schedswitchctl {path}'" in text, path


@pytest.mark.skipif(shutil.which("groff") is None, reason="no groff (Debian package groff-base)")
@pytest.mark.parametrize("command", cli_docs.COMMANDS, ids=lambda c: c.prog)
def test_man_page_renders_without_warnings(generated: Path, command: cli_docs.Command) -> None:
    page = generated / "man" / command.man_file
    r = subprocess.run(
        ["groff", "-man", "-Tutf8", "-ww", "-z", str(page)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr


def _bash_complete(script: Path, words: list[str]) -> list[str]:
    """Run ``script``'s completion function as bash would for ``words`` (the last one being
    completed) and return COMPREPLY."""
    prog = words[0]
    func = "_shtab_" + prog.replace("-", "_")
    line = " ".join(words)
    program = (
        f"source {script}\n"
        f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
        f"COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}\n"
        f"{func} {prog} {words[-1]!r} {words[-2]!r}\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    r = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True)
    return r.stdout.split()


def test_bash_completion_offers_every_subcommand(generated: Path) -> None:
    script = generated / "comp" / "bash" / "schedswitchctl"
    parser = cli_docs.COMMANDS[1].build_parser()
    top = sorted(n for n in cli_docs.subcommands(parser) if " " not in n)
    assert sorted(_bash_complete(script, ["schedswitchctl", ""])) == top
    assert _bash_complete(script, ["schedswitchctl", "object", "lo"]) == ["load"]
    assert "--profile" in _bash_complete(script, ["schedswitchctl", "object", "load", "--pr"])


@pytest.mark.parametrize("command", cli_docs.COMMANDS, ids=lambda c: c.prog)
def test_completion_scripts_parse_and_name_each_subcommand(
    generated: Path, command: cli_docs.Command
) -> None:
    bash = generated / "comp" / "bash" / command.prog
    zsh = generated / "comp" / "zsh" / f"_{command.prog}"
    subprocess.run(["bash", "-n", str(bash)], check=True)
    if shutil.which("zsh"):
        subprocess.run(["zsh", "-n", str(zsh)], check=True)
    assert zsh.read_text().startswith(f"#compdef {command.prog}")
    for leaf in _leaves(command.build_parser()):
        name = leaf.split()[-1]
        assert name in bash.read_text() and name in zsh.read_text(), leaf
    for option in ("--socket", "--help"):
        assert option in bash.read_text(), option


@pytest.mark.parametrize("command", cli_docs.COMMANDS, ids=lambda c: c.prog)
def test_positional_arguments_have_help(command: cli_docs.Command) -> None:
    parser = command.build_parser()
    for name, p in [("", parser), *cli_docs.subcommands(parser).items()]:
        for action in p._actions:
            if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
                assert action.help, f"{command.prog} {name}: {action.dest} has no help"


@pytest.mark.parametrize("command", cli_docs.COMMANDS, ids=lambda c: c.prog)
def test_help_says_the_default_socket(command: cli_docs.Command) -> None:
    parser = command.build_parser()
    assert DEFAULT_SOCKET in parser.format_help(), command.prog
    for name, sub in cli_docs.subcommands(parser).items():
        if any("--socket" in a.option_strings for a in sub._actions):
            assert DEFAULT_SOCKET in sub.format_help(), f"{command.prog} {name}"


def test_the_daemon_is_in_section_8_with_its_files(generated: Path) -> None:
    """schedswitchd(8): a daemon's page is in the system administration section
    (man-pages(7)), names its configuration, the drop-ins and the socket, and the other
    pages refer to it there."""
    assert sorted(p.name for p in (generated / "man").iterdir()) == [
        "schedswitch-gamemode.1",
        "schedswitch-run.1",
        "schedswitchctl.1",
        "schedswitchd.8",
    ]
    daemon = (generated / "man" / "schedswitchd.8").read_text()
    files = daemon.split(".SH FILES\n", 1)[1].split(".SH ", 1)[0]
    for path in ("/etc/schedswitchd/schedswitchd.toml", "/etc/schedswitchd/conf.d/*.toml"):
        assert f"\\fI{path}\\fR" in files
    assert "78 (EX_CONFIG)" in daemon  # the exit statuses, from --help's epilog
    assert "\\fBschedswitchd\\fR(8)" in (generated / "man" / "schedswitchctl.1").read_text()


@pytest.mark.skipif(
    not (REPO / ".venv" / ".stamp").is_file(), reason="needs the dev venv: make deps"
)
def test_make_install_puts_each_page_in_its_section(tmp_path: Path) -> None:
    # -o: never remake the venv or apt stamps (a Makefile newer than them would run apt/pip)
    proc = subprocess.run(
        ["make", "-s", "-o", ".venv/.stamp", "-o", "build/.apt-stamp", "install",
         f"DESTDIR={tmp_path}", "PREFIX=/usr"],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    man = tmp_path / "usr" / "share" / "man"
    assert sorted(p.relative_to(man).as_posix() for p in man.rglob("*.[18]")) == [
        "man1/schedswitch-gamemode.1",
        "man1/schedswitch-run.1",
        "man1/schedswitchctl.1",
        "man8/schedswitchd.8",
    ]


def test_make_install_desktop_lays_the_system_files_where_their_readers_look(
    tmp_path: Path,
) -> None:
    # The paths dbus-daemon (system.d, system-services), polkitd (actions) and systemd's
    # user manager read, whatever PREFIX is; each file the repository's, byte for byte.
    proc = subprocess.run(
        ["make", "-s", "install-desktop", f"DESTDIR={tmp_path}", "PREFIX=/usr/local"],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    expected = {
        "usr/share/dbus-1/system.d/org.scx.Loader.conf": "dbus/org.scx.Loader.conf",
        "usr/share/dbus-1/system-services/org.scx.Loader.service": "dbus/org.scx.Loader.service",
        "usr/share/polkit-1/actions/org.scx.Loader.policy": "polkit/org.scx.Loader.policy",
        "usr/lib/systemd/user/schedswitch-gamemode.service": (
            "systemd/user/schedswitch-gamemode.service"
        ),
    }
    laid = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert laid == set(expected)  # GameMode's activation file stays out: it shadows gamemoded's
    for dest, src in expected.items():
        assert (tmp_path / dest).read_bytes() == (REPO / src).read_bytes()
