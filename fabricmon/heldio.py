"""Non-blocking socket calls that keep the GIL: the one-thread HTTP loop's accept, recv, send and close.

CPython lets go of the GIL around every socket call, even one that cannot block; while the poll or
the stream thread runs Python, the serving thread then waits up to the switch interval to get it
back, once per call (four a scrape: accept, recv, send, close; issue 39's p99).  Called through
``ctypes.PyDLL`` (which keeps the GIL), a call that returns at once costs microseconds and no
hand-over.  Every call here is non-blocking (a non-blocking listener, MSG_DONTWAIT, a close without
linger), so holding the GIL across it never stalls another thread.

``SocketIO`` is the portable form (the socket module: the GIL is let go), used where libc's calls
cannot be loaded; both take and return the same things: a handle is what the selector registers.
"""

from __future__ import annotations

import ctypes
import errno
import socket
import sys
from collections.abc import Sequence

_RECV = 65536
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)
_AGAIN = (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR)


class SocketIO:
    """The socket module's calls (the GIL let go around each); a handle is an accepted socket."""

    name = "socket"

    def __init__(self, listener: socket.socket) -> None:
        self._listener = listener

    def accept(self):
        """A new connection's handle, or None when none is waiting."""
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return None
        sock.setblocking(False)
        return sock

    def recv(self, handle) -> bytes | None:
        """Up to 64 KiB; b"" when the peer closed; None when nothing is there yet."""
        try:
            return handle.recv(_RECV)
        except (BlockingIOError, InterruptedError):
            return None

    def send(self, handle, bufs: Sequence[bytes], offset: int = 0) -> int | None:
        """Bytes the kernel took from ``bufs`` (the first from ``offset`` on) in order; None when it
        took none (the peer's window is full)."""
        try:
            return handle.sendmsg([memoryview(bufs[0])[offset:], *bufs[1:]] if offset else bufs)
        except (BlockingIOError, InterruptedError):
            return None

    def close(self, handle) -> None:
        try:
            handle.close()
        except OSError:
            pass

    def shutdown_write(self, handle) -> None:
        """Send FIN: the peer reads the response to its end while what it still sends is drained."""
        try:
            handle.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32), ("iov", ctypes.POINTER(_Iovec)),
                ("iovlen", ctypes.c_size_t), ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


_MAX_IOV = 64


class LibcIO:
    """libc's accept4, recv, sendmsg and close through ``ctypes.PyDLL``: the GIL is kept (Linux); a
    handle is a file descriptor."""

    name = "libc"

    def __init__(self, listener: socket.socket) -> None:
        libc = ctypes.PyDLL(None, use_errno=True)
        self._accept4 = libc.accept4
        self._accept4.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        self._accept4.restype = ctypes.c_int
        self._recv = libc.recv
        self._recv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self._recv.restype = ctypes.c_ssize_t
        self._sendmsg = libc.sendmsg
        self._sendmsg.argtypes = [ctypes.c_int, ctypes.POINTER(_Msghdr), ctypes.c_int]
        self._sendmsg.restype = ctypes.c_ssize_t
        self._close = libc.close
        self._close.argtypes = [ctypes.c_int]
        self._close.restype = ctypes.c_int
        self._shutdown = libc.shutdown
        self._shutdown.argtypes = [ctypes.c_int, ctypes.c_int]
        self._shutdown.restype = ctypes.c_int
        self._listen_fd = listener.fileno()
        self._buf = ctypes.create_string_buffer(_RECV)
        self._iov = (_Iovec * _MAX_IOV)()
        self._msg = _Msghdr(None, 0, self._iov, 0, None, 0, 0)
        self._msg_ref = ctypes.byref(self._msg)

    @staticmethod
    def _fail(what: str) -> OSError:
        code = ctypes.get_errno()
        return OSError(code, f"{what}: {errno.errorcode.get(code, code)}")

    def accept(self) -> int | None:
        fd = self._accept4(self._listen_fd, None, None, socket.SOCK_CLOEXEC)
        if fd >= 0:
            return fd
        if ctypes.get_errno() in _AGAIN:
            return None
        raise self._fail("accept4")

    def recv(self, handle: int) -> bytes | None:
        n = self._recv(handle, self._buf, _RECV, _DONTWAIT)
        if n >= 0:
            return ctypes.string_at(self._buf, n)
        if ctypes.get_errno() in _AGAIN:
            return None
        raise self._fail("recv")

    def send(self, handle: int, bufs: Sequence[bytes], offset: int = 0) -> int | None:
        iov = self._iov
        count = 0
        for b in bufs[:_MAX_IOV]:
            # the bytes object's own buffer, not a copy; ``bufs`` keeps it alive through the call
            skip = offset if count == 0 else 0
            iov[count].base = (ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p).value or 0) + skip
            iov[count].len = len(b) - skip
            count += 1
        self._msg.iovlen = count
        n = self._sendmsg(handle, self._msg_ref, _DONTWAIT | _NOSIGNAL)
        if n >= 0:
            return n
        if ctypes.get_errno() in _AGAIN:
            return None
        raise self._fail("sendmsg")

    def close(self, handle: int) -> None:
        self._close(handle)

    def shutdown_write(self, handle: int) -> None:
        self._shutdown(handle, socket.SHUT_WR)


def held_io(listener: socket.socket) -> SocketIO | LibcIO:
    """LibcIO on Linux CPython, else SocketIO."""
    if sys.platform.startswith("linux") and sys.implementation.name == "cpython":
        try:
            return LibcIO(listener)
        except (OSError, AttributeError):
            pass
    return SocketIO(listener)
