"""The global-data and map test objects (``build/tests/bpf/{globals,maps}.bpf.o``) loaded by
our loader on the host kernel, customised before load, run for real with
``BPF_PROG_TEST_RUN``, and every result read back from the kernel's maps and compared with
values computed here from the programs' C source (tests/bpf/globals.bpf.c, maps.bpf.c)."""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import pytest

from schedswitchd.bpf.customize import set_variable
from schedswitchd.bpf.object import open_object
from schedswitchd.bpf.spec import ObjectSpec
from schedswitchd.errors import BpfSyscallError
from schedswitchd.kernel import syscall
from schedswitchd.kernel.btf.registry import KernelBtfRegistry
from schedswitchd.kernel.fd import MapFd
from schedswitchd.kernel.loader import LoadedObject, load_object
from tests.build_outputs import built_object

pytestmark = pytest.mark.root

U64 = 1 << 64
KEY0 = struct.pack("<I", 0)


def _obj(name: str) -> ObjectSpec:
    return open_object(built_object(name))


def _load(spec: ObjectSpec, registry: KernelBtfRegistry, pin_root: Path) -> LoadedObject:
    return load_object(
        spec,
        registry.targets(spec.kmod_btfs),
        open_btf_object=registry.open_btf_object,
        pin_root=pin_root,
    )


def _u(obj: LoadedObject, name: str, fmt: str) -> tuple[int, ...]:
    return struct.unpack("<" + fmt, obj.read_variable(name))


# --- globals.bpf.c ---------------------------------------------------------------------------

NR_CPUS, WEIGHTS, TAG, SMALL = 64, (7, 8, 9), "rusty", 5
SLICE_NS = -5000000  # the object's default, left as is
INDICES = (0, 1, 2, 3, 6)  # ctx->idx of each run; the program uses idx & 3


def test_globals_run_with_customised_rodata(registry: KernelBtfRegistry, bpffs: Path) -> None:
    spec = _obj("globals")
    spec = set_variable(spec, "nr_cpus", NR_CPUS)
    spec = set_variable(spec, "weights", list(WEIGHTS))
    spec = set_variable(spec, "tag", TAG)
    spec = set_variable(spec, "small_u8", SMALL)
    with _load(spec, registry, bpffs) as obj:
        # the tunables reached the kernel's frozen .rodata map, which stays read-only
        assert _u(obj, "nr_cpus", "I") == (NR_CPUS,)
        assert _u(obj, "weights", "3H") == WEIGHTS
        with pytest.raises(BpfSyscallError):
            obj.write_variable("nr_cpus", struct.pack("<I", 1))
        prog = obj.programs["read_globals"].fd
        for idx in INDICES:
            res = syscall.prog_test_run(prog, ctx_in=struct.pack("<I", idx))
            assert res.retval == idx & 3
        n = len(INDICES)
        slots = [idx & 3 for idx in INDICES]
        step = [
            NR_CPUS + SLICE_NS + ord(TAG[0]) + SMALL + (WEIGHTS[i] if i < 3 else 0) for i in slots
        ]
        assert _u(obj, "counter", "Q") == ((42 + sum(step)) % U64,)
        assert _u(obj, "zeroed", "Q") == (n,)
        # struct stats { u64 enq; u32 disp; u8 kind; } (16 bytes with padding)
        assert _u(obj, "stats", "QIB3x") == (n, 9 * n, slots[-1])  # static_data = 9
        assert _u(obj, "signed_data", "i") == (-7 + 5 * n,)  # hidden_var = 5
        assert _u(obj, "cpu_loads", "Q") == (sum(slots),)  # .data.cpu_loads
        assert _u(obj, "cpu_ids", "4I") == tuple(i + 1 if i in slots else 0 for i in range(4))


def test_globals_rodata_bool_turns_code_off(registry: KernelBtfRegistry, bpffs: Path) -> None:
    spec = set_variable(_obj("globals"), "verbose", False)
    with _load(spec, registry, bpffs) as obj:
        assert (
            syscall.prog_test_run(obj.programs["read_globals"].fd, ctx_in=b"\x02\0\0\0").retval == 2
        )
        assert _u(obj, "counter", "Q") == (42,)  # `if (verbose)` skipped the update
        assert _u(obj, "zeroed", "Q") == (1,)
        assert _u(obj, "cpu_ids", "4I") == (0, 0, 3, 0)


def test_bss_set_before_load_is_written_as_a_prefix(
    registry: KernelBtfRegistry, bpffs: Path
) -> None:
    # Setting .bss variables keeps only the bytes up to the last one set (zeros after);
    # the loader writes that prefix through an mmap of the map, the rest stays the
    # kernel's zeros.
    spec = set_variable(_obj("globals"), "zeroed", 1000)
    spec = set_variable(spec, "cpu_ids", [0, 0, 0, 7])
    bss, ids = spec.map(".bss"), spec.map(".bss.cpu_ids")
    zeroed = bss.variable("zeroed")
    assert zeroed is not None and bss.data is not None
    assert len(bss.data) == zeroed.offset + 8 < bss.value_size
    assert ids.data is not None and len(ids.data) == ids.value_size == 16
    with _load(spec, registry, bpffs) as obj:
        assert _u(obj, "zeroed", "Q") == (1000,)
        assert _u(obj, "stats", "QIB3x") == (0, 0, 0)
        assert _u(obj, "cpu_ids", "4I") == (0, 0, 0, 7)
        syscall.prog_test_run(obj.programs["read_globals"].fd, ctx_in=struct.pack("<I", 1))
        assert _u(obj, "zeroed", "Q") == (1001,)
        assert _u(obj, "cpu_ids", "4I") == (0, 2, 0, 7)


