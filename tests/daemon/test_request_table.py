"""The protocol's requests come from one table, ``launcher_wire.REQUESTS``: a request added
in one place and not the others fails here, naming the place.

Derived from the table (so they cannot drift): ``protocol.REQUEST_MODELS``, the unknown-op
error's list, ``protocol.ADMIN_OPS`` and ``schedswitchctl``'s daemon commands. Checked
against it: the models of ``protocol.Request``, the server's dispatch (a live server answers
each request of the table as that request, never ``internal``), the commands
``schedswitchctl`` registers and the protocol's documentation.
"""

from __future__ import annotations

import os
from typing import Any, get_args

import pytest

from schedswitchd.cli import ctl
from schedswitchd.daemon import protocol
from schedswitchd.daemon.launcher_wire import DENIED, REQUESTS

from .harness import Running

#: A request of each kind, as a client sends it (without ``v``).
EXAMPLES: dict[str, dict[str, Any]] = {
    "hint": {"workload": "gaming", "ttl_s": 5},
    "prepare": {"workload": "gaming", "ttl_s": 5},
    "release": {"lease": "no-such-lease"},
    "status": {},
    "list": {},
    "history": {"limit": 3},
    "switch": {"scheduler": "auto"},
    "stop": {},
    "reload": {},
    "watch": {},
}


def test_the_request_models_are_the_tables() -> None:
    """``protocol.Request``'s members are the table's requests, one model each."""
    models = get_args(get_args(protocol.Request)[0])
    by_op = {cls.model_fields["op"].default: cls for cls in models}
    assert len(by_op) == len(models), "two request models share an op"
    assert set(by_op) == set(REQUESTS), (
        f"protocol.Request's models {sorted(by_op)} are not launcher_wire.REQUESTS "
        f"{sorted(REQUESTS)}: add the request to the table, or its model to protocol.Request"
    )
    assert by_op == protocol.REQUEST_MODELS
    assert set(REQUESTS.values()) <= {"anyone", "admin"}
    assert {op for op, who in REQUESTS.items() if who == "admin"} == protocol.ADMIN_OPS


def test_an_unknown_op_lists_the_tables_requests() -> None:
    with pytest.raises(protocol.RequestError) as caught:
        protocol.parse_request(b'{"v":1,"op":"nosuch"}')
    assert caught.value.code == protocol.UNKNOWN_OP
    assert str(caught.value).endswith(", ".join(REQUESTS))


def test_every_request_has_an_example_that_parses() -> None:
    assert set(EXAMPLES) == set(REQUESTS), "add an example of the new request to EXAMPLES"
    for op, fields in EXAMPLES.items():
        line = protocol.encode(protocol.REQUEST_MODELS[op](**fields))
        assert type(protocol.parse_request(line)) is protocol.REQUEST_MODELS[op]


def test_the_server_answers_every_request_of_the_table(srv: Running) -> None:
    """Each request of the table, sent to a live server, is answered as that request: a reply
    echoing its ``op``, successful or a typed refusal, never ``internal`` (what a request
    the server's dispatch does not handle gets) or ``unknown_op``. Run by a non-admin, an
    admin request is refused with ``denied`` (the admin check follows the table too)."""
    admin = os.geteuid() == 0  # the harness's [auth] admin_uids = [0]
    for op in REQUESTS:
        client = srv.client()
        try:
            reply = client.request(op=op, **EXAMPLES[op])
        finally:
            client.close()
        assert reply.get("op") == op, f"{op}: {reply}"
        if reply["ok"]:
            continue
        code = reply["error"]["code"]
        assert code not in (protocol.INTERNAL, protocol.UNKNOWN_OP), (
            f"the server does not handle {op!r} (a request of launcher_wire.REQUESTS): {reply}"
        )
        if REQUESTS[op] == "admin" and not admin:
            assert code == DENIED, reply


def test_schedswitchctl_has_a_command_per_request() -> None:
    """``schedswitchctl``'s daemon commands are the table's requests (ctl derives its daemon
    family from it; this checks that ``daemon_cmds`` registers each)."""
    parser = ctl.build_parser(["status"])
    commands = next(
        set(action.choices or ())
        for action in parser._actions
        if action.__class__.__name__ == "_SubParsersAction"
    )
    assert set(REQUESTS) <= commands, sorted(set(REQUESTS) - commands)


def test_the_protocols_documentation_shows_every_request() -> None:
    doc = protocol.__doc__ or ""
    missing = [op for op in REQUESTS if f'"op":"{op}"' not in doc]
    assert not missing, f"schedswitchd/daemon/protocol.py's docstring does not show {missing}"
