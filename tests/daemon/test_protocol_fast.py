"""The protocol's fast paths give what the general ones give, for every line.

``parse_request`` skips its full duplicate-key check (a JSON decode in Python) and its
envelope (a second decode) when a line that validated provably holds no key twice
(:func:`protocol._keys_once`) and its ``v`` is the integer 1 (``protocol._V_IS_1``);
``parse_reply``
validates a successful reply straight from the bytes. Each is compared here with the
general way -- the order ``parse_request`` had before (envelope, duplicate check,
validation), and ``_parse_reply_general`` -- on requests and replies with repeated keys
(also escaped: ``"\\u006fp"`` is ``"op"``), keys inside values, unknown keys, other
spacing, ``NaN`` and bad values: same model, or the same error (code, message, op, id).
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedswitchd.daemon import protocol
from schedswitchd.daemon.launcher_wire import DENIED, REQUESTS
from schedswitchd.errors import ProtocolError
from tests import fuzzing


def _request_reference(line: bytes, max_bytes: int = 4096) -> protocol.Request:
    """parse_request as it was: the full duplicate check before the validation."""
    if len(line) > max_bytes:
        raise protocol.RequestError(protocol.TOO_LARGE, f"request longer than {max_bytes} bytes")
    op, tag, version = protocol._envelope(line)
    try:
        protocol._refuse_duplicate_keys(line)
        request = protocol._validate(line)
    except protocol.RequestError as exc:
        exc.op, exc.id = op, tag
        raise
    if type(version) is not int or version != protocol.VERSION:
        raise protocol.RequestError(
            protocol.UNSUPPORTED_VERSION,
            f"'v' must be the integer {protocol.VERSION}: this daemon speaks protocol "
            f"v{protocol.VERSION}",
            op=op,
            id=tag,
        )
    return request


def _outcome(fn: Any, line: bytes) -> tuple[str, Any]:
    try:
        return "ok", fn(line)
    except protocol.RequestError as exc:
        return "error", (exc.code, str(exc), exc.op, exc.id)


def _same_request(line: bytes) -> None:
    assert _outcome(protocol.parse_request, line) == _outcome(_request_reference, line), line


KEYS = ["v", "op", "id", "workload", "pid", "ttl_s", "lease", "scheduler", "limit", "extra"]
VALUES = st.sampled_from(
    [
        1,
        2,
        True,
        1.0,
        "hint",
        "status",
        "release",
        "switch",
        "gaming",
        "kernel",
        "3-ab",
        7,
        0,
        -1,
        1.5,
        None,
        "x" * 70,
        "Bad Name",
        '"op"',
        'say "op":"stop"',
        [1],
        {"op": "stop"},
    ]
)


def _escaped(key: str) -> str:
    """``key`` as a JSON string with its first letter written as a ``\\u`` escape."""
    return '"' + (f"\\u{ord(key[0]):04x}" + key[1:] if key else "") + '"'


@st.composite
def request_lines(draw: st.DrawFn) -> bytes:
    """A request-like object written by hand: keys may repeat, be escaped or spaced."""
    op = draw(st.sampled_from(["hint", "status", "release", "switch", "history", "nope"]))
    v = draw(st.sampled_from([1, 1, 1, True, 2, 1.0, 10, "1", None]))
    pairs: list[tuple[str, Any]] = [("op", op)] + ([] if v is None else [("v", v)])
    pairs += draw(st.lists(st.tuples(st.sampled_from(KEYS), VALUES), max_size=4))
    if draw(st.booleans()):
        pairs.append(draw(st.sampled_from(pairs)))  # one key again (maybe the same value)
    draw(st.randoms()).shuffle(pairs)
    sep = draw(st.sampled_from([",", ", ", " ,\n"]))
    colon = draw(st.sampled_from([":", ": ", " : "]))
    escape = draw(st.sets(st.integers(0, len(pairs) - 1), max_size=2))
    body = sep.join(
        (_escaped(k) if i in escape else json.dumps(k)) + colon + json.dumps(v)
        for i, (k, v) in enumerate(pairs)
    )
    return ("{" + body + "}").encode()


@settings(max_examples=fuzzing.examples(400), deadline=None)
@given(request_lines())
def test_parse_request_agrees_with_the_full_check(line: bytes) -> None:
    _same_request(line)


@pytest.mark.parametrize(
    "line",
    [
        b'{"v":1,"op":"hint","workload":"gaming"}',
        b'{"v":1,"op":"hint","workload":"gaming","workload":"battery"}',
        b'{"v":1,"op":"status","op":"stop"}',
        b'{"v":1,"op":"status","\\u006fp":"stop"}',  # the same key, escaped
        b'{"v":1,"op":"status","id":"\\"op\\":"}',  # a backslash: the full check decides
        b'{"v":1,"op":"status","id":"\\"op\\""}',
        b'{"v":1,"op":"status","id":"op"}',
        b'{"v":1,"op":"hint","workload":"a","id":"\\"workload\\""}',
        b'{"v":1,"op":"stop","v":1}',
        b'{"v":1,"op":"status","extra":{"a":1,"a":2}}',  # a repeat inside an unknown value
        b'{"v":true,"op":"status"}',
        b'{"op":"status"}',
        b'{"v":1,"op":"hint","workload":"a","ttl_s":NaN}',
        # v read from the bytes on the fast path: only the JSON integer 1 is v 1
        b'{"v":1.0,"op":"status"}',
        b'{"v":1e0,"op":"status"}',
        b'{"v":10,"op":"status"}',
        b'{"v":11,"op":"status","id":1}',
        b'{"v" :\n 1 ,"op":"status"}',
        b'{"op":"status","v":1}',
        b'{"v":"1","op":"status"}',
        b'{"op":"status","id":"v"}',  # "v" only as a value: no v on the wire
        b'{"id":"v","op":"status","v":1}',
        b'{"v":-1,"op":"status"}',
    ],
)
def test_parse_request_examples_agree(line: bytes) -> None:
    _same_request(line)


def test_a_clean_request_takes_the_fast_path_and_a_repeat_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[bytes] = []
    full = protocol._refuse_duplicate_keys

    def counting(line: bytes) -> None:
        calls.append(line)
        full(line)

    monkeypatch.setattr(protocol, "_refuse_duplicate_keys", counting)
    assert isinstance(protocol.parse_request(b'{"v":1,"op":"hint","workload":"a"}'),
                      protocol.HintRequest)  # fmt: skip
    assert calls == []
    with pytest.raises(protocol.RequestError, match="duplicate key 'op'"):
        protocol.parse_request(b'{"v":1,"op":"status","op":"stop"}')
    with pytest.raises(protocol.RequestError, match="duplicate key 'op'"):
        protocol.parse_request(b'{"v":1,"op":"status","\\u006fp":"stop"}')
    assert len(calls) == 2


def test_every_request_model_has_its_keys_listed() -> None:
    names = set(REQUESTS)
    listed = {cls.model_fields["op"].default for cls in protocol._QUOTED_FIELDS}
    assert listed == names
    for cls, keys in protocol._QUOTED_FIELDS.items():
        assert set(keys) == {f'"{k}"'.encode() for k in cls.model_fields}


# --- replies ---------------------------------------------------------------------------------


def _reply_outcome(fn: Any, line: bytes) -> tuple[str, Any]:
    try:
        reply = fn(line)
    except ProtocolError as exc:
        return "error", str(exc)
    # By their encoding: NaN is not equal to itself, the models would differ.
    return type(reply).__name__, protocol.encode(reply)


def _same_reply(line: bytes) -> None:
    fast = _reply_outcome(protocol.parse_reply, line)
    assert fast == _reply_outcome(protocol._parse_reply_general, line), line


def _replies() -> list[protocol.Reply]:
    switch = protocol.SwitchInfo(
        seq=3, time=1.5, previous="fifo", target="gaming", result="ok", reason="lease 1-a",
        phases_ns={"detach": 1, "attach": 2}, gap_ns=7, standby=True, finished=False,
        exit=protocol.ExitInfo(kind=1024, reason="x"),
    )  # fmt: skip
    status = protocol.StatusBody(
        kernel=protocol.KernelInfo(state="enabled", ops="fifo", enable_seq=3),
        active="fifo", desired="fifo", last_switch=switch, pid=1, version="0", uptime_s=1.0,
        standby=[protocol.StandbyInfo(scheduler="gaming", reason="default", kernel_bytes=4,
                                      prepare_ms=1.0, age_s=2.0)],
    )  # fmt: skip
    return [
        protocol.HintReply(
            id=4, lease="1-a", scheduler="gaming", desired="gaming", active="gaming", switch=switch
        ),
        protocol.HintReply(lease="1-a", desired="fifo", active="fifo", pending=True),
        protocol.PrepareReply(
            workload="gaming", scheduler="gaming", active="fifo", kernel_bytes=4096, until_s=3.0
        ),
        protocol.ReleaseReply(lease="1-a", active="kernel"),
        protocol.StatusReply(id="t", status=status),
        protocol.HistoryReply(entries=[switch, switch]),
        protocol.SwitchReply(op="stop", active="kernel"),
        protocol.ReloadReply(schedulers=["fifo"]),
        protocol.LeaseEnded(lease="1-a", why="ttl"),
        protocol.error_reply(DENIED, "no", op="hint", id="x", verifier_log="R1"),
        protocol.error_reply(protocol.BAD_JSON, "bad"),
    ]


def _mutations(data: dict[str, Any], rng: random.Random) -> list[bytes]:
    """The reply's line, and variants of it: spaced, ``ok`` changed or gone, a key
    repeated, a field dropped or of another type, an unknown key, NaN."""
    text = json.dumps(data, separators=(",", ":"))
    out = [text, json.dumps(data)]
    for old, new in [
        ('"ok":true', '"ok":false'),
        ('"ok":false', '"ok":true'),
        ('"ok":true,', ""),
        ('"ok":true', '"ok":1'),
        ('"ok":true', '"ok": false'),
    ]:
        out.append(text.replace(old, new))
    out += [text[:-1] + more for more in (',"ok":false}', ',"extra":1}', ',"v":2}')]
    for key in list(data):
        out.append(json.dumps({k: v for k, v in data.items() if k != key}))
        out.append(text[:-1] + f",{json.dumps(key)}:{json.dumps(data[key])}}}")
        out.append(json.dumps({**data, key: rng.choice([None, 1, "x", 1.5, [], {}, True])}))
    out.append(text.replace("1.5", "NaN"))
    return [line.encode() for line in out]


def test_parse_reply_agrees_with_the_general_way() -> None:
    rng = random.Random(15)
    for reply in _replies():
        data = json.loads(protocol.encode(reply))
        for line in _mutations(data, rng):
            _same_reply(line)
        for inner in ("switch", "status", "entries", "error"):
            if isinstance(data.get(inner), dict):
                for key in list(data[inner]):
                    _same_reply(json.dumps({**data, inner: {
                        k: v for k, v in data[inner].items() if k != key}}).encode())  # fmt: skip


@settings(max_examples=fuzzing.examples(300), deadline=None)
@given(st.binary(max_size=300) | st.sampled_from([b"{", b"[]", b"null", b'{"ok":true}']))
def test_parse_reply_agrees_on_any_bytes(line: bytes) -> None:
    _same_reply(line)


def test_a_successful_reply_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bytes] = []
    general = protocol._parse_reply_general

    def counting(line: bytes) -> protocol.Reply:
        calls.append(line)
        return general(line)

    monkeypatch.setattr(protocol, "_parse_reply_general", counting)
    ok, error = _replies()[0], _replies()[-2]
    assert protocol.parse_reply(protocol.encode(ok)) == ok
    assert calls == []
    assert protocol.parse_reply(protocol.encode(error)) == error
    assert len(calls) == 1


# --- encode ----------------------------------------------------------------------------------


def _encode_general(message: Any) -> bytes:
    """encode as it was: through model_dump_json's str."""
    return str(message.model_dump_json(exclude_none=False)).encode() + b"\n"