# --- maps.bpf.c ------------------------------------------------------------------------------

ARGS = (1, 4, 2)  # ctx[0] (sched_switch's preempt) of each run
K_CALLS, K_RINGBUF_OK, K_BLOOM_HIT = 1, 2, 3


def _lookup(fd: MapFd, key: bytes, size: int) -> bytes | None:
    return syscall.map_lookup_elem(fd, key, size)


def _ringbuf_records(fd: MapFd, data_size: int) -> list[bytes]:
    """The committed records of a BPF ring buffer (kernel/bpf/ringbuf.c layout): page 0 holds
    the consumer position, page 1 the producer position, then the data area mapped twice.
    Each record has an 8-byte header (u32 length with BUSY/DISCARD bits, u32 page offset)
    and is padded to 8 bytes."""
    page = mmap.PAGESIZE
    with mmap.mmap(fd.fd, page, mmap.MAP_SHARED, mmap.PROT_READ) as cons:
        consumer = struct.unpack_from("<Q", cons, 0)[0]
    with mmap.mmap(fd.fd, page + 2 * data_size, mmap.MAP_SHARED, mmap.PROT_READ, offset=page) as m:
        producer = struct.unpack_from("<Q", m, 0)[0]
        out: list[bytes] = []
        pos = consumer
        while pos < producer:
            hdr = struct.unpack_from("<I", m, page + pos % data_size)[0]
            assert not hdr & (1 << 31), "record still busy"
            length = hdr & ~(3 << 30)
            if not hdr & (1 << 30):  # not discarded
                start = page + (pos + 8) % data_size
                out.append(bytes(m[start : start + length]))
            pos += (8 + length + 7) // 8 * 8
    return out


def test_maps_run_and_read_back(registry: KernelBtfRegistry, bpffs: Path) -> None:
    spec = _obj("maps")
    with _load(spec, registry, bpffs) as obj:
        # probe_sleep is in a '?' section: optional, tried, and this kernel accepts it
        assert set(obj.programs) == {"on_switch", "probe_sleep"}
        pin = bpffs / "pinned_array"
        assert pin.exists()
        for a in ARGS:
            assert (
                syscall.prog_test_run(
                    obj.programs["on_switch"].fd, ctx_in=struct.pack("<Q", a)
                ).retval
                == 0
            )
        n = len(ARGS)
        m = {name: lm.fd for name, lm in obj.maps.items()}

        def count(key: int) -> int | None:
            v = _lookup(m["counts"], struct.pack("<I", key), 8)
            return None if v is None else struct.unpack("<Q", v)[0]

        assert count(K_CALLS) == sum(ARGS)
        assert count(K_RINGBUF_OK) == n
        assert count(K_BLOOM_HIT) == n  # bpf_map_peek_elem finds what was pushed
        assert count(0) is None and count(4) is None
        # struct pair { u64 a; u32 b; } at key 1, read through the pin too
        pair = struct.pack("<QI4x", 10 * n, n)
        assert _lookup(m["pinned_array"], struct.pack("<I", 1), 16) == pair
        with syscall.obj_get(pin, expect=MapFd) as pinned:
            assert _lookup(pinned, struct.pack("<I", 1), 16) == pair
            assert _lookup(pinned, KEY0, 16) == bytes(16)
        # .values put inner_b in slot 0 and inner_a in slot 2; slot 1 stayed empty
        assert _lookup(m["inner_b"], KEY0, 4) == struct.pack("<I", n)
        assert _lookup(m["inner_a"], KEY0, 4) == struct.pack("<I", 100 * n)
        slot = {k: _lookup(m["outer"], struct.pack("<I", k), 4) for k in range(3)}
        assert slot == {
            0: struct.pack("<I", obj.maps["inner_b"].id),
            1: None,
            2: struct.pack("<I", obj.maps["inner_a"].id),
        }
        assert _lookup(m["lru"], struct.pack("<I", 1), 4) == struct.pack("<I", ARGS[-1])
        # per-CPU value { u64 runs; u64 first_arg } under the 8-byte key 7, summed over CPUs
        raw = _lookup(m["percpu"], struct.pack("<Q", 7), syscall.percpu_value_size(16))
        assert raw is not None
        cells = [struct.unpack_from("<QQ", raw, off) for off in range(0, len(raw), 16)]
        assert sum(c[0] for c in cells) == n
        assert sum(c[1] for c in cells) == ARGS[0]
        assert _ringbuf_records(m["events"], 4096) == [struct.pack("<I", 1)] * n
    assert pin.exists()  # pinned maps outlive the object
