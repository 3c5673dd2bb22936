"""Benchmark: the daemon's resident memory with a prepared standby and pre-opened objects,
and the kernel memory one standby holds per scheduler (in the sched_ext VM).

One boot of the sched_ext VM (:mod:`tools.vm`, Debian sid's kernel under qemu TCG) in the
harness's ramroot mode, as ``bench/switch_latency.py`` (so the figures sit next to its warm
RSS): a tmpfs root, no 9p, ``uinput`` inserted (``ss_latency`` reads its BTF). The real
daemon (``python -m schedswitchd.daemon.service``, real kernel backend) runs three times in
that boot, each a fresh process, each doing the same: start, three hints for ``bench``
(``ss_latency``, ``.kmod_btfs`` build) each ended (back to the default ``ss_fifo``), then a
fourth hint held while its resident memory is read (``VmRSS``, ``RssAnon``, ``RssFile`` +
``RssShmem`` of ``/proc/PID/status``, ``man 5 proc``) with ``ss_latency`` running:

- ``base``: configured ``fifo`` and ``latency`` only, ``[standby] max = 0``: the scenario of
  switch_latency's warm RSS before standbys and pre-opening (48.6 MiB on 2026-11-30);
- ``preopen``: also every other scheduler (the sample ``ss_vtime`` and the corpus objects of
  ``../shared/corpus`` that are present), all opened by the daemon in the background after
  READY (its ``preopens`` counter), ``[standby] max = 0``;
- ``standby``: as ``preopen`` with ``[standby] max = 1``: the default ``ss_fifo`` is held
  prepared while ``ss_latency`` runs (read once the status lists it). Then, per configured
  scheduler, a launcher intent (``prepare``) for it: the reply's ``kernel_bytes`` (maps' and
  programs' ``memlock`` from fdinfo, what ``status`` shows) and the daemon's RSS with that
  standby held; an object that cannot be prepared (the daemon's error) is reported as such.

Corpus objects are prepared without their profiles (this daemon reads none yet): the
standby's kernel bytes are those of the object's own maps and programs as loaded.

Writes ``daemon_rss_vm.md`` and ``daemon_rss_vm.json`` under ``--out`` (default
``bench/results``). Target: ``base`` at most 46.3 MiB (:data:`BASE_RSS_TARGET_MIB`, the
reading the daemon's refactoring started from). Exit status 0 on a complete run that meets
it, 2 when it misses, 1 on failure.

Usage: ``python bench/daemon_rss.py [--out DIR] [--timeout S]``. Internal sub-command (in the
VM): ``_vm``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vm_bench import (
    CORPUS,
    REPO,
    SCHED_DIR,
    host_prepare,
    load_text,
    machine,
    redo_page,
    repo_relative,
    rss_mib,
    save_run,
    utc_now,
    vm_run_failed,
)
from vm_bench import wait_scx as _wait_scx

sys.path.insert(0, str(REPO))

#: Configuration key -> corpus file (the names tests/vm/test_profiles_corpus.py uses).
CORPUS_OBJECTS = {
    "scx_simple": "k_simple.bpf.o",
    "scx_qmap": "k_qmap.bpf.o",
    "scx_central": "k_central.bpf.o",
    "scx_flatcg": "k_flatcg.bpf.o",
    "bpfland": "bpfland.bpf.o",
    "flash": "flash.bpf.o",
    "tickless": "tickless.bpf.o",
    "lavd": "lavd.bpf.o",
    "p2dq": "p2dq.bpf.o",
}
DECLARED_MODULE = "uinput"
HINTS_BEFORE = 3
RUNS = ("base", "preopen", "standby")

CONFIG_HEAD = """
default = "fifo"
[socket]
path = "{sock}"
[logging]
level = "warning"
journal = "no"
[btf_cache]
max_entries = 16
max_bytes = 67108864
[standby]
max = {standby_max}
recent = false
[schedulers.fifo]
object = "{sched}/fifo.bpf.o"
[schedulers.latency]
object = "{sched}/latency.bpf.o"
[hints.bench]
scheduler = "latency"
priority = 50
"""


# --- inside the VM ---------------------------------------------------------------------------


def _wait(state: str, ops: str | None = None, timeout_s: float = 600.0) -> None:
    """Poll sysfs every 10 ms until sched_ext is ``state`` (running ``ops``)."""
    _wait_scx(state, ops, timeout_s, poll_s=0.01)


def _rss(pid: int) -> dict[str, float]:
    """``VmRSS`` and its parts of ``pid`` in MiB (:func:`vm_bench.rss_mib`)."""
    return rss_mib(pid)


def config_text(sock: str, standby_max: int, extra: dict[str, str]) -> str:
    """The daemon's configuration: ``fifo`` (default) and ``latency`` (hint ``bench``) and,
    per ``extra`` entry (key -> object path), a scheduler with a hint ``p-KEY``."""
    text = CONFIG_HEAD.format(sock=sock, standby_max=standby_max, sched=SCHED_DIR)
    for key, path in extra.items():
        text += f'[schedulers.{key}]\nobject = "{path}"\n'
        text += f'[hints.p-{key}]\nscheduler = "{key}"\npriority = 40\n'
    return text


class Daemon:
    """``schedswitchd`` with ``config`` in ``work``; requests on a connection each."""

    def __init__(self, work: Path, config: str) -> None:
        from schedswitchd.daemon import protocol as proto
        from schedswitchd.daemon.client import DaemonClient

        self.proto, self.client_cls = proto, DaemonClient
        work.mkdir(parents=True, exist_ok=True)
        self.sock = str(work / "sock")
        cfg = work / "config.toml"
        cfg.write_text(config)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "schedswitchd.daemon.service", "--config", str(cfg)],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 300
        while not Path(self.sock).exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daemon did not start (status {self.proc.poll()})")
            time.sleep(0.05)
        _wait("enabled", "ss_fifo", timeout_s=300)

    def request(self, message: Any) -> Any:
        with self.client_cls(self.sock, timeout_s=300) as client:
            return client.request(message)

    def status(self) -> Any:
        return self.request(self.proto.StatusRequest()).status

    def hint(self) -> Any:
        """A client holding a ``bench`` lease, ``ss_latency`` running; close it to end it."""
        client = self.client_cls(self.sock, timeout_s=300)
        reply = client.request(self.proto.HintRequest(workload="bench"))
        # The first hint queues behind the worker's pre-opening of every configured object,
        # which under TCG (lavd, p2dq) outlasts the reply's wait: then the reply says
        # ``pending`` and the switch follows.
        try:
            _wait("enabled", "ss_latency", timeout_s=600 if getattr(reply, "pending", False) else 5)
        except RuntimeError as exc:
            raise RuntimeError(f"hint bench: {exc}, reply {reply!r}") from None
        return client

    def wait_standby(self, name: str, timeout_s: float = 300.0) -> Any:
        """The status entry of standby ``name`` once the pool holds it."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = [e for e in self.status().standby if e.scheduler == name]
            if got:
                return got[0]
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} was not held as a standby")
            time.sleep(0.2)

    def wait_idle(self, timeout_s: float = 900.0) -> None:
        """Until the daemon's status says ``idle`` (no reconcile round, pre-open, refill or
        worker call running or kicked); :class:`RuntimeError` after ``timeout_s`` (s)."""
        deadline = time.monotonic() + timeout_s
        while not self.status().idle:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the daemon was not idle within {timeout_s:.0f} s")
            time.sleep(0.2)

    def close(self) -> None:
        """Back to the kernel's scheduler (admin stop), then stop the daemon."""
        try:
            self.request(self.proto.StopRequest())
            _wait("disabled")
        finally:
            self.proc.terminate()
            self.proc.wait(timeout=120)


