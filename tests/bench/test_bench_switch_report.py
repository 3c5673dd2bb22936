"""bench/switch_latency.py's report: table rows, ratios against (a) and target checks, from
synthetic samples (the measurement itself runs in the VM: `make bench`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


@pytest.fixture(scope="module")
def sl(bench_script: Callable[[str], ModuleType]) -> ModuleType:
    return bench_script("switch_latency")


def _sample(total_ms: float, gap_ms: float, rss_mib: float = 40.0) -> dict[str, Any]:
    return {"total_ns": int(total_ms * 1e6), "gap_ns": int(gap_ms * 1e6),
            "syscall_ns": int(total_ms * 1e5), "modules_read": 1, "startup_ns": 0,
            "rss_kib": int(rss_mib * 1024)}  # fmt: skip


def _raw(a: list[float], d: list[float], gap: float, rss: float) -> dict[str, Any]:
    steps = []
    for n, a_ms, d_ms in zip((5, 10, 100, 300), a, d, strict=True):
        steps.append({"target": n, "modules": n, "samples": {
            "a": [_sample(a_ms, a_ms)] * 3,
            "b": [_sample(20000, 20000)] * 3,
            "c": [_sample(d_ms * 2, gap, rss)] * 3,
            "d": [_sample(d_ms, gap, rss)] * 3,
        }})  # fmt: skip
    return {"steps": steps}


META = {"date": "d", "machine": "m", "load": "1", "reps": "3", "accel": "tcg",
        "cold_reps": "3", "cold_startup_share": "60%"}  # fmt: skip


def test_table_ratios_and_met_targets(sl: ModuleType) -> None:
    raw = _raw([400, 400, 450, 600], [200, 200, 200, 202], gap=30, rss=40)
    table, summary, status = sl.build_report(raw, META)
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 5  # header + 4 module counts
    assert rows[-1].startswith("| 300 | 600 ")
    assert "| 0.34 |" in rows[-1]  # (d)/(a) at 300: 202/600
    assert status == 0
    assert all(c["met"] for c in summary["checks"])


def test_missed_targets_say_by_how_much(sl: ModuleType) -> None:
    raw = _raw([400, 400, 450, 600], [200, 220, 260, 400], gap=150, rss=61)
    table, summary, status = sl.build_report(raw, META)
    assert status == 2
    missed = [c["what"] for c in summary["checks"] if not c["met"]]
    assert any("(d) flat" in w and "+100.0%" in w for w in missed)
    assert any("(d) at 300 = 0.67 x (a)" in w for w in missed)
    assert any("RSS max 61.0 MiB" in w for w in missed)
    assert "MISSED" in table


def test_plot_writes_a_png(sl: ModuleType, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    _, summary, _ = sl.build_report(_raw([400] * 4, [200] * 4, gap=30, rss=40), META)
    sl.plot(summary, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_module_count_note_says_how_the_vm_ran(sl: ModuleType) -> None:
    raw = _raw([400] * 4, [200] * 4, gap=30, rss=40)
    old, _, _ = sl.build_report(raw, META)  # a run before ramroot (e.g. --from-json)
    assert "including the VM's four 9p modules" in old
    new, _, _ = sl.build_report(raw, {**META, "ramroot": "120 MiB tmpfs root, unpacked in 8 s"})
    assert "9p modules." not in new
    assert "no 9p module loaded (120 MiB tmpfs root, unpacked in 8 s)" in new
    assert "smallest step is `uinput` alone" in new


def test_rss_parts_of_the_largest_sample(sl: ModuleType) -> None:
    raw = _raw([400] * 4, [200] * 4, gap=30, rss=40)
    old, summary, _ = sl.build_report(raw, META)  # samples without RssAnon/RssFile
    assert summary["steps"][0]["warm_rss_parts_mib"]["anon"] is None
    assert old.splitlines()[2].endswith("| 40.0 |")
    big = {**_sample(200, 30, 47.5), "rss_anon_kib": 38 * 1024, "rss_file_kib": 6 * 1024,
           "rss_shmem_kib": 3.5 * 1024}  # fmt: skip
    for step in raw["steps"]:
        step["samples"]["d"] = [{**_sample(200, 30, 40), "rss_anon_kib": 1, "rss_file_kib": 1,
                                 "rss_shmem_kib": 0}, big]  # fmt: skip
        step["samples"]["c"] = [big]
    table, summary, status = sl.build_report(raw, META)
    assert "| warm RSS MiB (anon / file) |" in table
    assert table.splitlines()[2].endswith("| 47.5 (38.0 / 9.5) |")
    assert summary["steps"][0]["warm_rss_parts_mib"] == {"anon": 38.0, "file": 6.0, "shmem": 3.5}
    assert status == 0


def test_gap_composition_from_the_daemon_phases(sl: ModuleType) -> None:
    raw = _raw([400] * 4, [200] * 4, gap=120, rss=40)
    assert sl.gap_composition(raw) == []  # samples from before the phases were recorded
    for step in raw["steps"]:
        for k in "cd":
            step["samples"][k] = [
                {**s, "gap_disable_ns": 60_000_000, "gap_enable_ns": 45_000_000}
                for s in step["samples"][k]
            ]
    table, _, _ = sl.build_report(raw, META)
    assert "| 300 | 120 / 120 | 60 / 60 | 45 / 45 | 15 / 15 |" in table
    assert "kernel disable" in table


def _standby(total_ms: float, gap_ms: float) -> dict[str, Any]:
    """An (e) sample: 2 ms take, detach 20, attach 30 (link 25), enabled 55 ms into the
    switch, pinned (3) and the rest (4) after the reply."""
    ms = {"standby": 2, "detach": 20, "attach": 30, "until_enabled": 55, "pin": 3}
    daemon = 55 + 3 + 4
    return {**_sample(total_ms, gap_ms), "daemon_total_ns": int(daemon * 1e6),
            "phases_ns": {k: int(v * 1e6) for k, v in ms.items()},
            "gap_enable_ns": 25_000_000, "gap_disable_ns": 20_000_000}  # fmt: skip


def test_standby_column_checks_and_composition(sl: ModuleType) -> None:
    raw = _raw([400, 400, 450, 600], [200, 200, 200, 202], gap=30, rss=40)
    assert sl.standby_composition(raw) == []  # runs before (e)
    for step in raw["steps"]:
        step["samples"]["e"] = [_standby(80, 46)] * 3
    table, summary, status = sl.build_report(raw, META)
    assert "| (e) standby hit ms | e/a | gap e ms | e / gap e |" in table.splitlines()[0]
    assert table.splitlines()[5].endswith("| 80 ±0% | 0.13 | 46 | 1.74 |")
    checks = {c["what"]: c["met"] for c in summary["checks"]}
    assert not any("bare lane" in what for what in checks)  # no lane in this run
    assert checks["(e) at 300 = 0.13 x (a) (target <= 0.10)"] is False
    assert status == 2
    # hint to reply 80; take 2; gap 46; detach 20; attach 30; until enabled 55; outside
    # the switch 80 - 55 = 25; after the reply 62 - 55 = 7
    assert "| 300 | 80 | 2.0 | 46 | 20 | 30 | 55 | 25 | 7 |" in table
    # a run from before the early reply: the whole record was before the reply
    for step in raw["steps"]:
        for x in step["samples"]["e"]:
            x["phases_ns"] = {k: v for k, v in x["phases_ns"].items() if k != "until_enabled"}
    assert "| 300 | 80 | 2.0 | 46 | 20 | 30 | 62 | 18 | 0 |" in sl.build_report(raw, META)[0]


def test_outside_split_at_the_switchs_start(sl: ModuleType) -> None:
    raw = _raw([400, 400, 450, 600], [200, 200, 200, 202], gap=30, rss=40)
    for step in raw["steps"]:
        step["samples"]["e"] = [_standby(80, 46)] * 3
    assert sl.outside_split(raw) == []  # runs that did not record it
    for step in raw["steps"]:
        # the record 17 ms after the send, 2 of them the take: 15 ms in; outside 25: 10 out
        step["samples"]["e"] = [
            {**_standby(80, 46), "before_switch_ns": 17_000_000, "first_read_at_accept": k}
            for k in (1, 1, 0)
        ]
    table = sl.build_report(raw, META)[0]
    assert "| 300 | 15.0 | 10.0 | 2 of 3 |" in table


def test_the_socket_floor_beside_what_e_costs_over_its_gap(sl: ModuleType) -> None:
    raw = _raw([400, 400, 450, 600], [200, 200, 200, 202], gap=30, rss=40)
    for step in raw["steps"]:
        step["samples"]["e"] = [_standby(t, 46) for t in (52, 53, 60)]
    assert sl.floor_lines(raw) == []  # runs without the floor
    raw["floor_ns"] = [1_500_000, 1_700_000, 1_600_000]
    table = sl.build_report(raw, META)[0]
    assert "21 exchanges" not in table and "3 exchanges: median 1.60 ms (min 1.50)." in table
    # over the gap: 6, 7, 14 -> 7
    assert "- 300 modules: (e) over its gap 7.0 ms (median per hint), the floor 1.6 of it." in table


def test_the_bare_lane_beside_what_e_costs_over_its_gap(sl: ModuleType) -> None:
    raw = _raw([400, 400, 450, 600], [200, 200, 200, 202], gap=30, rss=40)
    for step in raw["steps"]:
        step["samples"]["e"] = [_standby(t, 46) for t in (52, 53, 60)]
    raw["floor_ns"] = [1_500_000, 1_700_000, 1_600_000]
    assert sl.hit_floor_lines(raw) == []  # runs without the lane
    parts = dict.fromkeys(sl.HIT_FLOOR_PARTS, 1_000_000)
    raw["hit_floor"] = [
        {**parts, "total_ns": int(total * 1e6), "gap_ns": int(gap * 1e6)}
        for total, gap in ((50, 44), (51, 44), (60, 50))
    ]
    table = sl.build_report(raw, META)[0]
    # per hit: 50/44 = 1.136, 51/44 = 1.159, 60/50 = 1.2 -> 1.16; over: 6, 7, 10 -> 7
    assert "3 hits: median 51.0 ms, gap 44.0 ms (quartiles 44.0-50.0), **1.16x its gap**" in table
    assert "7.0 ms over it. Its parts, median ms: send to its read 1.0," in table
    assert "at the accept's read" not in table  # runs before the lane recorded it
    for x, at_accept in zip(raw["hit_floor"], (1, 0, 1), strict=True):
        x["at_accept"] = at_accept
    assert (
        "Its line was there at the accept's read for 2 of 3 hits (the others waited for a "
        "second wake-up)." in sl.build_report(raw, META)[0]
    )
    # (e) at 300: 52/46, 53/46, 60/46 -> 1.15; over 6, 7, 14 -> 7.0: 0.0 ms more than the lane
    assert (
        "- (e) at 300 modules, the same statistics: 1.15x its gap (median per hit; gap 46.0 "
        "ms), 7.0 ms over it: the daemon adds 0.0 ms to the bare lane (target <= 1 ms)." in table
    )
    checks = {c["what"]: c["met"] for c in sl.build_report(raw, META)[1]["checks"]}
    assert checks["(e) at 300 adds 0.0 ms to the bare lane beyond the gaps (target <= 1 ms)"]
    for x in raw["steps"][-1]["samples"]["e"]:
        x["total_ns"] += 1_100_000  # 1.1 ms more of the daemon's own time per hit
    checks = {c["what"]: c["met"] for c in sl.build_report(raw, META)[1]["checks"]}
    assert (
        checks["(e) at 300 adds 1.1 ms to the bare lane beyond the gaps (target <= 1 ms)"] is False
    )


def test_the_lane_among_es_samples_is_the_reference(sl: ModuleType) -> None:
    raw = _raw([400, 400, 450, 600], [200, 200, 200, 202], gap=30, rss=40)
    for step in raw["steps"]:
        step["samples"]["e"] = [_standby(t, 46) for t in (52, 53, 60)]
    parts = dict.fromkeys(sl.HIT_FLOOR_PARTS, 1_000_000)

    def lane(overs: tuple[float, ...]) -> list[dict[str, int]]:
        return [{**parts, "total_ns": int((44 + o) * 1e6), "gap_ns": 44_000_000} for o in overs]

    # An older run's lane, measured after the steps, and one of each step's rotation: the
    # largest step's own lane is the reference (over 6.5 against (e)'s 7: 0.5 ms).
    raw["hit_floor"] = lane((1, 1, 1))
    raw["steps"][0]["lane"] = lane((2, 2, 2))
    raw["steps"][-1]["lane"] = lane((6, 6.5, 9))
    assert sl.lane_samples(raw) == (raw["steps"][-1]["lane"], True)
    assert sl.lane_excess_ms(raw) == pytest.approx(0.5)
    table = sl.build_report(raw, META)[0]
    assert "Reference, same boot, among (e)'s samples (column (f) of each repetition" in table
    assert "the daemon adds 0.5 ms to the bare lane" in table
    del raw["steps"][-1]["lane"]
    assert sl.lane_samples(raw) == (raw["hit_floor"], False)
    assert "Reference, same boot, after the steps: the bare lane" in sl.build_report(raw, META)[0]


def test_the_page_says_when_the_hints_were_sent(sl: ModuleType) -> None:
    raw = _raw([400, 400, 450, 600], [200, 200, 200, 202], gap=30, rss=40)
    assert sl.IDLE_NOTE not in sl.build_report(raw, META)[0]  # a run from before
    table = sl.build_report(raw, {**META, "hint_when": "idle"})[0]
    assert sl.IDLE_NOTE in table and "`idle`" in sl.IDLE_NOTE


def test_the_page_says_which_client_timed_the_hints(sl: ModuleType) -> None:
    raw = _raw([400, 400, 450, 600], [200, 200, 200, 202], gap=30, rss=40)
    assert sl.HINT_CLIENT_NOTE not in sl.build_report(raw, META)[0]  # a run from before
    table = sl.build_report(raw, {**META, "hint_client": "launcher_wire"})[0]
    assert sl.HINT_CLIENT_NOTE in table and "launcher_wire" in sl.HINT_CLIENT_NOTE


def test_wait_idle_returns_once_the_refill_is_done(sl: ModuleType) -> None:
    """Daemon.wait_idle against the live server (fake backend): while the round after a
    lease's end refills the pool (held in its prepare), it waits, though a pass is over;
    it returns that idle status once the refill holds the scheduler."""
    import threading

    from schedswitchd.daemon import protocol as proto
    from schedswitchd.daemon.client import DaemonClient
    from tests.daemon.fakes import FakeBackend
    from tests.daemon.harness import FakeTimer, Running

    srv = Running(FakeBackend(), poll_timer=FakeTimer(), default="fifo")
    try:
        daemon = object.__new__(sl.Daemon)
        daemon.sock, daemon.proto, daemon.client_cls = srv.path, proto, DaemonClient
        c = srv.client()
        assert c.request(op="hint", workload="gaming")["active"] == "gaming"
        assert daemon.wait_idle(standby="fifo", timeout_s=10).idle is True
        gate = srv.backend.gate = threading.Event()
        srv.backend.preparing.clear()
        c.close()  # back to fifo; the round then prepares gaming (the recent hint's)
        assert srv.backend.preparing.wait(10)
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(daemon.wait_idle(standby="gaming")))
        waiter.start()
        waiter.join(0.6)  # three polls
        assert waiter.is_alive() and not got, "returned while the refill was under way"
        gate.set()
        waiter.join(10)
        assert got and got[0].idle and [e.scheduler for e in got[0].standby] == ["gaming"]
        with pytest.raises(RuntimeError, match="not idle with nope held"):
            daemon.wait_idle(standby="nope", timeout_s=0.3)
    finally:
        if srv.backend.gate is not None:
            srv.backend.gate.set()
        srv.stop()


def _hits(overs: list[float], gap_ms: float = 30.0) -> list[dict[str, Any]]:
    return [_sample(gap_ms + o, gap_ms) for o in overs]


def test_the_interval_of_one_boots_verdict(sl: ModuleType) -> None:
    raw = _raw([400, 400, 450, 600], [200, 200, 200, 202], gap=30, rss=40)
    assert sl.lane_excess_interval(raw) is None  # no (e), no lane
    # (e) 1 ms beyond the lane at every quantile: the point 1.0, an interval around it
    spread = [6.0 + 0.1 * i for i in range(21)]
    raw["steps"][-1]["samples"]["e"] = _hits([x + 1.0 for x in spread])
    raw["steps"][-1]["lane"] = _hits(spread)
    assert sl.lane_excess_ms(raw) == pytest.approx(1.0)
    low, high = sl.lane_excess_interval(raw)
    assert low < 1.0 < high
    assert (low, high) == sl.lane_excess_interval(raw)  # the same samples, the same page
    # Four times the hits (the same spread): a narrower interval around the same point
    raw["steps"][-1]["samples"]["e"] = _hits([x + 1.0 for x in spread] * 4)
    raw["steps"][-1]["lane"] = _hits(spread * 4)
    low4, high4 = sl.lane_excess_interval(raw)
    assert low4 < 1.0 < high4
    assert high4 - low4 < (high - low) * 0.75
    # Apart: (e) 3 ms beyond, the interval does not reach 1 ms
    raw["steps"][-1]["samples"]["e"] = _hits([x + 3.0 for x in spread])
    raw["steps"][-1]["lane"] = _hits(spread)
    assert sl.lane_excess_interval(raw)[0] > 1.0
    raw["steps"][-1]["lane"] = _hits([6.0])
    assert sl.lane_excess_interval(raw) is None  # one hit is no sample to resample
    raw["steps"][-1]["lane"] = [
        {**dict.fromkeys(sl.HIT_FLOOR_PARTS, 1), **x} for x in _hits(spread)
    ]
    for step in raw["steps"]:  # the page's (e) section wants (e) at every step
        step["samples"]["e"] = [_standby(30 + x + 3.0, 30) for x in spread]
    table = sl.build_report(raw, META)[0]
    assert "- That difference of medians over 21 and 21 hits: 90% bootstrap interval +" in table


def test_where_the_daemon_adds_to_the_lane(sl: ModuleType) -> None:
    raw = _raw([400, 400, 450, 600], [200, 200, 200, 202], gap=30, rss=40)
    # (e): the take 2 ms, 17 ms from the send to the record (so 15 in), enabled 55 ms into
    # the switch (so 55 - 46 = 9 of switch beyond the gap), 80 in all (so 80 - 15 - 55 = 10 out)
    e = {**_standby(80, 46), "before_switch_ns": 17_000_000}
    for step in raw["steps"][:-1]:  # other steps' hits are not the largest count's
        step["samples"]["e"] = [{**e, "before_switch_ns": 40_000_000, "first_read_at_accept": 1}]
    raw["steps"][-1]["samples"]["e"] = [{**e, "first_read_at_accept": k} for k in (1, 1, 1, 0)]
    ms = 1_000_000
    # lane: 11 + 4 in, 1 + 20 + 20 + 1 in the window, 2 + 4 out: 63 ms, the gap 40
    lane = {"total_ns": 63 * ms, "gap_ns": 40 * ms, "in_ns": 11 * ms, "checks_ns": 4 * ms,
            "window_ns": 1 * ms, "detach_ns": 20 * ms, "link_ns": 20 * ms,
            "confirm_ns": 1 * ms, "send_ns": 2 * ms, "out_ns": 4 * ms}  # fmt: skip
    raw["steps"][-1]["lane"] = [dict(lane)] * 3
    assert sl.lane_excess_parts(raw) is None  # a lane that did not record at_accept
    # a line that came late on either side is left out: it costs a second wake-up
    raw["steps"][-1]["lane"] = [{**lane, "at_accept": 1}] * 3 + [
        {**lane, "at_accept": 0, "in_ns": 90 * ms, "total_ns": 142 * ms}
    ]
    # lane: in 11 + 4 - the take 2 = 13; switch 1 + 20 + 20 + 1 - 40 + 2 = 4; out 2 + 4 = 6
    way_in, switch, way_out, n_e, n_lane = sl.lane_excess_parts(raw)
    assert (way_in, switch, way_out) == pytest.approx((2.0, 5.0, 4.0))
    assert (n_e, n_lane) == (3, 3)
    # each side's parts add up to its time beyond its gap (e: 34, the lane: 23)
    assert way_in + switch + way_out == pytest.approx(34 - 23)
    assert sl.lane_excess_ms(raw) == pytest.approx(34 - 23)
    table = sl.build_report(raw, META)[0]
    assert (
        "the way in (the client's send to the pool's take) +2.00 ms, the switch beyond its "
        "gap (from the take, the same on both sides, to the kernel running the new "
        "scheduler) +5.00 ms, the way out (to the client's checked reply) +4.00 ms" in table
    )


def test_the_hits_past_the_rotation_are_said_apart(sl: ModuleType) -> None:
    raw = _raw([400, 400, 450, 600], [200, 200, 200, 202], gap=30, rss=40)
    parts = dict.fromkeys(sl.HIT_FLOOR_PARTS, 1)
    for step in raw["steps"]:
        step["samples"]["e"] = [_standby(30 + over, 30) for over in (9, 9, 9)]
    # three hits among the other columns (c has 3), then four alone: (e) 9 then 7 over
    # its gap, the lane 6 then 6.5
    raw["steps"][-1]["samples"]["e"] += [_standby(37, 30)] * 4
    raw["steps"][-1]["lane"] = [{**parts, **x} for x in _hits([6.0] * 3 + [6.5] * 4)]
    table = sl.build_report(raw, META)[0]
    assert (
        "- Over the first 3 hits of each, taken among the other columns: +3.00 ms; over the "
        "4 of (e) and 4 of the lane after them, taken alone: +0.50 ms." in table
    )
    raw["steps"][-1]["samples"]["e"] = raw["steps"][-1]["samples"]["e"][:3]
    raw["steps"][-1]["lane"] = raw["steps"][-1]["lane"][:3]
    assert "taken alone" not in sl.build_report(raw, META)[0]  # no hits past the rotation


def test_more_hits_at_the_largest_count_only(sl: ModuleType) -> None:
    counts = [1, 10, 300]
    assert [sl.hit_reps_at(n, counts, 21, 121) for n in counts] == [21, 21, 121]
    assert sl.hit_reps_at(300, counts, 21, 0) == 21  # --hit-reps below --reps
    assert sl.hit_reps_at(300, counts, 0, 121) == 0  # a profiling run takes no samples


def test_which_columns_run_in_a_repetition(sl: ModuleType) -> None:
    def run(rep: int, **counts: int) -> str:
        return "".join(c for c in "abcdef" if sl.measured(c, rep, **counts))

    counts = {"reps": 3, "cold_reps": 1, "hit_reps": 5}
    assert [run(rep, **counts) for rep in range(5)] == ["abcdef", "acdef", "acdef", "ef", "ef"]
    # --hit-reps below --reps: (e) and (f) run as often as the rest
    assert run(2, reps=3, cold_reps=1, hit_reps=0) == "acdef"
    assert run(3, reps=3, cold_reps=1, hit_reps=0) == ""
    assert run(3, reps=3, cold_reps=5, hit_reps=0) == "b"


def test_each_step_gets_its_own_lane_hits(sl: ModuleType) -> None:
    steps: list[dict[str, Any]] = [{"hit_reps": 2}, {"hit_reps": 5}]
    sl.deal_lane([{"n": i} for i in range(7)], steps)
    assert [[h["n"] for h in step["lane"]] for step in steps] == [[0, 1], [2, 3, 4, 5, 6]]


def test_the_lanes_replies_are_the_daemons_lines(bench_script: Callable[[str], ModuleType]) -> None:
    """The socket floor and the hit's lane send a standby hit's reply as the daemon writes it
    (same fields, same order, same bytes), so they copy and parse as much as the daemon's
    client does; a field added to the daemon's reply fails this until the lanes have it."""
    from schedswitchd.daemon import protocol as proto

    filled = bench_script("hit_floor").REPLY % (3, 1796310945.25, 5, 6, 7, 8, 9, b"true")
    for line in (bench_script("socket_floor").REPLY, filled):
        reply = proto.parse_reply(line)
        assert isinstance(reply, proto.HintReply)
        assert proto.encode(reply) == line
