"""``[dbus]`` in the configuration: scx names, the mode variants an ``org.scx.Loader`` call
may name, and references checked at load."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedswitchd.daemon.config import SCX_MODES, parse_config
from schedswitchd.errors import ConfigError

BASE = """
default = "kernel"
[schedulers.bpfland]
object = "bpfland.bpf.o"
profile = "bpfland"
[schedulers.simple]
object = "simple.bpf.o"
profile = "scx_simple"
[schedulers.fifo]
object = "fifo.bpf.o"
[hints.battery]
scheduler = "fifo"
"""


def test_no_dbus_table_means_no_faces_and_no_variants(tmp_path: Path) -> None:
    config = parse_config(BASE, str(tmp_path / "c.toml"))
    assert config.dbus is None
    assert sorted(config.schedulers) == ["bpfland", "fifo", "simple"]


def test_scx_names_default_to_the_profiles_and_get_every_scx_mode(tmp_path: Path) -> None:
    config = parse_config(BASE + "[dbus]\n", str(tmp_path / "c.toml"))
    assert config.dbus is not None and config.dbus.scx_loader
    # A profile named scx_... keeps its name; a scheduler without a profile is not offered.
    assert config.dbus.scx_names == {"scx_bpfland": "bpfland", "scx_simple": "simple"}
    modes = [m for m in SCX_MODES.values() if m is not None]
    for mode in modes:
        variant = config.schedulers[f"bpfland@{mode}"]
        assert variant.mode == mode and variant.object == config.schedulers["bpfland"].object
    # scx_simple's profile has none of scx_loader's modes.
    assert not [n for n in config.schedulers if n.startswith("simple@")]


def test_explicit_scx_names_replace_the_default(tmp_path: Path) -> None:
    text = BASE + '[dbus]\n[dbus.scx_names]\nscx_rusty = "fifo"\n'
    config = parse_config(text, str(tmp_path / "c.toml"))
    assert config.dbus is not None and config.dbus.scx_names == {"scx_rusty": "fifo"}
    assert not [n for n in config.schedulers if "@" in n]  # bpfland is not offered


def test_scx_loader_off_adds_nothing(tmp_path: Path) -> None:
    config = parse_config(BASE + "[dbus]\nscx_loader = false\n", str(tmp_path / "c.toml"))
    assert config.dbus is not None and not config.dbus.scx_names
    assert not [n for n in config.schedulers if "@" in n]


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ('[dbus]\n[dbus.scx_names]\nscx_x = "nope"\n', "dbus.scx_names.scx_x: 'nope' is not"),
        ('[dbus]\n[dbus.scx_names]\nrusty = "fifo"\n', "dbus.scx_names.rusty.\\[key\\]"),
        ('[dbus]\n[dbus.power_profiles]\npower-saver = "gaming"\n', "no hint rule 'gaming'"),
        (
            '[dbus]\n[dbus.power_profiles]\npowersaver = "battery"\n',
            "dbus.power_profiles: 'powersaver' is not a power profile "
            "\\(power-profiles-daemon has power-saver, balanced, performance\\)",
        ),
        ("[dbus]\nscx_loader = 1\n", "dbus.scx_loader: Input should be a valid boolean"),
        ("[dbus]\nsession = true\n", "dbus.session: unknown key"),
    ],
)
def test_dbus_config_errors(tmp_path: Path, extra: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_config(BASE + extra, str(tmp_path / "c.toml"))


def test_power_profiles_name_hints(tmp_path: Path) -> None:
    text = BASE + '[dbus]\n[dbus.power_profiles]\npower-saver = "battery"\n'
    config = parse_config(text, str(tmp_path / "c.toml"))
    assert config.dbus is not None and config.dbus.power_profiles == {"power-saver": "battery"}


def test_each_shipped_modes_argv_is_what_its_summary_documents() -> None:
    """``[modes.X] argv`` (what ``...WithArgs`` calls are matched against) is the flags
    the mode's summary names, ``= scx_NAME FLAGS (...)``, in every shipped profile."""
    from schedswitchd.profile.model import load_profile

    root = Path(__file__).resolve().parents[2] / "config" / "profiles"
    seen = 0
    for path in sorted(root.glob("*.toml")):
        for name, mode in load_profile(path).modes.items():
            if not mode.summary.startswith("= "):
                assert mode.argv is None, (path.name, name)
                continue
            text = mode.summary[2:]
            cut = min([len(text), *(i for sep in (" (", ": ") if (i := text.find(sep)) >= 0)])
            assert mode.argv == text[:cut].split()[1:], (path.name, name)
            seen += 1
    assert seen >= 20