def one_run(label: str, extra: dict[str, str], log: Any) -> dict[str, Any]:
    """Start a daemon for run ``label`` (see the module docstring) and measure it."""
    from schedswitchd.daemon.launcher_wire import DaemonError

    standby_max = 1 if label == "standby" else 0
    t0 = time.monotonic()
    work = Path(tempfile.gettempdir()) / f"ssd-rss-{label}"
    daemon = Daemon(work, config_text(str(work / "sock"), standby_max, extra))
    out: dict[str, Any] = {"standby_max": standby_max, "configured": 2 + len(extra)}
    try:
        for _ in range(HINTS_BEFORE):
            daemon.hint().close()
            _wait("enabled", "ss_fifo")
        held = daemon.hint()
        if label == "standby":
            entry = daemon.wait_standby("fifo")
            out["default_standby"] = {"scheduler": "fifo", "reason": entry.reason,
                                      "kernel_bytes": entry.kernel_bytes}  # fmt: skip
        # Read a daemon at rest: the pre-open (one object per worker job, interrupted by
        # each hint's pass and resumed after it), the refill and the heap trim queued after
        # the last switch all done. Before status said ``idle``, a fixed 1 s wait read runs
        # whose pre-open under TCG was still under way (0 or 6 of 11 objects opened).
        daemon.wait_idle()
        out["rss"] = _rss(daemon.proc.pid)
        counters = daemon.status().counters
        out["preopens"] = counters.get("preopens", 0)
        log.write(f"{label}: {out['rss']} preopens {out['preopens']}\n")
        if label == "standby":
            out["per_scheduler"] = {}
            for key in ["latency", *extra]:
                # latency runs: its intent is answered "active"; ask for it after its lease.
                if key == "latency":
                    held.close()
                    _wait("enabled", "ss_fifo")
                workload = "bench" if key == "latency" else f"p-{key}"
                t1 = time.monotonic()
                try:
                    reply = daemon.request(
                        daemon.proto.PrepareRequest(workload=workload, ttl_s=3600)
                    )
                except DaemonError as exc:
                    out["per_scheduler"][key] = {"error": f"{exc.code}: {str(exc)[:300]}"}
                    log.write(f"standby {key}: {exc.code} {str(exc)[:300]}\n")
                    continue
                entry = daemon.wait_standby(reply.scheduler)
                time.sleep(1.0)
                out["per_scheduler"][key] = {
                    "kernel_bytes": reply.kernel_bytes,
                    "status_kernel_bytes": entry.kernel_bytes,
                    "prepare_ms": entry.prepare_ms,
                    "intent_s": time.monotonic() - t1,
                    "rss": _rss(daemon.proc.pid),
                }
                log.write(f"standby {key}: {out['per_scheduler'][key]}\n")
        else:
            held.close()
    finally:
        daemon.close()
    out["wall_s"] = time.monotonic() - t0
    return out


