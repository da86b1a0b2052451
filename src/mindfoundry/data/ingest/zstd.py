"""A ``.zst`` file as a byte stream that notices truncation (what :mod:`.files` reads Zstandard sources with)."""

from __future__ import annotations

import io

import zstandard

_ZSTD_CHUNK = 1 << 16


class ZstdReader(io.RawIOBase):
    """A ``.zst`` file as a byte stream: every frame in turn, and an error at a truncated frame.

    python-zstandard's own ``stream_reader`` silently returns a truncated frame's partial data;
    a decompression object reports whether its frame ended (``eof``), so truncation is caught.
    """

    def __init__(self, raw: io.BufferedIOBase) -> None:
        self._raw = raw
        self._decompressor = zstandard.ZstdDecompressor()
        self._frame = self._decompressor.decompressobj()
        self._started = False
        self._pending = b""
        self._out = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:
        while not self._out:
            if not self._decompress_more():
                return 0
        size = min(len(buffer), len(self._out))
        buffer[:size] = self._out[:size]
        self._out = self._out[size:]
        return size

    def _decompress_more(self) -> bool:
        """Feed the next input to the current frame; ``False`` at a clean end of the file."""
        data, self._pending = self._pending or self._raw.read(_ZSTD_CHUNK), b""
        if not data:
            if self._started and not self._frame.eof:
                raise zstandard.ZstdError("truncated .zst data: the last frame is incomplete")
            return False
        if self._frame.eof:
            self._frame = self._decompressor.decompressobj()
        self._started = True
        self._out = memoryview(self._frame.decompress(data))
        if self._frame.eof:
            self._pending = self._frame.unused_data
        return True

    def close(self) -> None:
        self._raw.close()
        super().close()
