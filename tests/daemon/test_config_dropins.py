"""Drop-ins (``conf.d/*.toml`` beside the configuration file): merged in name order over the
main file, tables key by key, a later value replacing an earlier one; every problem names
the file that set its key (schedswitchd/daemon/config_dropins.py)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from schedswitchd.daemon.config import load_config
from schedswitchd.daemon.config_dropins import DROPIN_DIR, Layers, dropin_files
from schedswitchd.errors import ConfigError
from tests.daemon.harness import run_as

MAIN = """
default = "fifo"
[schedulers.fifo]
object = "fifo.bpf.o"
description = "main"
[schedulers.vtime]
object = "vtime.bpf.o"
[hints.gaming]
scheduler = "fifo"
priority = 5
[auth]
hint_uids = [0, 1000]
"""


def _setup(tmp_path: Path, dropins: dict[str, str]) -> Path:
    main = tmp_path / "schedswitchd.toml"
    main.write_text(MAIN)
    if dropins:
        (tmp_path / DROPIN_DIR).mkdir()
    for name, text in dropins.items():
        (tmp_path / DROPIN_DIR / name).write_text(text)
    return main


def _error(path: Path) -> str:
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    return str(exc.value)


def test_without_conf_d_the_main_file_alone(tmp_path: Path) -> None:
    config = load_config(_setup(tmp_path, {}))
    assert config.schedulers["fifo"].description == "main"
    assert config.auth.hint_uids == [0, 1000]
    assert dropin_files(tmp_path / "schedswitchd.toml") == []


def test_name_order_tables_key_by_key_later_values_replace(tmp_path: Path) -> None:
    main = _setup(
        tmp_path,
        {
            # applied second although written first: byte order of the names
            "20-late.toml": '[schedulers.fifo]\ndescription = "late"\n[hints.gaming]\n'
            "priority = 9\n",
            "10-early.toml": '[schedulers.fifo]\ndescription = "early"\n'
            "[schedulers.extra]\nobject = 'x.bpf.o'\n[auth]\nhint_uids = [42]\n",
            ".05-hidden.toml": "this is not TOML and is never read\n",
            "README": "not a drop-in\n",
        },
    )
    assert [p.name for p in dropin_files(main)] == ["10-early.toml", "20-late.toml"]
    config = load_config(main)
    fifo = config.schedulers["fifo"]
    assert fifo.description == "late"  # a later value replaces
    assert fifo.object == str(tmp_path / "fifo.bpf.o")  # the main file's other keys stay
    assert set(config.schedulers) == {"fifo", "vtime", "extra"}  # tables merge key by key
    assert config.hints["gaming"].scheduler == "fifo" and config.hints["gaming"].priority == 9
    assert config.auth.hint_uids == [42]  # an array replaces the earlier one whole
    assert config.source == str(main)


def test_relative_object_resolves_beside_the_file_naming_it(tmp_path: Path) -> None:
    main = _setup(tmp_path, {"50-obj.toml": '[schedulers.vtime]\nobject = "other.bpf.o"\n'})
    config = load_config(main)
    assert config.schedulers["vtime"].object == str(tmp_path / DROPIN_DIR / "other.bpf.o")
    assert config.schedulers["fifo"].object == str(tmp_path / "fifo.bpf.o")


def test_errors_name_the_drop_in_and_the_key(tmp_path: Path) -> None:
    main = _setup(
        tmp_path,
        {
            "10-a.toml": "[limits]\nmax_conections = 5\n",
            "20-b.toml": "[hints.gaming]\npriority = 5000\n",
        },
    )
    lines = _error(main).splitlines()
    dropins = tmp_path / DROPIN_DIR
    assert f"{dropins / '10-a.toml'}: limits.max_conections: unknown key" in lines
    assert any(
        line.startswith(f"{dropins / '20-b.toml'}: hints.gaming.priority: ") for line in lines
    )
    assert len(lines) == 2


def test_a_key_of_the_main_file_is_still_named_there(tmp_path: Path) -> None:
    main = _setup(tmp_path, {"10-a.toml": '[schedulers.fifo]\ndescription = "x"\n'})
    main.write_text(MAIN.replace("priority = 5", 'priority = "high"'))
    assert _error(main).startswith(f"{main}: hints.gaming.priority: ")


def test_a_check_across_keys_names_the_main_file_and_the_drop_ins(tmp_path: Path) -> None:
    main = _setup(tmp_path, {"10-a.toml": 'default = "nowhere"\n'})
    dropin = tmp_path / DROPIN_DIR / "10-a.toml"
    assert f"{main} (with {dropin}): default 'nowhere' is neither" in _error(main)


def test_a_drop_in_that_is_not_toml_is_named(tmp_path: Path) -> None:
    main = _setup(tmp_path, {"10-a.toml": "[limits\n"})
    assert _error(main).startswith(f"{tmp_path / DROPIN_DIR / '10-a.toml'}: (syntax): ")
    (tmp_path / DROPIN_DIR / "10-a.toml").write_bytes(b"x = '\xff'\n")
    assert _error(main).startswith(f"{tmp_path / DROPIN_DIR / '10-a.toml'}: not UTF-8")


def test_a_drop_in_that_is_not_a_regular_file_is_refused_unread(tmp_path: Path) -> None:
    main = _setup(tmp_path, {})
    (tmp_path / DROPIN_DIR).mkdir()
    fifo = tmp_path / DROPIN_DIR / "10-pipe.toml"
    os.mkfifo(fifo)  # opening it to read would block the daemon's start
    assert _error(main) == f"{fifo}: not a regular file (a drop-in is a TOML file)"
    fifo.unlink()
    (tmp_path / DROPIN_DIR / "10-dir.toml").mkdir()
    assert "10-dir.toml: not a regular file" in _error(main)


def test_an_unreadable_conf_d_is_an_error() -> None:
    # Root reads any directory, so under root the load runs as an unprivileged uid, in a
    # directory that uid may traverse (pytest's own are 0700).
    with tempfile.TemporaryDirectory() as top:
        base = Path(top)
        base.chmod(0o755)
        main = _setup(base, {"10-a.toml": ""})
        (base / DROPIN_DIR).chmod(0)
        error = run_as(65534, lambda: _error(main)) if os.geteuid() == 0 else _error(main)
        (base / DROPIN_DIR).chmod(0o755)
        assert error.startswith(f"{base / DROPIN_DIR}: cannot list: "), error


def test_layers_origin_follows_replacement() -> None:
    layers = Layers("/m.toml")
    layers.merge({"a": {"b": 1, "c": {"d": 2}}, "e": 3}, "/m.toml")
    layers.merge({"a": {"c": 5}}, "/x.toml")  # a table replaced by a value
    layers.merge({"a": {"c": {"f": 6}}}, "/y.toml")  # and that value by a table
    assert layers.raw == {"a": {"b": 1, "c": {"f": 6}}, "e": 3}
    assert layers.origin(("a", "b")) == "/m.toml"
    assert layers.origin(("a", "c", "d")) == "/y.toml"  # the table that holds it now
    assert layers.origin(("a", "c", "f")) == "/y.toml"
    assert layers.origin(("e",)) == layers.origin(()) == "/m.toml"
    assert layers.dropins == ["/x.toml", "/y.toml"]