def test_encode_writes_what_model_dump_json_writes() -> None:
    requests = [
        protocol.HintRequest(workload="gaming", pid=7, ttl_s=1.5, id="t"),
        protocol.PrepareRequest(workload="gaming"),
        protocol.StatusRequest(),
        protocol.SwitchRequest(scheduler="kernel", id=3),
    ]
    for message in [*requests, *_replies()]:
        assert protocol.encode(message) == _encode_general(message)


@settings(max_examples=fuzzing.examples(200), deadline=None)
@given(st.text(max_size=30), st.floats(allow_nan=True), st.integers(-(1 << 70), 1 << 70))
def test_encode_agrees_on_any_text_and_numbers(text: str, number: float, big: int) -> None:
    exit_info = protocol.ExitInfo(kind=big, reason=text, message=text + "\n")
    switch = protocol.SwitchInfo(
        seq=1, time=number, previous=text, target="fifo", result="ok", reason=text,
        phases_ns={text: 1}, exit=exit_info,
    )  # fmt: skip
    for message in (switch, protocol.HistoryReply(entries=[switch]),
                    protocol.error_reply(protocol.INTERNAL, text, verifier_log=text)):  # fmt: skip
        line = protocol.encode(message)
        assert line == _encode_general(message)
        assert line.count(b"\n") == 1