def test_resolve_names_modes_and_args(tmp_path: Path) -> None:
    from schedswitchd.desktop.scx_loader import Refused, resolve, resolve_args

    config = parse_config(BASE + "[dbus]\n", str(tmp_path / "c.toml"))
    assert resolve(config, "scx_bpfland", 0) == "bpfland"
    assert resolve(config, "scx_bpfland", 2) == "bpfland@powersave"
    assert resolve_args(config, "scx_bpfland", ["-s", "20000", "-S"]) == "bpfland@server"
    assert resolve_args(config, "scx_bpfland", []) == "bpfland"
    with pytest.raises(Refused, match="not offered here"):
        resolve(config, "scx_nope", 0)
    with pytest.raises(Refused, match="scx_simple has no gaming mode"):
        resolve(config, "scx_simple", 1)
    with pytest.raises(Refused, match="mode 5 is not one of scx_loader's"):
        resolve(config, "scx_bpfland", 5)
    with pytest.raises(Refused, match="not the flags of any"):
        resolve_args(config, "scx_bpfland", ["-S"])


def test_check_config_warns_when_scx_loader_offers_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``scx_loader = true`` with no scheduler having a profile and no ``[dbus.scx_names]``:
    valid, but ``SupportedSchedulers`` would be empty, so ``--check-config`` says so and
    what to add; with a name offered it says nothing."""
    from schedswitchd.daemon import service

    bare = '[schedulers.fifo]\nobject = "fifo.bpf.o"\n[dbus]\n'
    conf = tmp_path / "c.toml"
    for text, warned in ((bare, True), (bare + '[dbus.scx_names]\nscx_fifo = "fifo"\n', False)):
        conf.write_text(text)
        service.main(["--check-config", "--config", str(conf)])
        out = capsys.readouterr().out
        warning = [line for line in out.splitlines() if line.startswith("WARNING: ")]
        if warned:
            [line] = warning
            assert "org.scx.Loader" in line and "offers no scheduler" in line, out
            assert "[dbus.scx_names]" in line and "profile" in line, out
        else:
            assert not warning, out
    conf.write_text("[dbus]\nscx_loader = false\n")
    service.main(["--check-config", "--config", str(conf)])
    assert "WARNING" not in capsys.readouterr().out


def test_an_executable_scheduler_takes_any_args_and_its_modes(tmp_path: Path) -> None:
    from schedswitchd.desktop.scx_loader import WithArgs, resolve, resolve_args

    exe = tmp_path / "scx_rusty"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    text = BASE + (
        '[schedulers.rusty]\nexecutable = "scx_rusty"\n'
        '[schedulers.rusty.modes.gaming]\nargs = ["-g"]\n[dbus]\n'
    )
    config = parse_config(text, str(tmp_path / "c.toml"))
    assert config.dbus is not None and config.dbus.scx_names["scx_rusty"] == "rusty"
    assert resolve(config, "scx_rusty", 1) == "rusty@gaming"  # its own modes' args
    assert config.schedulers["rusty@gaming"].runs_executable
    assert resolve_args(config, "scx_rusty", ["-k", "-c", "0"]) == WithArgs(
        "rusty", ["-k", "-c", "0"]
    )
    assert resolve_args(config, "scx_rusty", []) == "rusty"
