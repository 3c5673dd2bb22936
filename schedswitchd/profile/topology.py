"""The machine's CPU topology, read from a sysfs root it is given (``/sys`` or a fake tree).

What a scheduler's user space reads before loading its BPF object (scx's
``rust/scx_utils/src/topology.rs`` reads the same files), as plain frozen records that the
profile expressions (:mod:`schedswitchd.profile.expr`) can look at:

- ``devices/system/cpu/{possible,online}``: cpulists (``0-3,8``; kernel doc
  ``Documentation/ABI/testing/sysfs-devices-system-cpu``); ``nr_cpu_ids`` is the last
  possible CPU + 1, as the kernel computes it (``setup_nr_cpu_ids()``);
- ``cpuN/topology/{core_id,physical_package_id,thread_siblings_list}``
  (``Documentation/admin-guide/cputopology.rst``); the directory is absent for an offline
  CPU, whose ids are then ``-1``;
- ``cpuN/cache/indexM/{level,type,id,shared_cpu_list}``
  (``Documentation/ABI/testing/sysfs-devices-system-cpu``): the last level cache (LLC) is
  the highest-level ``Unified``/``Data`` cache; its ``id`` names the LLC (without an
  ``id`` file the lowest CPU sharing it does);
- ``cpuN/cpufreq/{cpuinfo_max_freq,cpuinfo_min_freq,base_frequency}`` in kHz (0 when
  absent);
- CPU capacity, as scx_utils' ``get_capacity_source()`` guesses it: the first of
  :data:`CAPACITY_SOURCES` (``cpufreq/amd_pstate_prefcore_ranking``,
  ``cpufreq/amd_pstate_highest_perf``, ``acpi_cppc/highest_perf``, ``cpu_capacity``,
  ``cpufreq/cpuinfo_max_freq``) whose value on ``cpu0`` is positive and differs on some
  ``cpuN`` directory (a CPU without the file counts as 0); when none differs, the last one
  positive on ``cpu0`` (all CPUs then get 1024); when none is, no source (all 1024). Each
  CPU's raw value (the source's largest value where its own file is missing) is scaled
  to ``raw * 1024 // max`` (``SCHED_CAPACITY_SCALE``), the largest raw value over every
  ``cpuN`` directory, offline CPUs' included;
- core types, as scx_utils' ``create_insert_cpu()`` decides them from the same raw values
  (``max``, ``min`` and the integer ``avg`` over every ``cpuN`` directory): the machine is
  big/LITTLE when ``max >= 1.3 * min`` (in single precision); a CPU is ``"turbo"`` when
  its raw value is ``max`` and ``avg < max``, else ``"big"`` when the machine is not
  big/LITTLE or its raw value is at least ``avg``, else ``"little"``;
- ``devices/system/node/nodeK/cpulist``: NUMA nodes (one node 0 holding every CPU when the
  directory is absent, as on a kernel without ``CONFIG_NUMA``); ``nr_node_ids`` counts
  every ``nodeK`` directory, CPU-less ones too (scx_utils' ``topo.nodes.len()``).

``cpus`` is dense: ``cpus[i].id == i`` for every ``i < nr_cpu_ids``, a CPU number missing
from ``possible`` (a hole) included with ``possible=False``. Everything is computed once by
:func:`read_topology`; a malformed file raises :class:`TopologyError` naming it.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from schedswitchd.errors import ProfileError

__all__ = [
    "CAPACITY_SOURCES",
    "CORE_TYPES",
    "SCHED_CAPACITY_SCALE",
    "Cpu",
    "CpuGroup",
    "OnlineFile",
    "SmtPair",
    "Topology",
    "TopologyError",
    "capture_sysfs",
    "cpumask",
    "parse_cpulist",
    "read_topology",
]

#: The capacity of the machine's largest CPU (``include/linux/sched.h``).
SCHED_CAPACITY_SCALE = 1024
#: Where CPU capacity is read from, most precise first (paths under ``cpuN/``; scx_utils'
#: ``get_capacity_source()``).
CAPACITY_SOURCES = (
    "cpufreq/amd_pstate_prefcore_ranking",
    "cpufreq/amd_pstate_highest_perf",
    "acpi_cppc/highest_perf",
    "cpu_capacity",
    "cpufreq/cpuinfo_max_freq",
)
#: ``Cpu.core_type`` values (scx_utils' ``CoreType::Little``, ``Big``, ``Big { turbo }``).
CORE_TYPES = ("little", "big", "turbo")
#: Upper bound on CPU numbers accepted from sysfs (the kernel's ``NR_CPUS`` maximum is 8192).
MAX_CPUS = 8192


class TopologyError(ProfileError):
    """A sysfs topology file that is missing where required or does not parse."""

    code = "topology"


def parse_cpulist(text: str, what: str = "cpulist") -> list[int]:
    """``"0-3,8,10-11"`` -> ``[0, 1, 2, 3, 8, 10, 11]`` (sorted, unique); ``""`` -> ``[]``.
    Raises :class:`TopologyError` (naming ``what``) for anything else."""
    out: set[int] = set()
    text = text.strip()
    if not text:
        return []
    for part in text.split(","):
        lo_s, dash, hi_s = part.partition("-")
        try:
            lo = int(lo_s)
            hi = int(hi_s) if dash else lo
        except ValueError:
            raise TopologyError(f"{what}: {text!r} is not a cpulist") from None
        if lo < 0 or hi < lo or hi >= MAX_CPUS:
            raise TopologyError(f"{what}: range {part!r} is out of bounds")
        out.update(range(lo, hi + 1))
    return sorted(out)


def cpumask(cpus: Iterable[int], nbytes: int) -> bytes:
    """A cpumask of ``nbytes`` bytes, bit ``i`` (little endian, bit 0 of byte 0 = CPU 0)
    set for each CPU ``i`` -- the layout of an ``unsigned long`` bitmap on a little-endian
    machine, so it also fills ``u64 mask[N]`` (``nbytes = 8 * N``) or a ``u8 mask[N]``.
    Raises :class:`ProfileError` when a CPU does not fit."""
    buf = bytearray(nbytes)
    for c in cpus:
        if not 0 <= c < 8 * nbytes:
            raise ProfileError(f"cpumask: CPU {c} does not fit {nbytes} bytes")
        buf[c // 8] |= 1 << (c % 8)
    return bytes(buf)


@dataclass(frozen=True, slots=True)
class Cpu:
    """One CPU number below ``nr_cpu_ids``. Ids are ``-1`` when unknown (an offline CPU
    has no ``topology/`` or ``cache/`` directory); ``possible`` is false for a hole in the
    possible mask (then also offline); ``siblings`` are the *other* hardware threads of its
    core; ``capacity`` in ``SCHED_CAPACITY_SCALE`` units, scaled from ``raw_capacity`` as
    read from ``capacity_source`` (a :data:`CAPACITY_SOURCES` path, ``""`` when none);
    ``core_type`` one of :data:`CORE_TYPES`; frequencies in kHz (0 when the kernel exposes
    no cpufreq); ``l2_id``/``l3_id`` the ids of its level-2 and level-3 caches, ``llc_id``
    that of its last level cache."""

    id: int
    online: bool
    core_id: int = -1
    package_id: int = -1
    llc_id: int = -1
    node_id: int = 0
    siblings: tuple[int, ...] = ()
    capacity: int = SCHED_CAPACITY_SCALE
    max_freq_khz: int = 0
    min_freq_khz: int = 0
    base_freq_khz: int = 0
    l2_id: int = -1
    l3_id: int = -1
    possible: bool = True
    raw_capacity: int = SCHED_CAPACITY_SCALE
    capacity_source: str = ""
    core_type: str = "big"


@dataclass(frozen=True, slots=True)
class CpuGroup:
    """A core, LLC or NUMA node: ``id`` (the sysfs id; a core's is its index in
    ``Topology.cores``), ``index`` (dense, 0..n-1 in id order), ``cpus`` (online CPUs
    in the group, sorted) and ``mask`` (their cpumask, ``Topology.mask_bytes`` long)."""

    id: int
    index: int
    cpus: tuple[int, ...]
    mask: bytes


@dataclass(frozen=True, slots=True)
class SmtPair:
    """An ordered pair of hardware threads of one core (``cpu`` != ``sibling``)."""

    cpu: int
    sibling: int


@dataclass(frozen=True, slots=True)
class Topology:
    """The machine as a scheduler's user space sees it at load time. Lists are sorted;
    ``cpus`` holds one record per CPU number below ``nr_cpu_ids`` (``cpus[i].id == i``;
    offline ones with ``online=False``, holes in the possible mask also with
    ``possible=False``); groups hold online CPUs only. ``mask_bytes`` is the default
    cpumask size: ``nr_cpu_ids`` rounded up to whole bytes. ``nr_node_ids``: the number of
    ``nodeK`` directories (CPU-less nodes included; 1 without the directory);
    ``capacity_source``: the path capacities were read from (``""``: none)."""

    nr_cpu_ids: int
    possible_cpus: tuple[int, ...]
    online_cpus: tuple[int, ...]
    cpus: tuple[Cpu, ...]
    cores: tuple[CpuGroup, ...]
    llcs: tuple[CpuGroup, ...]
    nodes: tuple[CpuGroup, ...]
    smt_active: bool
    smt_pairs: tuple[SmtPair, ...] = field(default=())
    nr_node_ids: int = 1
    capacity_source: str = ""

    @property
    def nr_cpus(self) -> int:
        """Number of online CPUs."""
        return len(self.online_cpus)

    @property
    def nr_llcs(self) -> int:
        """Number of last level caches with an online CPU."""
        return len(self.llcs)

    @property
    def nr_nodes(self) -> int:
        """Number of NUMA nodes with an online CPU (what bpfland, flash and cosmos count
        to decide NUMA; CPU-less nodes are only in ``nr_node_ids``)."""
        return len(self.nodes)

    @property
    def nr_cores(self) -> int:
        """Number of physical cores with an online CPU."""
        return len(self.cores)

    @property
    def mask_bytes(self) -> int:
        """Bytes of a cpumask covering ``nr_cpu_ids`` CPUs."""
        return (self.nr_cpu_ids + 7) // 8

    @property
    def max_capacity(self) -> int:
        """The largest ``cpu_capacity`` among online CPUs."""
        return max((c.capacity for c in self.cpus if c.online), default=SCHED_CAPACITY_SCALE)

    @property
    def has_big_little(self) -> bool:
        """True when an online CPU is ``"little"`` (scx_utils' ``has_little_cores()``)."""
        return any(c.online and c.core_type == "little" for c in self.cpus)

    @property
    def big_cpus(self) -> tuple[int, ...]:
        """Online CPUs of core type ``"big"`` or ``"turbo"`` (scx_utils'
        ``Powermode::Performance``; every online CPU on a machine without little cores)."""
        return tuple(c.id for c in self.cpus if c.online and c.core_type != "little")

    @property
    def little_cpus(self) -> tuple[int, ...]:
        """Online CPUs of core type ``"little"`` (``Powermode::Powersave``)."""
        return tuple(c.id for c in self.cpus if c.online and c.core_type == "little")

    @property
    def turbo_cpus(self) -> tuple[int, ...]:
        """Online CPUs of core type ``"turbo"`` (``Powermode::Turbo``)."""
        return tuple(c.id for c in self.cpus if c.online and c.core_type == "turbo")

    def cpu(self, cpu_id: int) -> Cpu:
        """The :class:`Cpu` record of ``cpu_id``. Raises :class:`ProfileError`."""
        if 0 <= cpu_id < len(self.cpus) and self.cpus[cpu_id].possible:
            return self.cpus[cpu_id]
        raise ProfileError(f"CPU {cpu_id} is not a possible CPU of this machine")

    def describe(self) -> str:
        """One line: ``2 CPUs (0-1 online), 2 cores, 1 LLC, 1 node, SMT off``."""
        smt = "on" if self.smt_active else "off"
        bl = ", big.LITTLE" if self.has_big_little else ""
        return (
            f"{len(self.possible_cpus)} possible CPUs (nr_cpu_ids {self.nr_cpu_ids}), "
            f"{self.nr_cpus} online, {self.nr_cores} cores, {self.nr_llcs} LLCs, "
            f"{self.nr_nodes} nodes, SMT {smt}{bl}"
        )


# --- reading -----------------------------------------------------------------------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="strict").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyError(f"{path}: cannot read: {exc}") from None


def _read_int(path: Path, default: int) -> int:
    text = _read(path)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise TopologyError(f"{path}: {text!r} is not an integer") from None


def _cache_ids(cpu_dir: Path, cpu_id: int) -> tuple[int, int, int]:
    """(llc_id, l2_id, l3_id) of one CPU from ``cache/index*``; -1 where unknown."""
    cache = cpu_dir / "cache"
    best: tuple[int, int] | None = None  # (level, id) of the highest data/unified level
    ids: dict[int, int] = {}
    try:
        entries = sorted(p for p in cache.iterdir() if p.name.startswith("index"))
    except (FileNotFoundError, NotADirectoryError):
        return -1, -1, -1
    for idx in entries:
        ctype = _read(idx / "type")
        if ctype not in ("Unified", "Data"):
            continue
        level = _read_int(idx / "level", -1)
        cid = _read_int(idx / "id", -1)
        if cid < 0:  # no id file (older kernels, some arm64): the first CPU sharing it
            shared = _read(idx / "shared_cpu_list")
            cpus = parse_cpulist(shared, str(idx / "shared_cpu_list")) if shared else []
            cid = cpus[0] if cpus else cpu_id
        ids[level] = cid
        if best is None or level > best[0]:
            best = (level, cid)
    return (best[1] if best else -1), ids.get(2, -1), ids.get(3, -1)


def _node_of(cpu_dir: Path, node_map: dict[int, int], cpu_id: int) -> int:
    if cpu_id in node_map:
        return node_map[cpu_id]
    try:
        for p in cpu_dir.iterdir():  # cpuN/nodeK symlinks
            if p.name.startswith("node") and p.name[4:].isdigit():
                return int(p.name[4:])
    except FileNotFoundError:
        pass
    return 0


def _f32(x: float) -> float:
    """``x`` rounded to single precision (scx_utils compares capacities as ``f32``)."""
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


@dataclass(frozen=True, slots=True)
class _CapacitySource:
    suffix: str
    avg: int
    max: int
    big_little: bool


def _capacity_source(cpu_root: Path) -> _CapacitySource:
    """scx_utils' ``get_capacity_source()`` over every ``cpuN`` directory (see the
    module docstring)."""
    dirs = sorted(
        (p for p in cpu_root.glob("cpu[0-9]*") if p.name[3:].isdigit()),
        key=lambda p: int(p.name[3:]),
    )
    suffix = CAPACITY_SOURCES[-1]
    for src in CAPACITY_SOURCES:
        first = _read_int(cpu_root / "cpu0" / src, 0)
        if first <= 0:
            continue
        suffix = src
        if any(_read_int(d / src, 0) != first for d in dirs):
            break
    raws = [_read_int(d / suffix, 0) for d in dirs]
    top = max(raws, default=0)
    if top <= 0:
        return _CapacitySource("", SCHED_CAPACITY_SCALE, SCHED_CAPACITY_SCALE, False)
    low = min(raws)
    return _CapacitySource(
        suffix, sum(raws) // len(raws), top, _f32(top) >= _f32(_f32(1.3) * _f32(low))
    )


def _core_type(raw: int, cs: _CapacitySource) -> str:
    if cs.avg < cs.max and raw == cs.max:
        return "turbo"
    if not cs.big_little or raw >= cs.avg:
        return "big"
    return "little"


def _groups(members: dict[int, list[int]], nbytes: int) -> tuple[CpuGroup, ...]:
    return tuple(
        CpuGroup(gid, i, tuple(sorted(cpus)), cpumask(cpus, nbytes))
        for i, (gid, cpus) in enumerate(sorted(members.items()))
    )


class OnlineFile:
    """``devices/system/cpu/online`` under ``sysfs_root``, as the kernel has it now: raw
    bytes, for comparing with an earlier read (a standby hit's quick freshness check). Under
    ``/sys`` read with one ``pread(2)`` at offset 0 from a descriptor opened once (an
    attribute's ``show`` runs again on every read from offset 0; an ``open(2)`` of a
    sysfs path costs about two reads: docs/performance.md); elsewhere (a test's tree, whose
    files may be replaced) opened for each read. Thread-safe."""

    def __init__(self, sysfs_root: str | os.PathLike[str] = "/sys") -> None:
        self.path = Path(sysfs_root) / "devices" / "system" / "cpu" / "online"
        self._keep = Path(sysfs_root).is_relative_to("/sys")
        self._fd: int | None = None
        self._lock = threading.Lock()

    def read(self) -> bytes | None:
        """The file's bytes now; ``None`` when it is missing or cannot be read."""
        try:
            if not self._keep:
                return self.path.read_bytes()
            fd = self._fd
            if fd is None:
                with self._lock:
                    if self._fd is None:
                        self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                    fd = self._fd
            return os.pread(fd, 4096, 0)
        except OSError:
            return None


def read_topology(sysfs_root: str | os.PathLike[str] = "/sys") -> Topology:
    """Read the topology under ``sysfs_root`` (its ``devices/system/cpu`` and
    ``devices/system/node``). Raises :class:`TopologyError` when ``sysfs_root`` is not a
    directory, ``possible`` or ``online`` is missing or a file does not parse."""
    root = Path(sysfs_root)
    if not root.is_dir():
        why = "is not a directory" if root.exists() else "does not exist"
        raise TopologyError(f"{root} {why} (expected a sysfs tree: devices/system/cpu/possible)")
    cpu_root = root / "devices" / "system" / "cpu"
    possible_txt = _read(cpu_root / "possible")
    if possible_txt is None:
        raise TopologyError(f"{cpu_root / 'possible'} is missing: not a sysfs tree")
    possible = parse_cpulist(possible_txt, str(cpu_root / "possible"))
    if not possible:
        raise TopologyError(f"{cpu_root / 'possible'} lists no CPU")
    online_txt = _read(cpu_root / "online")
    online = set(parse_cpulist(online_txt, str(cpu_root / "online")) if online_txt else possible)
    nr_cpu_ids = possible[-1] + 1
    nbytes = (nr_cpu_ids + 7) // 8

    node_map: dict[int, int] = {}
    node_root = root / "devices" / "system" / "node"
    try:
        node_dirs = [
            p for p in node_root.iterdir() if p.name.startswith("node") and p.name[4:].isdigit()
        ]
    except FileNotFoundError:
        node_dirs = []
    for nd in node_dirs:
        text = _read(nd / "cpulist")
        for n in parse_cpulist(text or "", str(nd / "cpulist")):
            node_map[n] = int(nd.name[4:])

    cs = _capacity_source(cpu_root)
    possible_set = set(possible)
    cpus: list[Cpu] = []
    for cid in range(nr_cpu_ids):
        if cid not in possible_set:
            cpus.append(Cpu(cid, False, possible=False, core_type=_core_type(cs.max, cs)))
            continue
        d = cpu_root / f"cpu{cid}"
        is_online = cid in online
        freq = d / "cpufreq"
        # A CPU without the source's file counts as the largest (scx_utils does the same).
        raw = _read_int(d / cs.suffix, cs.max) if cs.suffix else cs.max
        base = Cpu(
            cid,
            is_online,
            capacity=raw * SCHED_CAPACITY_SCALE // cs.max,
            raw_capacity=raw,
            capacity_source=cs.suffix,
            core_type=_core_type(raw, cs),
            max_freq_khz=_read_int(freq / "cpuinfo_max_freq", 0),
            min_freq_khz=_read_int(freq / "cpuinfo_min_freq", 0),
            base_freq_khz=_read_int(freq / "base_frequency", 0),
            node_id=_node_of(d, node_map, cid),
        )
        topo = d / "topology"
        if not is_online or not (topo / "core_id").exists():
            cpus.append(base)
            continue
        sib_txt = _read(topo / "thread_siblings_list") or str(cid)
        siblings = tuple(
            s
            for s in parse_cpulist(sib_txt, str(topo / "thread_siblings_list"))
            if s != cid and s in online
        )
        llc, l2, l3 = _cache_ids(d, cid)
        cpus.append(
            replace(
                base,
                core_id=_read_int(topo / "core_id", -1),
                package_id=_read_int(topo / "physical_package_id", -1),
                llc_id=llc,
                siblings=siblings,
                l2_id=l2,
                l3_id=l3,
            )
        )

    on = [c for c in cpus if c.online]
    # A core is its thread-sibling set: core ids repeat across packages (and dies).
    core_key: dict[tuple[int, ...], list[int]] = {}
    for c in on:
        core_key.setdefault(tuple(sorted((c.id, *c.siblings))), []).append(c.id)
    cores = tuple(
        CpuGroup(i, i, key, cpumask(key, nbytes)) for i, key in enumerate(sorted(core_key))
    )
    llc_members: dict[int, list[int]] = {}
    node_members: dict[int, list[int]] = {}
    for c in on:
        llc_members.setdefault(c.llc_id if c.llc_id >= 0 else 0, []).append(c.id)
        node_members.setdefault(c.node_id, []).append(c.id)
    pairs = tuple(SmtPair(c.id, s) for c in on for s in c.siblings)
    smt_file = _read(cpu_root / "smt" / "active")
    smt_active = smt_file == "1" if smt_file in ("0", "1") else bool(pairs)
    return Topology(
        nr_cpu_ids=nr_cpu_ids,
        possible_cpus=tuple(possible),
        online_cpus=tuple(sorted(online & set(possible))),
        cpus=tuple(cpus),
        cores=cores,
        llcs=_groups(llc_members, nbytes),
        nodes=_groups(node_members, nbytes),
        smt_active=smt_active,
        smt_pairs=pairs,
        nr_node_ids=max(1, len(node_dirs)),
        capacity_source=cs.suffix,
    )


#: The files :func:`read_topology` reads, as globs under a sysfs root (what
#: :func:`capture_sysfs` copies).
SYSFS_FILES = (
    "devices/system/cpu/possible",
    "devices/system/cpu/online",
    "devices/system/cpu/smt/active",
    "devices/system/cpu/cpu[0-9]*/topology/core_id",
    "devices/system/cpu/cpu[0-9]*/topology/physical_package_id",
    "devices/system/cpu/cpu[0-9]*/topology/thread_siblings_list",
    "devices/system/cpu/cpu[0-9]*/cache/index[0-9]*/level",
    "devices/system/cpu/cpu[0-9]*/cache/index[0-9]*/type",
    "devices/system/cpu/cpu[0-9]*/cache/index[0-9]*/id",
    "devices/system/cpu/cpu[0-9]*/cache/index[0-9]*/shared_cpu_list",
    "devices/system/cpu/cpu[0-9]*/cpufreq/cpuinfo_min_freq",
    "devices/system/cpu/cpu[0-9]*/cpufreq/base_frequency",
    *(f"devices/system/cpu/cpu[0-9]*/{src}" for src in CAPACITY_SOURCES),
    "devices/system/node/node[0-9]*/cpulist",
)


def capture_sysfs(dest: str | os.PathLike[str], src: str | os.PathLike[str] = "/sys") -> list[str]:
    """Copy the files of :data:`SYSFS_FILES` from the sysfs tree ``src`` into ``dest``
    (same relative paths; a ``cpuN`` directory is made for every CPU directory of
    ``src``, so offline CPUs stay in the capture), for ``--sysfs`` elsewhere. Returns the
    relative paths written. Raises :class:`TopologyError` when ``src`` is not a sysfs
    tree or ``dest`` cannot be written; the capture is checked by reading it back."""
    root, out = Path(src), Path(dest)
    if _read(root / "devices" / "system" / "cpu" / "possible") is None:
        raise TopologyError(f"{root}: not a sysfs tree (no devices/system/cpu/possible)")
    written: list[str] = []
    try:
        for d in root.glob("devices/system/cpu/cpu[0-9]*"):
            if d.name[3:].isdigit():
                (out / d.relative_to(root)).mkdir(parents=True, exist_ok=True)
        for pattern in SYSFS_FILES:
            for f in sorted(root.glob(pattern)):
                try:
                    data = f.read_bytes()
                except OSError:
                    continue  # a file the kernel refuses to show (an offline CPU's)
                rel = f.relative_to(root)
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                (out / rel).write_bytes(data)
                written.append(str(rel))
    except OSError as exc:
        raise TopologyError(f"{out}: cannot write the capture: {exc}") from None
    read_topology(out)
    return written
