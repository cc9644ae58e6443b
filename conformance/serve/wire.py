"""The wire of ``kvfence serve``: the HTTP server, request bodies, and the engines' error
shapes.

Error bodies mirror the engines: SGLang 0.5.23 (``python/sglang/srt/entrypoints/
http_server.py``, its ``RequestValidationError`` handler: ``{"object": "error", "message",
"type", "param": null, "code"}``), vLLM 0.32's OpenAI server (``vllm/entrypoints/openai``:
``{"error": {"message", "type", "param", "code"}}``), and FastAPI's ``{"detail": "Not
Found"}`` for an unknown route on both.
"""

from __future__ import annotations

import asyncio
import email.utils
import gc
import json
import os
import signal
import socket
import threading
from collections.abc import Callable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import h11

from ..calls import call_with_timeout

if TYPE_CHECKING:
    from ..runner import Result
    from .session import Session

MAX_BODY = 64 * 2**20
"""Largest request body read (bytes); a larger ``Content-Length`` is a 400."""

BACKLOG = 1024
"""The listening socket's backlog (the kernel caps it at ``somaxconn``)."""

FREEZE_EVERY = 256
"""Requests between two ``gc.freeze()`` calls of a running server (``Server``). A
session keeps every request it judged (the traffic log, the record), so the cyclic
collector's full passes grow with the session: at a few thousand requests each one stopped
the server for 150-200 ms, which a 50-client load saw as its p99. Frozen objects are never
scanned again; what they hold is freed by reference counting as before (only a reference
cycle among them would stay)."""


class HttpError(Exception):
    """A request answered with an error: ``status`` and the engine-shaped message."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(message)


class PendingRoute(HttpError):
    """A route (or a form of one) whose model action does not exist yet."""

    def __init__(self, route: str, waits_for: str) -> None:
        super().__init__(
            HTTPStatus.NOT_IMPLEMENTED,
            f"kvfence serve: {route} is not implemented yet: it waits for the model action "
            f"{waits_for}",
        )
        self.waits_for = waits_for


class Streamed:
    """A streamed answer (``text/event-stream``): ``first``, the events sent at once (the
    request was admitted and holds its KV), and ``finish() -> bytes``, the rest, taken
    when the request ends: after ``hold`` seconds on a served connection (``Server``), or
    by whoever holds it in process. ``abort()``: its client went away first, so the
    engine aborts the request now (``on_abort``) and nothing more is sent. Each is safe to
    call after either (then ``b""``, or nothing)."""

    def __init__(
        self,
        first: bytes,
        finish: Callable[[], bytes],
        hold: float,
        on_abort: Callable[[], None] | None = None,
    ) -> None:
        self.first, self.hold = first, hold
        self._finish: Callable[[], bytes] | None = finish
        self._on_abort = on_abort

    def finish(self) -> bytes:
        finish, self._finish = self._finish, None
        return finish() if finish is not None else b""

    def abort(self) -> None:
        if self._finish is None:
            return
        self._finish = None
        if self._on_abort is not None:
            self._on_abort()


def error_body(api: str, status: int, message: str, known_route: bool) -> Any:
    """The engine's error body for ``status`` on ``api`` (404 on a route the API does not
    have: FastAPI's ``{"detail": "Not Found"}``, as both engines answer)."""
    if status == HTTPStatus.NOT_FOUND and not known_route:
        return {"detail": "Not Found"}
    phrase = HTTPStatus(status).phrase
    if api == "sglang":
        return {
            "object": "error",
            "message": message,
            "type": phrase,
            "param": None,
            "code": int(status),
        }
    kind = {400: "BadRequestError", 404: "NotFoundError", 501: "NotImplementedError"}
    error = {"message": message, "type": kind.get(status, phrase), "param": None}
    return {"error": {**error, "code": int(status)}}


def parse_json(body: bytes, path: str) -> dict[str, Any]:
    """``body`` as a JSON object (empty: ``{}``); anything else is an ``HttpError`` 400."""
    if not body.strip():
        return {}
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:
        # ValueError: bad JSON, bad UTF-8, or an integer past Python's digit limit.
        raise HttpError(HTTPStatus.BAD_REQUEST, f"{path}: the body is not JSON ({e})") from None
    if not isinstance(data, dict):
        raise HttpError(HTTPStatus.BAD_REQUEST, f"{path}: the body must be a JSON object")
    return data


