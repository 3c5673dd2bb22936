"""bench/daemon_rss.py's configuration and report, from synthetic readings (the measurement
itself runs in the sched_ext VM: ``python bench/daemon_rss.py``)."""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


@pytest.fixture(scope="module")
def dr(bench_script: Callable[[str], ModuleType]) -> ModuleType:
    return bench_script("daemon_rss")


def _rss(total: float, anon: float) -> dict[str, float]:
    return {"rss_mib": total, "anon_mib": anon, "file_mib": total - anon}


def test_config_is_one_the_daemon_takes(dr: ModuleType, tmp_path: Path) -> None:
    from schedswitchd.daemon.config import load_config

    text = dr.config_text(str(tmp_path / "s"), 1, {"vtime": "/x/vtime.bpf.o"})
    path = tmp_path / "c.toml"
    path.write_text(text)
    config = load_config(path)
    assert config.standby.max == 1 and config.standby.recent is False
    assert set(config.schedulers) == {"fifo", "latency", "vtime"}
    assert config.hints["p-vtime"].scheduler == "vtime"
    assert config.hints["bench"].scheduler == "latency"
    assert tomllib.loads(dr.config_text("s", 0, {}))["standby"]["max"] == 0


def test_report_rows_deltas_and_errors(dr: ModuleType) -> None:
    raw: dict[str, Any] = {
        "objects": {"vtime": "/r/build/bpf/vtime.bpf.o", "lavd": "/c/lavd.bpf.o"},
        "runs": {
            "base": {"configured": 2, "preopens": 2, "rss": _rss(47.0, 32.0)},
            "preopen": {"configured": 4, "preopens": 4, "rss": _rss(50.5, 35.0)},
            "standby": {
                "configured": 4, "preopens": 4, "rss": _rss(51.0, 35.5),
                "default_standby": {"scheduler": "fifo", "reason": "default",
                                    "kernel_bytes": 204800},
                "per_scheduler": {
                    "latency": {"kernel_bytes": 409600, "status_kernel_bytes": 409600,
                                "prepare_ms": 120.4, "rss": _rss(51.2, 35.6)},
                    "vtime": {"kernel_bytes": 307200, "status_kernel_bytes": 300000,
                              "prepare_ms": 110.0, "rss": _rss(52.5, 36.0)},
                    "lavd": {"error": "verifier: program too large"},
                },
            },
        },
    }  # fmt: skip
    meta = {"date": "d", "machine": "m", "load": "1.0"}
    text = dr.report(raw, meta)
    assert "| base | 2 | 2 | - | 47.0 (32.0 / 15.0) |" in text
    assert "| standby | 4 | 4 | fifo (default, 200 KiB kernel) | 51.0 (35.5 / 15.5) |" in text
    assert (
        "| latency | `build/bpf/latency.bpf.o` | 409600 | 400 | 120 | 51.2 (35.6 / 15.6) |" in text
    )
    assert "| vtime | `build/bpf/vtime.bpf.o` | 307200 (status 300000) |" in text
    assert (
        "| lavd | `../shared/corpus/lavd.bpf.o` | not prepared: verifier: program too large" in text
    )
    assert "adds +3.5 MiB over `base`; holding the default as a standby +0.5 MiB" in text
    assert "largest reading with one standby held is 52.5 MiB" in text
    assert "- MISSED: `base` VmRSS 47.0 MiB (target <= 46.3 MiB)" in text
    assert not dr.base_rss_met(raw)
    raw["runs"]["base"]["rss"] = _rss(46.3, 31.0)
    assert dr.base_rss_met(raw) and "- met: `base` VmRSS 46.3 MiB" in dr.report(raw, meta)


def test_from_json_makes_its_out_dir(dr: ModuleType, tmp_path: Path) -> None:
    saved = Path(__file__).resolve().parents[2] / "bench" / "results" / "daemon_rss_vm.json"
    out = tmp_path / "new" / "dir"
    assert dr.main(["--from-json", str(saved), "--out", str(out)]) == 0
    assert "| base |" in (out / "daemon_rss_vm.md").read_text()


def test_paths_are_shown_relative_to_the_checkout(dr: ModuleType) -> None:
    vb = sys.modules["vm_bench"]
    assert vb.repo_relative(vb.SCHED_DIR / "vtime.bpf.o") == "build/bpf/vtime.bpf.o"
    assert vb.repo_relative(vb.CORPUS / "lavd.bpf.o") == "../shared/corpus/lavd.bpf.o"
    assert vb.repo_relative("/elsewhere/x.bpf.o") == "x.bpf.o"


class _Result:
    """The parts of tools.vm's run result that vm_bench reads."""

    def __init__(self, returncode: int, files: dict[str, bytes]) -> None:
        self.returncode, self.files = returncode, files

    def tail(self, n: int) -> str:
        return f"console tail {n}"

    def text(self, name: str) -> str:
        return self.files[name].decode()


def test_a_vm_run_fails_without_its_results_and_shows_its_logs(
    dr: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    vb = sys.modules["vm_bench"]
    assert not vb.vm_run_failed(_Result(0, {"r.json": b"{}"}), "r.json", ["d.log"])
    assert capsys.readouterr().err == ""
    assert vb.vm_run_failed(_Result(0, {"d.log": b"x" * 10 + b"the end"}), "r.json", ["d.log"], 7)
    err = capsys.readouterr().err
    assert "VM run failed\nconsole tail 60" in err and err.endswith("the end\n")
    assert "x" not in err.split("\n", 2)[2]
    assert vb.vm_run_failed(_Result(1, {"r.json": b"{}"}), "r.json")


def test_a_saved_run_renders_again_from_its_json(dr: ModuleType, tmp_path: Path) -> None:
    vb = sys.modules["vm_bench"]
    saved = {"meta": {"date": "d"}, "raw": [1, 2]}
    vb.save_run(tmp_path / "a", "r.json", saved, "page one\n", "r.md")
    assert (tmp_path / "a" / "r.md").read_text() == "page one\n"

    def render(s: dict[str, Any]) -> str:
        return f"{s['meta']['date']} {sum(s['raw'])}\n"

    out = tmp_path / "b" / "c"
    assert vb.redo_page(str(tmp_path / "a" / "r.json"), out, "r.md", render) == 0
    assert (out / "r.md").read_text() == "d 3\n"
