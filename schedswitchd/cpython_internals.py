"""The CPython internals the client commands lean on to start fast, each named once here
with the fallback that keeps the command correct when CPython moves it.

``schedswitch-run`` (start to the command's exec) and ``schedswitchctl status`` have time
budgets (docs/performance.md, "Launch line" and "`schedswitchctl status`"). Each trick below
swaps a public module for the C core under it, or for not importing anything: the public
modules import ``enum``, ``re``, ``functools``, ``collections`` or ``typing``, which are most
of such a start. A trick leans on something CPython does not promise (a private module's
names, a private scanner's settings), so a later CPython can take it away; then the fallback
runs, correct and slower, and nothing else would say so. :data:`FALLBACKS` names the tricks
whose fallback runs in this interpreter, and ``tests/test_cpython_internals.py`` has a test
per trick that fails, naming the trick and what moved, when its fallback runs or when the
launch line imports what the trick keeps out (:data:`KEPT_OUT`).

This module is on the launch line itself: it imports C cores alone (never ``typing``,
``asyncio``, ``json``, ``socket`` or ``signal`` at import time), and a trick of the daemon's
takes the objects it works on as arguments.

The tricks:

* ``typing`` not imported at run time: :data:`TYPE_CHECKING` (``False``; mypy and ruff read
  ``if TYPE_CHECKING:`` blocks as ``typing.TYPE_CHECKING`` ones, by the name), with string
  annotations (PEP 563).
* ``json``'s C core: :data:`JSON_SCANNER`, the scanner ``json.loads`` runs, set up as
  ``json.loads`` sets it up, and :func:`json_quote`, the string quoting ``json.dumps`` runs.
* ``socket``'s C core: :func:`unix_stream_socket` and the constants a client uses.
* ``struct``'s C core: :func:`struct_pack` (``Lib/struct.py`` only re-exports ``_struct``;
  one module file fewer to read at start).
* ``signal``'s C core, which every interpreter loads at start: the signal numbers a launcher
  forwards or resets and :func:`set_signal_handler`.
* The daemon's accept (:mod:`schedswitchd.daemon.acceptor`): :func:`make_socket_transport`,
  asyncio's selector transport for a socket the daemon accepted itself, made by the selector
  loop's private ``_make_socket_transport`` (no public call makes one); where the loop has
  none (:func:`has_socket_transport` False) the daemon serves with asyncio's own accept.
* A closed connection freed at once (:mod:`schedswitchd.daemon.connection`):
  :func:`release_transport` clears the selector transport's read callback, a bound method
  of its own that keeps it, its socket and its protocol in a reference cycle until the
  cyclic collector runs.
* The daemon's accept itself (:mod:`schedswitchd.daemon.passed_fds`): :func:`accept_fd`,
  ``accept4(2)`` through ``_socket.socket._accept``, which ``socket.socket.accept`` calls
  and then wraps in a socket object of its own (with its family and type looked up as
  enums): the daemon makes the one socket object it keeps, from the descriptor.
* Whether a client took its reply (:mod:`schedswitchd.daemon.reply_gate`,
  :mod:`schedswitchd.daemon.acceptor`): :func:`unread_bytes`, ``SIOCOUTQ`` polled on the
  connection's socket (``fcntl.ioctl``; imported when first called, off the launch line).
* A reader paused without waking its loop (:mod:`schedswitchd.kernel.uevents`):
  :func:`loop_epoll`, the selector loop's ``selectors.EpollSelector`` and the
  ``select.epoll`` under it (both private attributes, ``_selector``), so that another thread
  can set one file descriptor's events with ``epoll_ctl(2)``; where the loop has none, the
  pause falls back to waking the reader's thread into a bounded hold.
* No ``argparse`` on the usual command lines: ``schedswitchd.cli.run._quick_parse`` and
  ``schedswitchd.cli.ctl._quick_parse`` read them by hand and give anything else to
  argparse (their tests check that both read the same); :data:`KEPT_OUT` ``"argv"``.
"""

from __future__ import annotations

import _json
import _socket
import _struct

#: ``typing.TYPE_CHECKING`` without importing ``typing`` (``False`` at run time; type
#: checkers treat a block under any name ``TYPE_CHECKING`` as checked).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType, ModuleType
    from typing import Any

#: The tricks whose fallback runs in this interpreter (names as in :data:`KEPT_OUT`) -> what
#: moved: each means CPython took away what the trick leans on, and the commands start slower
#: than their budgets were measured with. Empty on the CPython the budgets were measured on.
FALLBACKS: dict[str, str] = {}

#: The public module each trick keeps out of ``sys.modules`` on the launch line and in
#: ``status``: trick -> module name. ``tests/test_cpython_internals.py`` runs both lines and
#: checks each (what those modules import in turn: ``tests/cli/test_cli_light.py``).
KEPT_OUT: dict[str, str] = {
    "typing": "typing",
    "json": "json",
    "socket": "socket",
    "struct": "struct",
    "signal": "signal",
    "argv": "argparse",
}


