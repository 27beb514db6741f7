"""Python side of the clink extension: the exception classes and the asyncio helpers.

The extension module runs this source at import as ``clink._support`` and re-exports its
public names from ``clink``.
"""

import asyncio

# The result codes of the C API (clink-c/include/clink.h); the Python exceptions carry
# the same numbers in their ``code`` attribute.
ERROR_CODES = {
    "CLINK_OK": 0,
    "CLINK_AGAIN": 1,
    "CLINK_ERR_NULL": -1,
    "CLINK_ERR_INVALID": -2,
    "CLINK_ERR_IO": -3,
    "CLINK_ERR_CONFIG": -4,
    "CLINK_ERR_PROTOCOL": -5,
    "CLINK_ERR_ADDRESS": -6,
    "CLINK_ERR_CONNECT": -7,
    "CLINK_ERR_PEER_DEAD": -8,
    "CLINK_ERR_UNKNOWN_PEER": -9,
    "CLINK_ERR_TRUNCATED": -10,
    "CLINK_ERR_TIMEOUT": -11,
    "CLINK_ERR_CANCELLED": -12,
    "CLINK_ERR_CONSUMED": -13,
    "CLINK_ERR_TOO_LARGE": -14,
    "CLINK_ERR_REFUSED": -15,
    "CLINK_ERR_FORKED": -16,
    "CLINK_ERR_BUSY": -17,
    "CLINK_ERR_PANIC": -18,
    "CLINK_ERR_UNSUPPORTED": -19,
}


class Error(Exception):
    """Base class of clink's errors. ``code`` is the C API's CLINK_ERR_* number."""

    code = 0


class InvalidArgument(Error, ValueError):
    """An argument is invalid (aperture, tripwire, range, closed endpoint, ...)."""

    code = ERROR_CODES["CLINK_ERR_INVALID"]


class IoError(Error, OSError):
    """A system call failed."""

    code = ERROR_CODES["CLINK_ERR_IO"]


class ConfigError(Error):
    """A CLINK_* environment variable is unknown or has a bad value."""

    code = ERROR_CODES["CLINK_ERR_CONFIG"]


class ProtocolError(Error):
    """A peer broke the protocol (its connection is dropped)."""

    code = ERROR_CODES["CLINK_ERR_PROTOCOL"]


class AddressError(Error, ValueError):
    """An address string could not be parsed."""

    code = ERROR_CODES["CLINK_ERR_ADDRESS"]


class ConnectError(Error, ConnectionError):
    """Connecting failed (unreachable, refused, timed out)."""

    code = ERROR_CODES["CLINK_ERR_CONNECT"]


class PeerDead(Error, ConnectionError):
    """The peer exited, was killed, closed or was disconnected. ``peer`` says which."""

    code = ERROR_CODES["CLINK_ERR_PEER_DEAD"]
    peer = None


class UnknownPeer(Error, LookupError):
    """No such peer on this endpoint."""

    code = ERROR_CODES["CLINK_ERR_UNKNOWN_PEER"]
    peer = None


class Truncated(Error):
    """The message was longer than the receive buffer, which holds its first bytes.

    ``length`` is the message's full length, ``capacity`` the buffer's.
    """

    code = ERROR_CODES["CLINK_ERR_TRUNCATED"]
    length = None
    capacity = None


class Timeout(Error, TimeoutError):
    """A wait ran out of time; the request, if any, is still pending."""

    code = ERROR_CODES["CLINK_ERR_TIMEOUT"]


class Cancelled(Error):
    """The request was cancelled."""

    code = ERROR_CODES["CLINK_ERR_CANCELLED"]


class Consumed(Error):
    """The request's result was already taken."""

    code = ERROR_CODES["CLINK_ERR_CONSUMED"]


class TooLarge(Error, ValueError):
    """A size is outside what the operation supports."""

    code = ERROR_CODES["CLINK_ERR_TOO_LARGE"]