def vm_main(args: argparse.Namespace) -> int:
    """Inside the VM: insert uinput, the three daemon runs, JSON to ``--results``."""
    results = Path(args.results)
    log = (results / "daemon_rss.log").open("w", buffering=1)
    for path in Path(args.modules).read_text().split():
        subprocess.run(["insmod", path], check=False, capture_output=True)
    if not Path("/sys/module", DECLARED_MODULE).exists():
        raise RuntimeError(f"{DECLARED_MODULE} is not loaded")
    extra = json.loads(args.extra)
    got: dict[str, Any] = {"cpus": os.cpu_count(), "objects": extra, "runs": {}}
    for label in RUNS:
        got["runs"][label] = one_run(label, {} if label == "base" else extra, log)
        (results / "daemon_rss.raw.json").write_text(json.dumps(got))
    return 0


# --- the host side ---------------------------------------------------------------------------


#: ``base``'s VmRSS at most this (MiB): the daemon must not grow while its code is reshaped.
BASE_RSS_TARGET_MIB = 46.3


def base_rss_met(raw: dict[str, Any]) -> bool:
    """Whether ``base``'s VmRSS is within :data:`BASE_RSS_TARGET_MIB`."""
    return bool(raw["runs"]["base"]["rss"]["rss_mib"] <= BASE_RSS_TARGET_MIB)


def _mib(r: dict[str, float]) -> str:
    return f"{r['rss_mib']:.1f} ({r['anon_mib']:.1f} / {r['file_mib']:.1f})"


