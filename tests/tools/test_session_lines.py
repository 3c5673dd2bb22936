"""What ``make demo`` prints for a switch (tools/session.py): a hint's reply carries the
switch record live (sent once the kernel runs the new scheduler, before the pin), so it has
no total yet; the demo printed that as "ok in 0.0 ms" next to a 273 ms gap."""

from __future__ import annotations

from schedswitchd.daemon import protocol as proto
from tools.session import _switch_line


def _info(phases_ns: dict[str, int], finished: bool) -> proto.SwitchInfo:
    return proto.SwitchInfo(
        seq=2,
        time=0.0,
        previous="vtime",
        target="gaming",
        result="ok",
        reason="lease 2-ab gaming",
        phases_ns=phases_ns,
        gap_ns=273_100_000,
        finished=finished,
    )


def test_a_live_record_says_when_the_kernel_ran_it_not_zero() -> None:
    live = _info({"prepare": 3_186_100_000, "until_enabled": 3_550_200_000}, finished=False)
    line = _switch_line(live)
    assert line.startswith("vtime -> gaming: ok, enabled after 3550.2 ms, pin still to come")
    assert "0.0 ms" not in line and "gap 273.1 ms" in line


def test_a_finished_record_gives_its_total() -> None:
    done = _info({"prepare": 3_186_100_000, "pin": 36_300_000, "total": 3_613_700_000}, True)
    assert _switch_line(done).startswith("vtime -> gaming: ok in 3613.7 ms (gap 273.1 ms;")
