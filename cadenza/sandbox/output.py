"""Bounded capture of a stream: the first and last bytes are kept, the middle is counted and dropped.

A command that prints gigabytes must cost the host a few kilobytes of memory, and the agent still sees
how its output began and ended.
"""

from __future__ import annotations


class CappedBuffer:
    """Keeps at most ``limit`` bytes: ``limit // 2`` from the start, the rest from the end."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._head_limit = limit // 2
        self._tail_limit = limit - self._head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self._head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self._tail_limit:
                del self.tail[: len(self.tail) - self._tail_limit]

    @property
    def dropped(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def text(self) -> str:
        """Decoded text (invalid UTF-8 replaced), with a marker where bytes were cut."""
        return cap_join(bytes(self.head), bytes(self.tail), self.dropped)


def cap_join(head: bytes, tail: bytes, dropped: int) -> str:
    if dropped <= 0:
        return (head + tail).decode("utf-8", errors="replace")
    marker = f"\n[... {dropped} bytes of output truncated ...]\n"
    return head.decode("utf-8", errors="replace") + marker + tail.decode("utf-8", errors="replace")


def cap_text(text: str, limit: int) -> str:
    """Cap an already-decoded string the same way (for observations built in Python)."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return text
    buf = CappedBuffer(limit)
    buf.feed(data)
    return buf.text()