def test_a_line_parsed_lately_gives_the_same_model_again() -> None:
    """Untagged hint/prepare/status/list lines are kept by their bytes (a launcher sends
    the same line each time); what comes back equals a fresh parse; tagged requests,
    other ops and refused lines are not kept; the lines kept are bounded; the size bound
    is checked before."""
    protocol._PARSED.clear()
    line = b'{"v":1,"op":"hint","workload":"gaming"}'
    first = protocol.parse_request(line)
    assert protocol.parse_request(line) is first
    assert first == protocol._parse_request(line)
    for other in (
        b'{"v":1,"op":"status","id":3}',
        b'{"v":1,"op":"release","lease":"3-ab"}',
        b'{"v":1,"op":"switch","scheduler":"fifo"}',
    ):
        assert protocol.parse_request(other) is not protocol.parse_request(other)
    for bad in (b'{"v":1,"op":"status","op":"stop"}', b'{"v":2,"op":"status"}'):
        for _ in range(2):
            with pytest.raises(protocol.RequestError):
                protocol.parse_request(bad)
    assert protocol._PARSED.ordered_keys() == [line]
    with pytest.raises(protocol.RequestError, match="longer than 10 bytes"):
        protocol.parse_request(line, max_bytes=10)
    for n in range(protocol.PARSED_LINES_MAX + 5):
        protocol.parse_request(f'{{"v":1,"op":"hint","workload":"w{n}"}}'.encode())
    assert len(protocol._PARSED) == protocol.PARSED_LINES_MAX
    assert line not in protocol._PARSED  # the least recently used went first
    protocol._PARSED.clear()


