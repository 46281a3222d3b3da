"""A raw HTTP/1.1 client connection for tests of the sidecar's HTTP edge: it sends bytes
as given and reads whole responses (content-length or chunked) from the socket, so that
a test sees exactly what the server wrote and when it closed."""

from __future__ import annotations

import re
import socket

__all__ = ["Conn"]


class Conn:
    """A raw client connection that reads whole responses (content-length or chunked)."""

    def __init__(self, url: str) -> None:
        port = int(url.rsplit(":", 1)[1])
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buffer = b""

    def close(self) -> None:
        self.sock.close()

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed by the server; unread: {self.buffer!r}")
        self.buffer += chunk

    def _take(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self._fill()
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def _line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            self._fill()
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def head(self) -> tuple[int, dict[str, str]]:
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode().split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
        return int(status_line.split()[1]), headers

    def response(self) -> tuple[int, dict[str, str], bytes]:
        """One whole response; a chunked body comes back de-chunked."""
        status, headers = self.head()
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while size := int(self._line(), 16):
                body += self._take(size)
                assert self._take(2) == b"\r\n"
            assert self._line() == b""
            return status, headers, body
        return status, headers, self._take(int(headers["content-length"]))

    def chunks_to_close(self) -> bool:
        """Read a chunked body until its end (True) or until the server closes (False),
        failing on anything that is not a chunk."""
        try:
            while size := self._line():
                assert re.fullmatch(rb"[0-9a-f]+", size), f"not a chunk: {size!r}"
                if size == b"0":
                    return self._line() == b""
                self._take(int(size, 16))
                assert self._take(2) == b"\r\n"
        except ConnectionError:
            return False
        raise AssertionError("an empty chunk-size line")