def _public(name: str) -> ModuleType:
    """The public module ``name``, imported now (a fallback's cost, paid only then)."""
    return __import__(name)


# --- json ------------------------------------------------------------------------------

_CONSTANTS = {"-Infinity": -float("inf"), "Infinity": float("inf"), "NaN": float("nan")}


class JsonDecoderSettings:
    """What ``json.loads`` gives json's C scanner: the attributes of
    ``json.decoder.JSONDecoder()`` that ``Modules/_json.c``'s ``scanner_new`` reads (strict
    strings, plain dicts, ``int`` and ``float``, ``NaN`` and the infinities). A CPython whose
    decoder grows an attribute the scanner reads fails the test of this trick."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    array_hook = None  # read from Python 3.15 on
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


def _json_scanner() -> Callable[[str, int], tuple[Any, int]] | None:
    try:
        return _json.make_scanner(JsonDecoderSettings())  # type: ignore[arg-type]
    except (AttributeError, TypeError) as exc:  # a later CPython's scanner wants more
        FALLBACKS["json"] = f"_json.make_scanner(JsonDecoderSettings()) raised {exc!r}"
        return None


#: ``scan(text, index) -> (value, end)``: json's C scanner as ``json.loads`` sets it up, or
#: ``None`` when this CPython's scanner cannot be set up so (then read with ``json.loads``).
#: It raises ``StopIteration`` where no value starts, ``ValueError`` on bad JSON, and
#: ``SystemError`` for errors it raises through ``json.decoder`` while that is not imported.
JSON_SCANNER = _json_scanner()


def _json_quote() -> Callable[[str], str]:
    quote = getattr(_json, "encode_basestring_ascii", None)
    if callable(quote):
        return quote  # type: ignore[no-any-return]
    FALLBACKS["json"] = "_json has no encode_basestring_ascii"
    encoder: Any = _public("json.encoder")
    return encoder.encoder.encode_basestring_ascii  # type: ignore[no-any-return]


#: ``json.dumps(text)`` (ASCII, as ``ensure_ascii``): the quoted JSON string of ``text``.
json_quote: Callable[[str], str] = _json_quote()


# --- socket ----------------------------------------------------------------------------

#: What a client uses of the socket type (``socket.socket`` is a Python subclass of it).
_SOCKET_METHODS = ("connect", "setsockopt", "settimeout", "sendall", "sendmsg", "recv", "close")
_SOCKET_NAMES = ("AF_UNIX", "SOCK_STREAM", "SOL_SOCKET", "SO_SNDTIMEO", "SCM_RIGHTS")


def _socket_module() -> Any:
    missing = [n for n in _SOCKET_NAMES if not hasattr(_socket, n)]
    missing += [f"socket.{m}" for m in _SOCKET_METHODS if not hasattr(_socket.socket, m)]
    if not missing:
        return _socket
    FALLBACKS["socket"] = f"_socket has no {', '.join(missing)}"
    return _public("socket")


_sockets: Any = _socket_module()
#: ``SOL_SOCKET``, ``SO_SNDTIMEO``, ``SCM_RIGHTS`` (``socket(7)``, ``unix(7)``).
SOL_SOCKET: int = _sockets.SOL_SOCKET
SO_SNDTIMEO: int = _sockets.SO_SNDTIMEO
SCM_RIGHTS: int = _sockets.SCM_RIGHTS


def unix_stream_socket() -> _socket.socket:
    """A new ``AF_UNIX`` ``SOCK_STREAM`` socket, blocking, close-on-exec: ``socket``'s C type
    (or ``socket.socket``, a subclass of it, as the fallback). Raises ``OSError`` as
    ``socket(2)`` does."""
    sock: _socket.socket = _sockets.socket(_sockets.AF_UNIX, _sockets.SOCK_STREAM)
    return sock


# --- struct ----------------------------------------------------------------------------


def _struct_pack() -> Callable[..., bytes]:
    pack = getattr(_struct, "pack", None)
    if callable(pack):
        return pack  # type: ignore[no-any-return]
    FALLBACKS["struct"] = "_struct has no pack"
    module: Any = _public("struct")
    return module.pack  # type: ignore[no-any-return]


#: ``struct.pack(format, *values)``: ``values`` packed as ``format`` says (native sizes and
#: alignment without a prefix character); raises ``struct.error`` as it does.
struct_pack: Callable[..., bytes] = _struct_pack()


# --- signal ----------------------------------------------------------------------------

_SIGNAL_NAMES = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGPIPE", "SIGXFSZ", "signal")


def _signal_module() -> Any:
    # No typeshed stub for _signal: it is imported by name.
    try:
        core = _public("_signal")
    except ImportError:
        FALLBACKS["signal"] = "no _signal module"
        return _public("signal")
    missing = [n for n in _SIGNAL_NAMES if not hasattr(core, n)]
    if not missing:
        return core
    FALLBACKS["signal"] = f"_signal has no {', '.join(missing)}"
    return _public("signal")


_signals: Any = _signal_module()
#: Signal numbers (``signal(7)``): those a launcher forwards to its command, and those
#: Python ignores that a spawned command gets back at their defaults.
SIGINT: int = int(_signals.SIGINT)
SIGTERM: int = int(_signals.SIGTERM)
SIGHUP: int = int(_signals.SIGHUP)
SIGQUIT: int = int(_signals.SIGQUIT)
SIGPIPE: int = int(_signals.SIGPIPE)
SIGXFSZ: int = int(_signals.SIGXFSZ)


def set_signal_handler(signum: int, handler: Callable[[int, FrameType | None], object]) -> None:
    """``signal.signal(signum, handler)`` (main thread only; raises ``ValueError`` for a bad
    signal number or from another thread, as it does)."""
    _signals.signal(signum, handler)


# --- the daemon's accept and its replies ------------------------------------------------

#: ``SIOCOUTQ`` (``linux/sockios.h``; the same number as ``TIOCOUTQ``, ``asm-generic/ioctls.h``).
SIOCOUTQ = 0x5411


def make_socket_transport(loop: Any, sock: Any, protocol: Any, addr: object) -> Any:
    """asyncio's selector transport for ``sock`` (accepted, non-blocking), carrying
    ``protocol``, as asyncio's own accept makes it (``peername`` ``addr``): it registers
    its reader and calls ``protocol.connection_made`` in a later loop step. CPython's
    ``asyncio/selector_events.py``, ``BaseSelectorEventLoop._make_socket_transport(sock,
    protocol, waiter=None, *, extra=None, server=None)``. Only for a loop
    :func:`has_socket_transport` accepts."""
    return loop._make_socket_transport(sock, protocol, None, extra={"peername": addr})


def release_transport(transport: Any) -> None:
    """Break the reference cycle a closed selector transport keeps with itself, so that
    reference counting frees it, and the socket it holds, when its connection ends, not a
    later collection of the cyclic collector: its read callback is a bound method of its own
    (CPython's ``asyncio/selector_events.py``, ``_SelectorSocketTransport._read_ready_cb``,
    set by ``set_protocol`` and never cleared). Only for a transport that is closing (asyncio
    removes its reader first, and calls its protocol's ``connection_lost`` only then): a live
    one, or any other object, is left as it is."""
    if getattr(transport, "_read_ready_cb", None) is not None and transport.is_closing():
        transport._read_ready_cb = None


def accept_fd(listener: Any) -> tuple[int, Any]:
    """The next connection waiting on ``listener`` (a listening ``socket.socket``): its new
    file descriptor (close-on-exec, blocking) and the peer's address, as
    ``listener.accept()`` has them before it makes a socket object of the descriptor.
    CPython's ``Modules/socketmodule.c`` ``sock_accept`` (``_socket.socket._accept``, which
    ``Lib/socket.py``'s ``socket.accept`` calls); raises what ``accept4(2)`` raises, as
    ``accept`` does."""
    fd, addr = listener._accept()
    return fd, addr


def has_socket_transport(loop: Any) -> bool:
    """Whether ``loop`` makes transports for accepted sockets (:func:`make_socket_transport`):
    asyncio's selector loop does; ``asyncio.base_events.BaseEventLoop``'s stub only raises
    ``NotImplementedError``, and a loop of another kind has none."""
    for cls in type(loop).__mro__:
        make = vars(cls).get("_make_socket_transport")
        if make is not None:
            return callable(make) and cls.__module__ != "asyncio.base_events"
    return False


def unread_bytes(sock: Any) -> int:
    """What is written to ``sock`` (a connected ``AF_UNIX`` stream socket, or asyncio's
    view of one) and not yet read by its peer, in bytes of the sender's charge:
    ``SIOCOUTQ`` (``unix(7)``: for a Unix socket the data stays charged to the sender until
    the receiver consumed it; the charge is its buffers' size, not the data's length). 0
    once all was read, the socket is closed or the call fails."""
    import fcntl  # a C module; here, so that the launch line does not load it

    try:
        fd = sock.fileno()
        if fd < 0:
            return 0
        out = fcntl.ioctl(fd, SIOCOUTQ, b"\0\0\0\0")
    except (OSError, ValueError):
        return 0
    value: int = _struct.unpack("i", out)[0]
    return value


# --- a reader paused from another thread --------------------------------------------------


def loop_epoll(loop: Any) -> tuple[Any, Any] | None:
    """``loop``'s selector (``selectors.EpollSelector``, whose ``get_map()`` says what it
    registered) and the ``select.epoll`` under it, or ``None`` when ``loop`` is not an
    asyncio selector loop over epoll. CPython's ``asyncio/selector_events.py``
    (``BaseSelectorEventLoop._selector``) and ``Lib/selectors.py``
    (``EpollSelector._selector``): both private attributes."""
    import select  # a C module; here, so that the launch line does not load it

    selector = getattr(loop, "_selector", None)
    epoll = getattr(selector, "_selector", None)
    if selector is None or not isinstance(epoll, select.epoll):
        return None
    return selector, epoll