@settings(max_examples=fuzzing.examples(200), deadline=None)
@given(request_lines())
def test_a_repeated_line_parses_as_it_did_the_first_time(line: bytes) -> None:
    for _ in range(2):
        try:
            got: object = protocol.parse_request(line)
        except protocol.RequestError as exc:
            got = (exc.code, str(exc), exc.op, exc.id)
        try:
            want: object = protocol._parse_request(line)
        except protocol.RequestError as exc:
            want = (exc.code, str(exc), exc.op, exc.id)
        assert got == want


_text = st.text(st.characters(codec="utf-8"), max_size=70)  # no lone surrogates
_records = st.builds(
    protocol.SwitchInfo,
    seq=st.integers(0, 2**63),
    time=st.floats(allow_nan=False, allow_infinity=False),
    previous=_text,
    target=_text,
    result=_text,
    reason=_text,
    phases_ns=st.dictionaries(_text, st.integers(-(2**63), 2**63 - 1), max_size=6),
    gap_ns=st.none() | st.integers(0, 2**63),
    expedited=st.booleans(),
    standby=st.booleans(),
    finished=st.booleans(),
)


@settings(max_examples=400, deadline=None)
@given(
    tag=st.none()
    | st.integers(-(2**63), 2**63)
    | st.text(st.characters(codec="utf-8"), max_size=64),
    lease=_text,
    scheduler=st.none() | _text,
    desired=_text,
    active=_text,
    record=_records,
    pending=st.booleans(),
)
def test_a_standby_hits_line_is_the_models(
    tag: int | str | None,
    lease: str,
    scheduler: str | None,
    desired: str,
    active: str,
    record: protocol.SwitchInfo,
    pending: bool,
) -> None:
    """encode_hint_hit writes what encode writes for the same HintReply, byte for byte: a
    field added to HintReply (or its order changed) fails this."""
    model = protocol.HintReply(
        id=tag,
        lease=lease,
        scheduler=scheduler,
        desired=desired,
        active=active,
        switch=record,
        pending=pending,
    )
    fast = protocol.encode_hint_hit(tag, lease, scheduler, desired, active, record, pending)
    assert fast == protocol.encode(model)
    assert protocol.parse_reply(fast) == model