def report(raw: dict[str, Any], meta: dict[str, str]) -> str:
    """The markdown page for ``daemon_rss_vm.md``."""
    runs = raw["runs"]
    lines = [
        "# Daemon RSS with a standby and pre-opened objects, kernel bytes per standby (VM)",
        "",
        f"Produced by: `python bench/daemon_rss.py` ({meta['date']}); {meta['machine']}; "
        f"host load average at start {meta['load']}. One boot, ramroot mode (as "
        "`bench/switch_latency.py`), `uinput` inserted; three fresh daemon processes in turn, "
        f"each read after {HINTS_BEFORE} hints to `ss_latency` ended and a fourth held "
        "(`ss_latency` running). RSS = `VmRSS` (RssAnon / RssFile + RssShmem), MiB, one "
        "reading per run.",
        "",
        "| run | configured schedulers | pre-opened (counter) | standbys held | "
        "VmRSS MiB (anon / file) |",
        "|---|---:|---:|---|---:|",
    ]
    for label in RUNS:
        r = runs[label]
        held = "-"
        if r.get("default_standby"):
            d = r["default_standby"]
            held = f"{d['scheduler']} ({d['reason']}, {d['kernel_bytes'] / 1024:.0f} KiB kernel)"
        lines.append(
            f"| {label} | {r['configured']} | {r['preopens']} | {held} | {_mib(r['rss'])} |"
        )
    per = runs["standby"].get("per_scheduler", {})
    lines += [
        "",
        "Per scheduler, in the `standby` daemon: a launcher intent (`prepare`) for it, then "
        "the pool holds it (one standby at most: it replaces the one before). Kernel bytes = "
        "`memlock` of its maps and programs (fdinfo), as the prepare reply and `status` give "
        "them; the daemon's RSS with that standby held.",
        "",
        "| scheduler | object | kernel bytes | KiB | prepare ms (in the daemon) | "
        "VmRSS MiB (anon / file) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    # Relative to the checkout (runs saved before the JSON held them so: their absolute
    # paths were the machine's).
    objects = {"latency": "build/bpf/latency.bpf.o", **{
        k: v if not Path(v).is_absolute() else
        f"{'../shared/corpus' if k in CORPUS_OBJECTS else 'build/bpf'}/{Path(v).name}"
        for k, v in raw["objects"].items()}}  # fmt: skip
    for key, r in per.items():
        if "error" in r:
            lines.append(f"| {key} | `{objects[key]}` | not prepared: {r['error'][:160]} | | | |")
            continue
        note = "" if r["kernel_bytes"] == r["status_kernel_bytes"] else (
            f" (status {r['status_kernel_bytes']})")  # fmt: skip
        lines.append(
            f"| {key} | `{objects[key]}` | {r['kernel_bytes']}{note} | "
            f"{r['kernel_bytes'] / 1024:.0f} | {r['prepare_ms']:.0f} | {_mib(r['rss'])} |"
        )
    base = runs["base"]["rss"]["rss_mib"]
    pre = runs["preopen"]["rss"]["rss_mib"]
    sb = runs["standby"]["rss"]["rss_mib"]
    worst = max([sb, *(r["rss"]["rss_mib"] for r in per.values() if "rss" in r)])
    lines += [
        "",
        f"Pre-opening {runs['preopen']['preopens']} objects adds {pre - base:+.1f} MiB over "
        f"`base`; holding the default as a standby {sb - pre:+.1f} MiB more; the largest "
        f"reading with one standby held is {worst:.1f} MiB. The warm RSS before standbys "
        "and pre-opening was 48.6 MiB (`switch_latency.md`, 2026-11-30, same VM mode).",
        "",
        f"- {'met' if base_rss_met(raw) else 'MISSED'}: `base` VmRSS {base:.1f} MiB "
        f"(target <= {BASE_RSS_TARGET_MIB:g} MiB)",
    ]
    return "\n".join(lines) + "\n"


def host_main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.from_json:
        return redo_page(
            args.from_json, out, "daemon_rss_vm.md", lambda s: report(s["raw"], s["meta"])
        )
    from tools import vm
    from tools.ramroot import RamRootSpec

    kernel = host_prepare()
    if kernel is None:
        return 1
    paths = kernel.decompressed_paths()
    order = vm.module_load_order(kernel, [DECLARED_MODULE])
    extra = {"vtime": str(SCHED_DIR / "vtime.bpf.o")}
    corpus = CORPUS.resolve()
    extra |= {k: str(corpus / f) for k, f in CORPUS_OBJECTS.items() if (corpus / f).is_file()}
    if len(extra) == 1:
        print("../shared/corpus is absent: only the sample schedulers", file=sys.stderr)
    load = load_text()
    script = (
        f'"$PY" "$REPO/bench/daemon_rss.py" _vm --modules "$RESULTS/modules.txt" '
        f"--extra '{json.dumps(extra)}' --results \"$RESULTS\"\n"
    )
    t0 = time.monotonic()
    result = vm.run_in_vm(
        script,
        kernel=kernel,
        timeout=args.timeout,
        inputs={"modules.txt": "".join(f"{paths[n]}\n" for n in order)},
        memory_mib=2048,
        cpus=2,
        ramroot=RamRootSpec(
            extra_files=tuple(paths[n] for n in order)
            + tuple(Path(p) for k, p in extra.items() if k in CORPUS_OBJECTS)
        ),
    )
    if vm_run_failed(result, "daemon_rss.raw.json", ["daemon_rss.log"]):
        return 1
    raw = json.loads(result.text("daemon_rss.raw.json"))
    # The VM was given absolute paths (the same in the VM as here); the JSON keeps them
    # relative to the checkout, as the report shows them.
    raw["objects"] = {k: repo_relative(v) for k, v in raw["objects"].items()}
    meta = {
        "date": utc_now(),
        "machine": machine(result, kernel),
        "load": load,
        "vm_wall_s": f"{time.monotonic() - t0:.0f}",
    }
    save_run(out, "daemon_rss_vm.json", {"meta": meta, "raw": raw}, report(raw, meta),
             "daemon_rss_vm.md")  # fmt: skip
    print(f"(VM run {meta['vm_wall_s']} s)")
    return 0 if base_rss_met(raw) else 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0], allow_abbrev=False)
    sub = ap.add_subparsers(dest="cmd")
    vmp = sub.add_parser("_vm", allow_abbrev=False)
    vmp.add_argument("--modules", required=True)
    vmp.add_argument("--extra", required=True, help="JSON: config key -> object path")
    vmp.add_argument("--results", required=True)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--from-json", help="only redo the page from a daemon_rss_vm.json")
    args = ap.parse_args(argv)
    if args.cmd == "_vm":
        return vm_main(args)
    return host_main(args)


if __name__ == "__main__":
    sys.exit(main())
