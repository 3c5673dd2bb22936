"""Protocol: request parsing (examples + hypothesis on arbitrary bytes/JSON) and replies."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedswitchd.daemon import protocol
from schedswitchd.daemon.launcher_wire import DENIED, REQUESTS
from schedswitchd.errors import ProtocolError
from tests import fuzzing


def req(**fields: Any) -> bytes:
    return json.dumps({"v": 1, **fields}).encode() + b"\n"


def code_of(line: bytes, max_bytes: int = 4096) -> str:
    with pytest.raises(protocol.RequestError) as exc:
        protocol.parse_request(line, max_bytes)
    return exc.value.code


def test_each_request_parses() -> None:
    assert protocol.parse_request(
        req(op="hint", workload="gaming", pid=7, ttl_s=1.5)
    ) == protocol.HintRequest(workload="gaming", pid=7, ttl_s=1.5)
    assert isinstance(
        protocol.parse_request(req(op="release", lease="3-ab")), protocol.ReleaseRequest
    )
    for op, cls in [
        ("status", protocol.StatusRequest),
        ("list", protocol.ListRequest),
        ("history", protocol.HistoryRequest),
        ("stop", protocol.StopRequest),
        ("reload", protocol.ReloadRequest),
    ]:
        assert isinstance(protocol.parse_request(req(op=op, id="tag")), cls)
    assert protocol.parse_request(req(op="switch", scheduler="kernel")) == protocol.SwitchRequest(
        scheduler="kernel"
    )
    # ttl_s accepts a JSON integer
    assert protocol.parse_request(req(op="hint", workload="a", ttl_s=3)).ttl_s == 3  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b"{", protocol.BAD_JSON),
        (b"\xff\xfe", protocol.BAD_JSON),
        (b"[" * 3000, protocol.BAD_JSON),  # deep nesting: refused, no RecursionError
        (b"[]", protocol.BAD_REQUEST),
        (b'"hint"', protocol.BAD_REQUEST),
        (req(op="nope"), protocol.UNKNOWN_OP),
        (b'{"v":1}', protocol.UNKNOWN_OP),
        (json.dumps({"v": 2, "op": "status"}).encode(), protocol.UNSUPPORTED_VERSION),
        (req(op="hint"), protocol.BAD_REQUEST),  # workload missing
        (req(op="hint", workload="Gaming"), protocol.BAD_REQUEST),  # not a name
        (req(op="hint", workload="../../etc"), protocol.BAD_REQUEST),
        (req(op="hint", workload="a", pid="12"), protocol.BAD_REQUEST),  # strict: no coercion
        (req(op="hint", workload="a", pid=True), protocol.BAD_REQUEST),
        (req(op="hint", workload="a", pid=0), protocol.BAD_REQUEST),
        (req(op="hint", workload="a", pid=1 << 40), protocol.BAD_REQUEST),
        (req(op="hint", workload="a", ttl_s=-1), protocol.BAD_REQUEST),
        (req(op="hint", workload="a", args=["--evil"]), protocol.BAD_REQUEST),  # no free-form
        (req(op="switch", scheduler="/tmp/x.bpf.o"), protocol.BAD_REQUEST),  # no paths
        (req(op="release", lease=""), protocol.BAD_REQUEST),
        (req(op="status", id="x" * 65), protocol.BAD_REQUEST),
    ],
)
def test_bad_requests(line: bytes, code: str) -> None:
    assert code_of(line, 10000) == code


def test_size_cap_checked_before_decoding() -> None:
    line = req(op="status", id="x" * 50)
    assert code_of(line, len(line) - 1) == protocol.TOO_LARGE
    assert isinstance(protocol.parse_request(line, len(line)), protocol.StatusRequest)


def test_request_error_is_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        protocol.parse_request(b"nonsense")


def test_replies_round_trip() -> None:
    switch = protocol.SwitchInfo(
        seq=1,
        time=1.0,
        previous="kernel",
        target="fifo",
        result="ok",
        reason="lease",
        phases_ns={"prepare": 5},
        gap_ns=3,
    )
    status = protocol.StatusBody(
        kernel=protocol.KernelInfo(state="enabled", ops="fifo", enable_seq=3),
        active="fifo",
        desired="fifo",
        last_switch=switch,
        pid=1,
        version="0",
        uptime_s=1.0,
    )
    replies: list[protocol.Reply] = [
        protocol.HintReply(id=4, lease="1-a", desired="fifo", active="fifo", switch=switch),
        protocol.ReleaseReply(lease="1-a", active="kernel"),
        protocol.StatusReply(status=status),
        protocol.ListReply(default="kernel", schedulers=[], hints=[], leases=[]),
        protocol.HistoryReply(entries=[switch]),
        protocol.SwitchReply(op="stop", active="kernel"),
        protocol.ReloadReply(schedulers=["fifo"]),
        protocol.error_reply(DENIED, "no", op="switch", id="x", verifier_log="R1 invalid"),
    ]
    for reply in replies:
        line = protocol.encode(reply)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert protocol.parse_reply(line) == reply


def test_parse_reply_rejects_garbage() -> None:
    for line in [b"{", b"[]", b'{"v":1,"ok":true,"op":"nope"}', b'{"v":1,"ok":false}']:
        with pytest.raises(ProtocolError):
            protocol.parse_reply(line)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=20,
)
near_requests = st.fixed_dictionaries(
    {"v": st.sampled_from([1, 1, 2, "1", None]), "op": st.sampled_from([*REQUESTS, "x", 3])},
    optional={
        "workload": st.text(max_size=40) | json_values,
        "pid": st.integers(-5, 1 << 33) | json_values,
        "ttl_s": st.floats() | json_values,
        "lease": st.text(max_size=70),
        "scheduler": st.text(max_size=40),
        "id": json_values,
        "extra": json_values,
    },
)


def _check(line: bytes) -> None:
    try:
        _check_line(line)
    except BaseException as exc:
        fuzzing.record("protocol:parse", f"defect:{fuzzing.exception_name(exc)}")
        raise


@pytest.fixture(scope="module", autouse=True)
def _fuzz_stats() -> Iterator[None]:
    yield
    fuzzing.flush()


def _check_line(line: bytes) -> None:
    try:
        parsed = protocol.parse_request(line, 4096)
    except protocol.RequestError as exc:
        fuzzing.record("protocol:parse", f"RequestError:{exc.code}")
        assert exc.code in {
            protocol.TOO_LARGE,
            protocol.BAD_JSON,
            protocol.BAD_REQUEST,
            protocol.UNKNOWN_OP,
            protocol.UNSUPPORTED_VERSION,
        }
        assert str(exc)
        # the error reply itself always encodes to one well-formed line
        assert (
            protocol.parse_reply(protocol.encode(protocol.error_reply(exc.code, str(exc)))).ok
            is False
        )
        return
    assert parsed.v == 1
    # what parsed re-encodes to something that parses to the same request
    assert protocol.parse_request(protocol.encode(parsed), 1 << 20) == parsed
    fuzzing.record("protocol:parse", "parsed")


@settings(max_examples=fuzzing.examples(300), deadline=None)
@given(st.binary(max_size=5000))
def test_arbitrary_bytes_never_crash(line: bytes) -> None:
    _check(line)


@settings(max_examples=fuzzing.examples(300), deadline=None)
@given(json_values)
def test_arbitrary_json_never_crashes(value: object) -> None:
    _check(json.dumps(value).encode())


@settings(max_examples=fuzzing.examples(300), deadline=None)
@given(near_requests)
def test_near_requests_never_crash(value: dict[str, object]) -> None:
    _check(json.dumps(value).encode())


@pytest.mark.parametrize(
    "fields",
    [{"op": "status"}, {"v": True, "op": "status"}, {"v": 1.0, "op": "status"}],
)
def test_version_must_be_the_integer_1(fields: dict[str, object]) -> None:
    with pytest.raises(protocol.RequestError) as info:
        protocol.parse_request(json.dumps({**fields, "id": 7}).encode())
    assert info.value.code == protocol.UNSUPPORTED_VERSION
    assert (info.value.op, info.value.id) == ("status", 7)


def test_errors_carry_the_readable_op_and_id() -> None:
    with pytest.raises(protocol.RequestError) as info:
        protocol.parse_request(req(op="hint", id="t1", workload="Bad Name"))
    assert (info.value.code, info.value.op, info.value.id) == (protocol.BAD_REQUEST, "hint", "t1")
    with pytest.raises(protocol.RequestError) as info:
        protocol.parse_request(req(op="nope", id=True))  # unknown op, bool is not a tag
    assert (info.value.op, info.value.id) == (None, None)