def _head(kind: str, length: int, close: bool) -> list[tuple[str, str]]:
    """A response's headers (``Connection: close`` when ``close``)."""
    headers = [
        ("Server", "kvfence-serve"),
        ("Date", email.utils.formatdate(usegmt=True)),
        ("Content-Type", kind),
        ("Content-Length", str(length)),
    ]
    return [*headers, ("Connection", "close")] if close else headers


def _raw_response(status: int, kind: str, out: bytes) -> bytes:
    """A whole response in bytes, ``Connection: close``, for a connection h11 has given up
    on (a request it could not parse)."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    lines = [f"HTTP/1.1 {status} {phrase}"]
    lines += [f"{k}: {v}" for k, v in _head(kind, len(out), True)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + out


def _framing(request: h11.Request) -> str | None:
    """Why a request's body cannot be read (then the connection closes: what follows on it
    is not a request), or ``None``: bodies of a ``Content-Length`` only, of at most
    ``MAX_BODY`` bytes."""
    headers = {k.lower(): v for k, v in request.headers}
    if headers.get(b"transfer-encoding", b"").strip():
        coding = headers[b"transfer-encoding"].decode("latin-1")
        return f"Transfer-Encoding {coding!r}: kvfence serve reads bodies of a Content-Length only"
    length = headers.get(b"content-length", b"").strip()
    if length and (len(length) > 12 or int(length) > MAX_BODY):
        return f"Content-Length {length[:40].decode('latin-1')!r}: at most {MAX_BODY} bytes"
    return None


class Server:
    """The HTTP/1.1 server of a session: every connection on one asyncio loop, in the thread
    that calls ``serve_forever``, requests parsed by h11 and answered one at a time by
    ``session.handle`` in the order they were read.

    Why one thread: the session answers one request at a time anyway (its model and engine
    in lockstep), and run from the main thread (``run_server``) its in-process engine calls
    are direct, timed by the SIGALRM watchdog (``calls.call_with_timeout``), instead of a
    handoff to the adapter worker per call. With a thread per connection (``http.server``),
    50 keep-alive clients on 2 cores held the server at about 950 requests/s with a p99 of
    100 ms: the threads' lock and GIL handoffs, not the session's work.

    Each response is one write (status line, headers and body) on a ``TCP_NODELAY`` socket
    (asyncio's default), so a keep-alive client waits for no delayed ACK. The listening
    socket is bound (and listening, backlog ``BACKLOG``) when the server is made, so a
    burst of clients that connect before ``serve_forever`` is queued, not reset.
    ``shutdown`` (from another thread) stops the loop; ``server_close`` closes the socket.
    Raises ``OSError`` when ``host:port`` cannot be bound.

    ``more``: further listeners on the same loop, ``{endpoint: port}``, each answering for
    that model endpoint of the session (``Session.handle``'s ``endpoint``: the decode
    server of ``--pd`` is endpoint 1); ``listeners`` holds ``(endpoint, bound port)`` of
    every listener, the first (``server_address``) endpoint 0.
    """

    request_queue_size = BACKLOG

    def __init__(
        self, session: Session, host: str, port: int, more: dict[int, int] | None = None
    ) -> None:
        self.session = session
        self.socket = socket.create_server((host, port), backlog=BACKLOG)
        self.server_address = self.socket.getsockname()[:2]
        self.sockets = [(0, self.socket)]
        try:
            for endpoint, extra in (more or {}).items():
                self.sockets.append(
                    (endpoint, socket.create_server((host, extra), backlog=BACKLOG))
                )
        except OSError:
            self.server_close()
            raise
        self.listeners = [(e, sock.getsockname()[1]) for e, sock in self.sockets]
        self.answered = 0
        #: Set to stop ``serve_forever`` (a signal handler may set it).
        self.stop = threading.Event()
        self._done = threading.Event()
        self._done.set()

    def serve_forever(self, poll_interval: float = 0.05) -> None:
        """Serve until ``stop`` is set (``shutdown``; polled every ``poll_interval``
        seconds); connections still open are closed on return."""
        self._done.clear()
        try:
            asyncio.run(self._serve(poll_interval))
        finally:
            self._done.set()

    def shutdown(self) -> None:
        """Stop ``serve_forever`` and wait for it to return."""
        self.stop.set()
        self._done.wait()

    def server_close(self) -> None:
        for _, sock in self.sockets:
            sock.close()

    async def _serve(self, poll_interval: float) -> None:
        loop = asyncio.get_running_loop()
        servers = []
        for endpoint, sock in self.sockets:
            servers.append(
                await loop.create_server(
                    lambda e=endpoint: _Connection(self, e), sock=sock, backlog=BACKLOG
                )
            )
        try:
            while not self.stop.is_set():
                await asyncio.sleep(poll_interval)
        finally:
            for server in servers:
                server.close()

    def answer(
        self, method: str, target: str, body: bytes, endpoint: int = 0
    ) -> tuple[int, str, bytes]:
        """The session's answer to one request read whole, on the listener of
        ``endpoint``."""
        out = self.session.handle(method, target, body, endpoint)
        self.answered += 1
        if self.answered % FREEZE_EVERY == 0:
            gc.freeze()
        return out


class _Connection(asyncio.Protocol):
    """One client connection: bytes in to h11, each whole request answered at once (the
    loop runs nothing else meanwhile), pipelined requests in turn."""

    def __init__(self, server: Server, endpoint: int = 0) -> None:
        self.server = server
        self.endpoint = endpoint
        self.http = h11.Connection(h11.SERVER)
        self.transport: asyncio.Transport | None = None
        self.request: h11.Request | None = None
        self.body: list[bytes] = []
        #: The stream this connection is sending, and its timer (``_stream``).
        self.streaming: tuple[asyncio.TimerHandle, Streamed] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        """The client went away: a stream it left unread is aborted now, as the engines
        abort a request whose connection closed."""
        self.transport = None
        if self.streaming is not None:
            timer, out = self.streaming
            self.streaming = None
            timer.cancel()
            out.abort()

    def data_received(self, data: bytes) -> None:
        self.http.receive_data(data)
        self._events()

    def eof_received(self) -> bool:
        self.http.receive_data(b"")
        self._events()
        return False  # close the transport

    def _events(self) -> None:
        while self.transport is not None and not self.transport.is_closing():
            try:
                event = self.http.next_event()
            except h11.RemoteProtocolError as e:  # not HTTP, or a bad Content-Length
                message = f"bad request: {e}"
                self._close_with(self.server.session.refuse(HTTPStatus.BAD_REQUEST, message, "/"))
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                refused = _framing(event)
                if refused:
                    target = event.target.decode("latin-1")
                    session = self.server.session
                    self._send(session.refuse(HTTPStatus.BAD_REQUEST, refused, target), True)
                    return
                self.request, self.body = event, []
            elif isinstance(event, h11.Data):
                self.body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                self._answer()
            elif isinstance(event, h11.ConnectionClosed):
                self.transport.close()
                return

    def _answer(self) -> None:
        request = self.request
        assert request is not None
        method, target = request.method.decode("latin-1"), request.target.decode("latin-1")
        status, kind, out = self.server.answer(method, target, b"".join(self.body), self.endpoint)
        if isinstance(out, Streamed):
            self._stream(status, kind, out)
            return
        closed = status == HTTPStatus.SERVICE_UNAVAILABLE and self.server.session.closed
        self._send((status, kind, out), closed)
        if self.transport is not None and not self.transport.is_closing():
            if self.http.our_state is h11.DONE and self.http.their_state is h11.DONE:
                self.http.start_next_cycle()
            else:
                self.transport.close()

    def _send(self, answer: tuple[int, str, bytes], close: bool) -> None:
        """Write one response in one write; ``close``: then close the connection."""
        assert self.transport is not None
        status, kind, out = answer
        head = h11.Response(status_code=status, headers=_head(kind, len(out), close))
        data = self.http.send(head) + self.http.send(h11.Data(data=out))
        self.transport.write(data + self.http.send(h11.EndOfMessage()))
        if close:
            self.transport.close()

    def _stream(self, status: int, kind: str, out: Streamed) -> None:
        """Send a streamed answer's head and first events now (chunked: no length), its
        rest once the request ends (``out.hold`` seconds later; the loop serves other
        connections meanwhile, so a reset can meet the request in flight). Requests
        pipelined on this connection wait for the stream's end (h11 pauses them)."""
        assert self.transport is not None
        head = h11.Response(status_code=status, headers=[("Content-Type", kind)])
        self.transport.write(self.http.send(head) + self.http.send(h11.Data(data=out.first)))
        timer = asyncio.get_running_loop().call_later(out.hold, self._end_stream, out)
        self.streaming = (timer, out)

    def _end_stream(self, out: Streamed) -> None:
        self.streaming = None
        rest = out.finish()
        if self.transport is None or self.transport.is_closing():
            return
        tail = self.http.send(h11.Data(data=rest)) if rest else b""
        self.transport.write(tail + self.http.send(h11.EndOfMessage()))
        if self.http.their_state is h11.DONE:
            self.http.start_next_cycle()
            self._events()
        else:
            self.transport.close()

    def _close_with(self, answer: tuple[int, str, bytes]) -> None:
        """Answer on a connection h11 gave up on, then close it."""
        assert self.transport is not None
        self.transport.write(_raw_response(*answer))
        self.transport.close()


def make_server(
    session: Session, host: str, port: int, more: dict[int, int] | None = None
) -> Server:
    """The HTTP server for ``session`` on ``host:port`` (0: a free port), bound and
    listening, with ``more`` listeners (``Server``); raises ``OSError`` when a port cannot
    be bound."""
    return Server(session, host, port, more)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

EXIT_FORCED = 2
"""The exit code of a second stop signal: no verdict given (ERROR), reports already
written stay."""


def run_server(
    session: Session,
    host: str,
    port: int,
    announce: Callable[[str], None],
    hold_signals: bool = False,
    more: dict[int, int] | None = None,
) -> Result:
    """Serve until SIGTERM or SIGINT, then the session's result, its trace (and on FAIL its
    counterexample) written.

    The server's loop runs on the calling thread (the main thread: in-process engine calls
    are direct) until a stop signal; the signal handler only sets ``Server.stop``, so no
    exception lands inside the loop. On the first signal the request being answered is
    finished, the listening socket and every connection close (a client waiting for an
    answer sees the connection closed, never a half-judged reply), the session closes and
    the verdict is taken. A second signal exits at once with ``EXIT_FORCED`` (what was
    written stays written). ``hold_signals``: leave that force-exit handler installed when
    returning (the CLI, which still writes its reports); else the previous handlers come
    back. ``more``: further listeners, ``{endpoint: port}`` (the decode server of
    ``--pd``), announced on the same line, each server by its role.
    """
    server = make_server(session, host, port, more)
    stop = server.stop

    def on_signal(signum: int, frame: Any) -> None:
        if stop.is_set():
            os.write(2, b"kvfence serve: second stop signal: exit now (written reports stay)\n")
            os._exit(EXIT_FORCED)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    bound = server.server_address[1]
    try:
        if len(server.listeners) == 1:
            ranks = session.configs[0].ranks
            dp = f", {ranks} data-parallel ranks" if ranks > 1 else ""
            announce(
                f"kvfence serve: {session.api} API on http://{host}:{bound} "
                f"(engine {session.engine_name}{dp})"
            )
        else:
            servers = ", ".join(
                f"{session.role(e)} server on http://{host}:{p}" for e, p in server.listeners
            )
            announce(f"kvfence serve: {session.api} API, {servers} (engine {session.engine_name})")
        server.serve_forever()
        server.server_close()
        result = session.close()
    finally:
        server.server_close()
        if not hold_signals:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    call_with_timeout(session.engine.close, session.timeout, "close")
    return result
