"""A JPEG's own marker segments, read before any decoder sees its bytes: the frame header and the first scan's
header, and the gate that decides whether libjpeg-turbo's native decoders (TurboJPEG 3, simplejpeg) and its DCT
scaling (Pillow's `Image.draft` too) may see them.

libjpeg-turbo decodes far more than ImageNet holds (lossless, arithmetic, 12/16-bit, odd sampling factors), but
not all of it safely on every path: a lossless JPEG (SOF3) decoded at a reduced DCT scale corrupts the heap (the
process dies: glibc abort or SIGSEGV, with simplejpeg, TurboJPEG and Pillow's draft alike), and a 4:4:1 JPEG makes
simplejpeg's header parse raise KeyError. So only the kind every native path is known to handle reaches them;
everything else (`read_frame` says why in `Frame.problem`) is decoded by Pillow at full scale (crops.py: with the
same box), whose errors are the reader's. The rules, checked on the markers from SOI up to the first SOS:

- one frame, SOF0/1/2 (baseline, extended, progressive; Huffman-coded), 8-bit samples, width and height 1..65500;
- 1 component sampled 1x1, or 3 components with the chroma at 1x1 and the luma at one of `LUMA_SAMPLING`;
- the quantisation tables of every component and the Huffman tables of the first scan defined before it, the first
  scan's components in the frame (and a DC scan first when progressive), every segment within the data;
- at least one byte after the first scan's header per 64 blocks of 8x8 pixels (each block takes at least one bit
  of Huffman-coded data): a small file claiming a huge size is no image to decode (`Frame.short`: decode.py
  raises it as an error, where Pillow would return a large grey picture of nothing).

4:4:1 is left out for TurboJPEG too, which names it (TJSAMP_441): one rule for both decoders, and no ImageNet JPEG
uses it. Measured: every one of the 1,000 real ImageNet sample JPEGs passes, in ~17 us of Python per image (the
native header parse it replaces took 5 us; the crop it guards ~2,400 us: docs/results/bench-decoder-gate.txt)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

Bytes = bytes | memoryview
NO_LENGTH = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RSTn: standalone markers
SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # every frame type (DHT, JPG, DAC are not)
NATIVE_FRAMES = {0xC0: "baseline", 0xC1: "extended", 0xC2: "progressive"}  # Huffman-coded DCT frames
FRAME_NAMES = {
    **NATIVE_FRAMES,
    0xC3: "lossless",
    0xC5: "hierarchical",
    0xC6: "hierarchical progressive",
    0xC7: "hierarchical lossless",
    0xC9: "arithmetic extended",
    0xCA: "arithmetic progressive",
    0xCB: "arithmetic lossless",
    0xCD: "hierarchical arithmetic",
    0xCE: "hierarchical arithmetic progressive",
    0xCF: "hierarchical arithmetic lossless",
}
# Luma h << 4 | v with chroma at 1x1 that simplejpeg names and TurboJPEG crops: 4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1
LUMA_SAMPLING = frozenset({0x11, 0x21, 0x22, 0x12, 0x41})
HUFFMAN_FRAMES = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7})  # each block (sample) takes >= 1 bit
MAX_SIDE = 65500  # libjpeg's JPEG_MAX_DIMENSION
BLOCKS_PER_BYTE = 64  # entropy-coded data: at least one bit per 8x8 block


class Frame(NamedTuple):
    """What the markers up to the first SOS say: the frame (SOFn), its components, the first scan, the tables."""

    marker: int  # SOFn
    precision: int
    width: int
    height: int
    components: bytes  # the frame's (id, h << 4 | v, quantisation table) triples, as stored
    scan: int  # offset of the first entropy-coded byte (just after the first SOS header)
    problem: str | None  # why the native decoders must not see these bytes (None: they may)
    short: str | None = None  # Huffman-coded, but too few bytes for the blocks it declares (no decoder should try)


def segments(data: Bytes) -> Iterator[tuple[int, int, int]]:
    """(marker, body offset, length) of each marker segment from SOI up to the first SOS (included); it stops
    early, without a word, at anything malformed (the callers then find no SOS)."""
    if data[:2] != b"\xff\xd8":
        return
    pos, end = 2, len(data)
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in NO_LENGTH:
            pos += 2
            continue
        length = (data[pos + 2] << 8) | data[pos + 3]
        body = pos + 4
        if length < 2 or body + length - 2 > end:
            return
        yield marker, body, length
        if marker == 0xDA:
            return
        pos = body + length - 2


def draft(img: Any, data: Bytes, mode: str, size: tuple[int, int]) -> None:
    """`img.draft(mode, size)` (Pillow's decode at a reduced DCT scale) when `data`, the bytes the PIL image `img`
    was opened from, is a JPEG the gate passes; anything else decodes at full size."""
    if img.format == "JPEG" and native_size(data) is not None:
        img.draft(mode, size)


def native_size(data: Bytes) -> tuple[int, int] | None:
    """(width, height) of a JPEG the native decoders and DCT scaling may see (module docstring), else None."""
    frame = read_frame(data)
    return None if frame is None or frame.problem else (frame.width, frame.height)


def read_frame(data: Bytes) -> Frame | None:
    """The frame and first scan of `data` with the gate's verdict, or None: no SOI, SOF and SOS in order."""
    sof: tuple[int, int, int] | None = None
    problem: str | None = None
    quant: set[int] = set()
    huffman: set[int] = set()  # 16 x class (0 DC, 1 AC) + table id
    for marker, body, length in segments(data):
        if marker == 0xDA:
            return None if sof is None else _verdict(data, sof, (body, length), quant, huffman, problem)
        if marker in SOF_MARKERS:
            if sof is not None:
                return None  # two frames before a scan (hierarchical files hold DHP and several: never native)
            sof = (marker, body, length)
        elif marker == 0xDB:
            problem = problem or _quant_tables(data, body, length, quant)
        elif marker == 0xC4:
            problem = problem or _huffman_tables(data, body, length, huffman)
        elif marker in (0xDE, 0xDF, 0xDC):  # DHP, EXP, DNL: hierarchical or height-from-the-scan
            problem = problem or f"marker FF{marker:02X} before the first scan"
    return None


def _verdict(
    data: Bytes,
    sof: tuple[int, int, int],
    sos: tuple[int, int],
    quant: set[int],
    huffman: set[int],
    problem: str | None,
) -> Frame | None:
    """The Frame of SOF segment `sof` (marker, body, length) and SOS segment `sos` (body, length), with the first
    problem found in the frame, the tables before the scan (`problem`), the scan header and the data's length."""
    marker, body, length = sof
    count = data[body + 5] if length >= 8 else 0
    if count < 1 or length != 8 + 3 * count:
        return None
    precision, height, width = (
        data[body],
        (data[body + 1] << 8) | data[body + 2],
        (data[body + 3] << 8) | data[body + 4],
    )
    components = bytes(data[body + 6 : body + 6 + 3 * count])
    scan = sos[0] + sos[1] - 2
    blocks = -(-width // 8) * -(-height // 8)
    short = None
    if marker in HUFFMAN_FRAMES and (len(data) - scan) * BLOCKS_PER_BYTE < blocks:
        short = (
            f"a JPEG of {width}x{height} ({blocks:,} blocks of 8x8, each at least one bit of image data) with "
            f"{len(data) - scan:,} bytes of image data: truncated, or a decompression bomb"
        )
    frame = Frame(marker, precision, width, height, components, scan, None, short)
    problem = _frame_problem(frame) or problem or _scan_problem(frame, data, *sos, quant, huffman) or short
    return frame._replace(problem=problem) if problem else frame


def _frame_problem(frame: Frame) -> str | None:
    if frame.marker not in NATIVE_FRAMES:
        return f"{FRAME_NAMES.get(frame.marker, 'unknown')} frame (SOF{frame.marker - 0xC0})"
    if frame.precision != 8:
        return f"{frame.precision}-bit samples"
    if not (1 <= frame.width <= MAX_SIDE and 1 <= frame.height <= MAX_SIDE):
        return f"size {frame.width}x{frame.height}"
    raw = frame.components
    if len(set(raw[0::3])) * 3 != len(raw) or max(raw[2::3]) > 3:
        return "component ids repeated or a quantisation table id above 3"
    if raw[1::3] == b"\x11" or (len(raw) == 9 and raw[1] in LUMA_SAMPLING and raw[4] == raw[7] == 0x11):
        return None
    return f"{len(raw) // 3} components sampled " + ",".join(f"{hv >> 4}x{hv & 15}" for hv in raw[1::3])


def _scan_problem(frame: Frame, data: Bytes, body: int, length: int, quant: set[int], huffman: set[int]) -> str | None:
    count = data[body] if length > 2 else 0
    if not 1 <= count <= 4 or length != 6 + 2 * count:
        return "malformed first scan header"
    start, end, approx = data[body + 1 + 2 * count], data[body + 2 + 2 * count], data[body + 3 + 2 * count]
    if (start, end) != ((0, 0) if frame.marker == 0xC2 else (0, 63)) or (frame.marker != 0xC2 and approx):
        return f"first scan of spectral selection {start}..{end}"
    if not quant.issuperset(frame.components[2::3]):
        return "a component's quantisation table is not defined before the first scan"
    ids = frame.components[0::3]
    for k in range(body + 1, body + 1 + 2 * count, 2):
        if data[k] not in ids:
            return f"first scan names component {data[k]}, not in the frame"
        if data[k + 1] >> 4 not in huffman or (end > 0 and 16 + (data[k + 1] & 15) not in huffman):
            return "a Huffman table of the first scan is not defined before it"
    return None


def _quant_tables(data: Bytes, body: int, length: int, found: set[int]) -> str | None:
    """Add the table ids of one DQT segment to `found`; a problem when its entries do not fill it exactly."""
    pos, end = body, body + length - 2
    while pos < end:
        precision, table = data[pos] >> 4, data[pos] & 15
        pos += 1 + 64 * (precision + 1)
        if precision > 1 or table > 3 or pos > end:
            return "malformed DQT segment"
        found.add(table)
    return None


def _huffman_tables(data: Bytes, body: int, length: int, found: set[int]) -> str | None:
    """Add 16 x class (0 DC, 1 AC) + id of the tables of one DHT segment to `found`; a problem as for DQT."""
    pos, end = body, body + length - 2
    while pos < end:
        kind, table = data[pos] >> 4, data[pos] & 15
        if pos + 17 > end:
            return "malformed DHT segment"
        pos += 17 + sum(data[pos + 1 : pos + 17])
        if kind > 1 or table > 3 or pos > end:
            return "malformed DHT segment"
        found.add(16 * kind + table)
    return None