class Refused(Error, PermissionError):
    """The target of a one-sided access refused it (bad or revoked cookie, bounds, rights)."""

    code = ERROR_CODES["CLINK_ERR_REFUSED"]
    peer = None


class Forked(Error):
    """The endpoint was used in a forked child: create a new Context there."""

    code = ERROR_CODES["CLINK_ERR_FORKED"]


class Busy(Error):
    """The endpoint is in use: by another thread right now, or held by an unreleased
    in-place message or send slot."""

    code = ERROR_CODES["CLINK_ERR_BUSY"]


class Unsupported(Error):
    """Not possible over this peer's transport."""

    code = ERROR_CODES["CLINK_ERR_UNSUPPORTED"]


_BY_CODE = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        IoError,
        ConfigError,
        ProtocolError,
        AddressError,
        ConnectError,
        PeerDead,
        UnknownPeer,
        Truncated,
        Timeout,
        Cancelled,
        Consumed,
        TooLarge,
        Refused,
        Forked,
        Busy,
        Unsupported,
    )
}

# ---------------------------------------------------------------- asyncio

# The longest a coroutine parks on the endpoint's fd before it makes progress anyway: the
# fd wakes for messages, connections and peer failures, but the network transports' timers
# (retransmissions, keepalives) only run when the endpoint is called into.
TICK = 0.05


class _Waiters:
    """The coroutines of one event loop parked on one endpoint's fd: one reader callback
    and one prepare_wait/finish_wait pair serve them all."""

    def __init__(self, loop):
        self.loop = loop
        self.futures = []
        self.armed = False
        self.timer = None
        self.fd = -1
        self.ep = None

    def wake(self):
        if self.armed:
            self.armed = False
            self.loop.remove_reader(self.fd)
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            ep, self.ep = self.ep, None
            try:
                ep.finish_wait()
            except Error:
                pass  # busy elsewhere: the waiters retry their operation anyway
        futures, self.futures = self.futures, []
        for f in futures:
            if not f.done():
                f.set_result(None)


def _new_table():
    import weakref

    return weakref.WeakKeyDictionary()


def _waiters(ep, loop):
    table = ep._aio_table()
    w = table.get(loop)
    if w is None:
        w = table[loop] = _Waiters(loop)
    return w


async def wait_readable(ep):
    """Parks until the endpoint may have work (its fd became readable, or TICK passed).

    Follows the endpoint's protocol: ``prepare_wait`` (block only when it returns True),
    wait on ``fileno()``, then ``finish_wait``; the caller makes progress afterwards.
    """
    loop = asyncio.get_running_loop()
    w = _waiters(ep, loop)
    fut = loop.create_future()
    w.futures.append(fut)
    if not w.armed:
        if ep.prepare_wait():
            w.armed = True
            w.ep = ep
            w.fd = ep.fileno()
            loop.add_reader(w.fd, w.wake)
            w.timer = loop.call_later(TICK, w.wake)
        else:
            # Work arrived meanwhile: everybody retries now.
            w.wake()
    try:
        await fut
    except asyncio.CancelledError:
        if fut in w.futures:
            w.futures.remove(fut)
        if not w.futures and w.armed:
            w.wake()
        raise


async def recv_async(ep, buf, peer, tag, mask):
    """See Endpoint.recv_async."""
    while True:
        st = ep.probe(peer, tag, mask=mask)
        if st is not None:
            return ep.recv_into(buf, st.peer, st.tag)
        await wait_readable(ep)


async def send_async(ep, peer, tag, data):
    """See Endpoint.send_async."""
    req = ep.isend(peer, tag, data)
    while not req.test():
        await wait_readable(ep)


async def wait_event_async(ep):
    """See Endpoint.wait_event_async."""
    while True:
        ev = ep.next_event()
        if ev is not None:
            return ev
        await wait_readable(ep)


async def wait_request_async(ep, req):
    """See SendRequest.wait_async / RecvRequest.wait_async."""
    while True:
        r = req.test()
        if r is not None and r is not False:
            return r
        await wait_readable(ep)
