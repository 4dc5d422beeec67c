"""JPEG files written by hand for the decoder tests: frame types, precisions, component counts, sampling factors and
restart intervals that no installed encoder writes (Pillow writes 8-bit baseline or progressive, 4:4:4/4:2:2/4:2:0,
never lossless, 12-bit or 4:4:1; libjpeg-turbo 3's cjpeg is no Python package). Each is a real JPEG (ITU T.81):
Huffman-coded sequential DCT (SOF0/SOF1, 8 or 12-bit) with any sampling factors 1..4, or lossless (SOF3, 2..16-bit,
predictors 1..7); tests/test_decoder_fuzz.py checks Pillow decodes them to the pixels written. `corpus()` is the
fuzz corpus: these, marker edits of them (every other SOF type, missing tables, scan before frame...), truncations,
absurd sizes, and seeded byte flips of real or synthetic JPEGs."""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

ZIGZAG = np.array([
    0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13, 6, 7, 14, 21,
    28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54,
    47, 55, 62, 63])
_x = np.arange(8)
DCT = np.cos(np.pi * (2 * _x[None, :] + 1) * _x[:, None] / 16) * np.sqrt(2 / 8)
DCT[0] /= np.sqrt(2)
# Flat Huffman tables (every code of one length): valid for any data, so one pair serves every precision
DC_SYMBOLS, LOSSLESS_SYMBOLS = list(range(16)), list(range(17))  # magnitude categories (16: lossless only)
AC_SYMBOLS = [0x00, 0xF0] + [(run << 4) | size for run in range(16) for size in range(1, 15)]
DC_LENGTH, AC_LENGTH = 5, 8


def segment(marker: int, body: bytes) -> bytes:
    return b"\xff" + bytes([marker]) + struct.pack(">H", len(body) + 2) + body


class Bits:
    """Entropy-coded bytes: MSB first, FF stuffed with 00, padded with 1-bits."""

    def __init__(self) -> None:
        self.out, self.acc, self.count = bytearray(), 0, 0

    def put(self, code: int, length: int) -> None:
        self.acc, self.count = (self.acc << length) | (code & ((1 << length) - 1)), self.count + length
        while self.count >= 8:
            self.count -= 8
            byte = (self.acc >> self.count) & 0xFF
            self.out += b"\xff\x00" if byte == 0xFF else bytes([byte])
        self.acc &= (1 << self.count) - 1

    def flush(self) -> None:
        if self.count:
            self.put((1 << (8 - self.count)) - 1, 8 - self.count)


def _magnitude(value: int) -> tuple[int, int]:
    """(category, extra bits) of a DC difference or AC coefficient."""
    size = abs(value).bit_length()
    return size, (value if value >= 0 else value + (1 << size) - 1)


def _dht(kind: int, table: int, symbols: list[int], length: int) -> bytes:
    counts = [0] * 16
    counts[length - 1] = len(symbols)
    return bytes([(kind << 4) | table, *counts, *symbols])


def _ycc(pixels: np.ndarray, precision: int) -> np.ndarray:
    """RGB -> YCbCr (JFIF) at `precision` bits, floats."""
    r, g, b = (pixels[..., k].astype(np.float64) for k in range(3))
    centre = 1 << (precision - 1)
    y = 0.299 * r + 0.587 * g + 0.114 * b
    return np.stack([y, -0.168736 * r - 0.331264 * g + 0.5 * b + centre, 0.5 * r - 0.418688 * g - 0.081312 * b + centre],
                    axis=-1)


def _planes(pixels: np.ndarray, precision: int, ycc: bool) -> list[np.ndarray]:
    values = pixels.astype(np.float64) if pixels.ndim == 3 else pixels[..., None].astype(np.float64)
    if ycc and values.shape[2] == 3:
        values = np.clip(np.rint(_ycc(values, precision)), 0, (1 << precision) - 1)
    return [values[..., k] for k in range(values.shape[2])]


def _header(precision: int, width: int, height: int, sof: int, sampling: list[tuple[int, int]],
            quant: int | None, rgb: bool = False) -> bytes:
    """SOI, APP0 (JFIF: YCbCr) unless `rgb` (component ids R, G, B: libjpeg reads RGB), DQT, SOFn, DHT."""
    out = b"\xff\xd8"
    if len(sampling) == 3 and not rgb:
        out += segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
    if quant is not None:
        out += segment(0xDB, bytes([0x00 if quant < 256 else 0x10]) + (
            bytes([quant]) * 64 if quant < 256 else struct.pack(">64H", *[quant] * 64)))
    ids = b"RGB" if rgb else bytes(range(1, len(sampling) + 1))
    comps = b"".join(bytes([ids[k], (h << 4) | v, 0]) for k, (h, v) in enumerate(sampling))
    out += segment(sof, struct.pack(">BHHB", precision, height, width, len(sampling)) + comps)
    dc = _dht(0, 0, LOSSLESS_SYMBOLS if sof == 0xC3 else DC_SYMBOLS, DC_LENGTH)
    return out + segment(0xC4, dc + (b"" if sof == 0xC3 else _dht(1, 0, AC_SYMBOLS, AC_LENGTH)))


def _sos(count: int, start: int, end: int, rgb: bool = False) -> bytes:
    ids = b"RGB" if rgb else bytes(range(1, count + 1))
    return segment(0xDA, bytes([count]) + b"".join(bytes([ids[k], 0x00]) for k in range(count)) + bytes([start, end, 0]))


def _blocks(planes: list[np.ndarray], sampling: list[tuple[int, int]], width: int, height: int):
    """(component, 8x8 block) in scan order, MCU by MCU; one MCU's blocks as a list."""
    hmax, vmax = max(h for h, _ in sampling), max(v for _, v in sampling)
    if len(planes) == 1:  # a lone component is never interleaved: its own 8x8 blocks, whatever its factors
        hmax = vmax = 1
        sampling = [(1, 1)]
    mcux, mcuy = -(-width // (8 * hmax)), -(-height // (8 * vmax))
    grids = []
    for plane, (h, v) in zip(planes, sampling):
        full = np.pad(plane, ((0, mcuy * 8 * vmax - height), (0, mcux * 8 * hmax - width)), mode="edge")
        rows = (np.arange(mcuy * 8 * v) * vmax) // v  # point sampling: what the decoder upsamples back
        cols = (np.arange(mcux * 8 * h) * hmax) // h
        grids.append(full[np.ix_(rows, cols)])
    for my in range(mcuy):
        for mx in range(mcux):
            yield [(c, grids[c][(my * v + j) * 8:(my * v + j + 1) * 8, (mx * h + i) * 8:(mx * h + i + 1) * 8])
                   for c, (h, v) in enumerate(sampling) for j in range(v) for i in range(h)]


def dct_jpeg(pixels: np.ndarray, sampling: list[tuple[int, int]] | None = None, precision: int = 8,
             restart: int = 0, quant: int = 4, sof: int | None = None) -> bytes:
    """A sequential Huffman DCT JPEG of `pixels` ((h, w) grey or (h, w, 3) RGB -> YCbCr, or (h, w, n) components
    as they are) with `sampling` factors per component (default 1x1), restart markers every `restart` MCUs."""
    height, width = pixels.shape[:2]
    planes = _planes(pixels, precision, ycc=True)
    sampling = sampling or [(1, 1)] * len(planes)
    quant = quant if precision == 8 else quant * 16
    out = _header(precision, width, height, sof or (0xC0 if precision == 8 else 0xC1), sampling, quant)
    if restart:
        out += segment(0xDD, struct.pack(">H", restart))
    bits, last, shift = Bits(), [0] * len(planes), 1 << (precision - 1)
    data = bytearray()
    for n, mcu in enumerate(_blocks(planes, sampling, width, height)):
        if restart and n and n % restart == 0:
            bits.flush()
            data += bits.out + bytes([0xFF, 0xD0 + (n // restart - 1) % 8])
            bits, last = Bits(), [0] * len(planes)
        for c, block in mcu:
            coef = np.rint((DCT @ (block - shift) @ DCT.T).ravel()[ZIGZAG] / quant).astype(int).tolist()
            size, extra = _magnitude(coef[0] - last[c])
            last[c] = coef[0]
            bits.put(size, DC_LENGTH)
            bits.put(extra, size)
            _ac(bits, coef)
    bits.flush()
    return bytes(out + _sos(len(planes), 0, 63) + data + bits.out + b"\xff\xd9")


def _ac(bits: Bits, coef: list[int]) -> None:
    run = 0
    for value in coef[1:]:
        if value == 0:
            run += 1
            continue
        while run > 15:
            bits.put(AC_SYMBOLS.index(0xF0), AC_LENGTH)
            run -= 16
        size, extra = _magnitude(value)
        bits.put(AC_SYMBOLS.index((run << 4) | size), AC_LENGTH)
        bits.put(extra, size)
        run = 0
    if run:
        bits.put(AC_SYMBOLS.index(0x00), AC_LENGTH)


def lossless_jpeg(pixels: np.ndarray, precision: int = 8, predictor: int = 1, ycc: bool = False) -> bytes:
    """A lossless JPEG (SOF3, Huffman) of `pixels` ((h, w) or (h, w, n), values below 2**precision), every
    component 1x1, the first scan holding them all; RGB stored as RGB (as libjpeg-turbo's cjpeg -lossless does:
    its lossless decoder converts no colours) unless `ycc`."""
    height, width = pixels.shape[:2]
    planes = [p.astype(np.int64) for p in _planes(pixels, precision, ycc)]
    rgb = len(planes) == 3 and not ycc
    out = _header(precision, width, height, 0xC3, [(1, 1)] * len(planes), None, rgb)
    bits = Bits()
    for y in range(height):
        for x in range(width):
            for plane in planes:
                diff = (int(plane[y, x]) - _prediction(plane, y, x, precision, predictor)) % 65536
                diff = diff - 65536 if diff > 32768 else diff
                size, extra = (16, 0) if diff == 32768 else _magnitude(diff)
                bits.put(size, DC_LENGTH)
                if size < 16:
                    bits.put(extra, size)
    bits.flush()
    return bytes(out + _sos(len(planes), predictor, 0, rgb) + bits.out + b"\xff\xd9")


def _prediction(plane: np.ndarray, y: int, x: int, precision: int, predictor: int) -> int:
    if x == 0 and y == 0:
        return 1 << (precision - 1)
    if y == 0:
        return int(plane[0, x - 1])
    if x == 0:
        return int(plane[y - 1, 0])
    a, b, c = int(plane[y, x - 1]), int(plane[y - 1, x]), int(plane[y - 1, x - 1])
    return [a, b, c, a + b - c, a + ((b - c) >> 1), b + ((a - c) >> 1), (a + b) >> 1][predictor - 1]


def smooth(width: int, height: int, seed: int = 0, channels: int = 3, peak: int = 255) -> np.ndarray:
    """Gradients plus mild noise: a photo-like picture that survives coarse quantisation."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    base = [x / max(width, 1), y / max(height, 1), (x + y) / max(width + height, 1)]
    noise = np.random.default_rng(seed).normal(0, 0.02, (height, width, channels))
    picture = np.stack([base[k % 3] for k in range(channels)], axis=-1) * 0.8 + 0.1 + noise
    out = np.clip(np.rint(picture * peak), 0, peak).astype(np.uint16 if peak > 255 else np.uint8)
    return out[..., 0] if channels == 1 else out


# ---------------------------------------------------------------- the fuzz corpus


@dataclass(frozen=True)
class Case:
    name: str
    data: bytes
    valid: bool  # a complete JPEG (or image) Pillow decodes: every decoder path must return an image of it
    native: bool | None  # the gate (imagenet_parquet.markers) must (True) or must not (False) pass it; None: either
    size: tuple[int, int] | None = None  # (width, height) the image has, when valid


def pillow_jpeg(pixels: np.ndarray, **save) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", **save)
    return buf.getvalue()


def replace_marker(data: bytes, old: int, new: int) -> bytes:
    at = data.index(b"\xff" + bytes([old]))
    return data[:at + 1] + bytes([new]) + data[at + 2:]


def drop_segment(data: bytes, marker: int) -> bytes:
    at = data.index(b"\xff" + bytes([marker]))
    length = struct.unpack_from(">H", data, at + 2)[0]
    return data[:at] + data[at + 2 + length:]


def with_size(data: bytes, width: int, height: int) -> bytes:
    """The same bytes with the frame header claiming another size."""
    at = next(data.index(b"\xff" + bytes([m])) for m in (0xC0, 0xC1, 0xC2, 0xC3) if b"\xff" + bytes([m]) in data)
    return data[:at + 5] + struct.pack(">HH", height, width) + data[at + 9:]


def valid_cases() -> list[Case]:
    """Complete JPEGs: each valid one the gate passes, and each the native decoders must not see."""
    rgb, gray = smooth(37, 29, 1), smooth(37, 29, 2, channels=1)
    cases = [
        Case("baseline 4:2:0 (Pillow)", pillow_jpeg(smooth(64, 48, 3)), True, True, (64, 48)),
        Case("progressive (Pillow)", pillow_jpeg(smooth(64, 48, 4), progressive=True), True, True, (64, 48)),
        Case("restart markers (Pillow)", pillow_jpeg(smooth(80, 40, 5), restart_marker_blocks=2), True, True, (80, 40)),
        Case("1x1 (Pillow)", pillow_jpeg(smooth(1, 1, 6)), True, True, (1, 1)),
        Case("1x1 gray", dct_jpeg(smooth(1, 1, 6, channels=1)), True, True, (1, 1)),
        Case("1x900 (Pillow)", pillow_jpeg(smooth(1, 900, 7)), True, True, (1, 900)),
        Case("1500x1 (Pillow)", pillow_jpeg(smooth(1500, 1, 8)), True, True, (1500, 1)),
        Case("2x700 4:2:0", dct_jpeg(smooth(2, 700, 9), [(2, 2), (1, 1), (1, 1)]), True, True, (2, 700)),
        Case("CMYK (Pillow)", _cmyk(), True, False, (40, 30)),
        Case("lossless 16x16", lossless_jpeg(smooth(16, 16, 11)), True, False, (16, 16)),
        Case("lossless 500x375", lossless_jpeg(smooth(500, 375, 12)), True, False, (500, 375)),
        Case("lossless gray predictor 7", lossless_jpeg(smooth(40, 30, 13, channels=1), predictor=7), True, False,
             (40, 30)),
        Case("lossless YCbCr (no colour conversion in lossless mode)", lossless_jpeg(smooth(16, 16, 11), ycc=True),
             False, False),
        Case("lossless 12-bit", lossless_jpeg(smooth(24, 16, 14, peak=4095), precision=12), False, False),
        Case("lossless 16-bit", lossless_jpeg(smooth(24, 16, 15, peak=65535), precision=16), False, False),
        Case("12-bit DCT (SOF1)", dct_jpeg(smooth(24, 16, 16, peak=4095), precision=12), False, False),
    ]
    for name, factors in [("4:4:4", [(1, 1)] * 3), ("4:2:2", [(2, 1), (1, 1), (1, 1)]),
                          ("4:2:0", [(2, 2), (1, 1), (1, 1)]), ("4:4:0", [(1, 2), (1, 1), (1, 1)]),
                          ("4:1:1", [(4, 1), (1, 1), (1, 1)])]:
        cases.append(Case(f"{name} written by hand", dct_jpeg(rgb, factors), True, True, (37, 29)))
        cases.append(Case(f"{name} restart every MCU", dct_jpeg(rgb, factors, restart=1), True, True, (37, 29)))
    for name, factors in [("4:4:1", [(1, 4), (1, 1), (1, 1)]), ("4:4:1 large", [(1, 4), (1, 1), (1, 1)]),
                          ("4:1:0", [(4, 2), (1, 1), (1, 1)]), ("3x1 luma", [(3, 1), (1, 1), (1, 1)]),
                          ("2x3 luma", [(2, 3), (1, 1), (1, 1)]),
                          ("4:4:4 spelled 2x2,2x1,2x1", [(2, 2), (2, 1), (2, 1)]),
                          ("chroma 2x1, luma 1x1", [(1, 1), (2, 1), (1, 1)]),
                          ("chroma 1x2, luma 2x2", [(2, 2), (1, 2), (1, 2)])]:
        pixels = smooth(500, 375, 17) if "large" in name else rgb
        cases.append(Case(name, dct_jpeg(pixels, factors), True, False, pixels.shape[1::-1]))
    for name, factors in [("4x4 luma", [(4, 4), (1, 1), (1, 1)]), ("2x2 each", [(2, 2), (2, 2), (2, 2)])]:
        cases.append(Case(f"{name}: over T.81's 10 blocks per MCU", dct_jpeg(rgb, factors), False, False))
    cases.append(Case("gray sampled 2x2", dct_jpeg(gray, [(2, 2)]), True, False, (37, 29)))
    cases.append(Case("4:4:1 restart every MCU", dct_jpeg(rgb, [(1, 4), (1, 1), (1, 1)], restart=1), True, False,
                      (37, 29)))
    return cases


def _cmyk() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(smooth(40, 30, 10)).convert("CMYK").save(buf, "JPEG")
    return buf.getvalue()


def _sof_at(data: bytes) -> int:
    return next(k for k in range(2, len(data) - 1) if data[k] == 0xFF and 0xC0 <= data[k + 1] <= 0xCF
                and data[k + 1] not in (0xC4, 0xC8, 0xCC))


def _segment_at(data: bytes, at: int) -> bytes:
    return data[at:at + 2 + struct.unpack_from(">H", data, at + 2)[0]]


def edited_cases() -> list[Case]:
    """Marker edits of complete JPEGs: every other frame type over baseline data, tables missing or misnamed,
    segments out of order, absurd sizes, truncations at every header boundary."""
    base = dct_jpeg(smooth(48, 32, 20), [(2, 2), (1, 1), (1, 1)])
    sof = _segment_at(base, _sof_at(base))
    sos = base.index(b"\xff\xda")
    cases = [Case("SOF1 over baseline data (a valid extended JPEG)", replace_marker(base, 0xC0, 0xC1), True, True,
                  (48, 32))]
    for marker in [0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF]:
        cases.append(Case(f"SOF{marker - 0xC0} marker over baseline data", replace_marker(base, 0xC0, marker), False,
                          False))
    cases += [
        Case("no DQT", drop_segment(base, 0xDB), False, False),
        Case("no DHT (libjpeg's default tables)", drop_segment(base, 0xC4), False, False),
        Case("no SOF", drop_segment(base, 0xC0), False, False),
        Case("SOF after SOS", base[:sos].replace(sof, b"") + base[sos:sos + 14] + sof + base[sos + 14:], False, False),
        Case("two SOF", base[:sos] + sof + base[sos:], False, False),
        Case("DHP marker (hierarchical)", base[:sos] + segment(0xDE, sof[4:]) + base[sos:], False, False),
        Case("height 0 (DNL)", with_size(base, 48, 0), False, False),
        Case("65535x65535 claimed", with_size(base, 65535, 65535), False, False),
        Case("65500x65500 claimed", with_size(base, 65500, 65500), False, False),
        Case("20000x4000 claimed", with_size(base, 20000, 4000), False, False),
        Case("4000x3000 claimed (plausible size, data for less)", with_size(base, 4000, 3000), False, None),
        Case("quantisation table id 5", base.replace(sof, sof[:11] + bytes([5]) + sof[12:]), False, False),
        Case("scan names Huffman table 3", base[:sos + 6] + bytes([0x33]) + base[sos + 7:], False, False),
        Case("scan names component 9", base[:sos + 5] + bytes([9]) + base[sos + 6:], False, False),
        Case("scan spectral selection 1..63", base[:sos + 10] + bytes([1]) + base[sos + 11:], False, False),
        Case("2 components", dct_jpeg(smooth(24, 16, 21, channels=2)), False, False),
        Case("4 components, no Adobe marker", dct_jpeg(smooth(24, 16, 22, channels=4)), False, False),
        Case("not a JPEG", b"GIF89a" + bytes(100), False, False),
        Case("empty", b"", False, False),
        Case("SOI only", b"\xff\xd8", False, False),
    ]
    for cut in sorted({2, 4, 20, _sof_at(base) + 5, sos, sos + 14, sos + 40, len(base) // 2, len(base) - 2}):
        cases.append(Case(f"baseline cut at byte {cut} of {len(base)}", base[:cut], False, None))
    lossless = lossless_jpeg(smooth(64, 48, 23))
    for cut in (len(lossless) // 3, len(lossless) - 2):
        cases.append(Case(f"lossless cut at byte {cut}", lossless[:cut], False, False))
    return cases


def synthetic_bases() -> list[bytes]:
    """JPEGs to flip bytes of when ../shared (the real samples) is absent: every encoder path above."""
    return [pillow_jpeg(smooth(120, 90, 30)), pillow_jpeg(smooth(90, 120, 31), progressive=True),
            pillow_jpeg(smooth(100, 60, 32), restart_marker_blocks=3, subsampling=0),
            pillow_jpeg(smooth(64, 64, 33)[..., 0]), dct_jpeg(smooth(70, 50, 34), [(4, 1), (1, 1), (1, 1)]),
            dct_jpeg(smooth(70, 50, 35), [(1, 4), (1, 1), (1, 1)], restart=2), lossless_jpeg(smooth(40, 30, 36))]


def flipped(bases: list[bytes], count: int, seed: int) -> list[Case]:
    """`count` mutants of `bases`: 1-4 bytes set to random or marker-like values (half of them within the
    header, where the markers are), or the file cut short (one in ten)."""
    special = [0x00, 0xFF, 0xC0, 0xC2, 0xC3, 0xC4, 0xD9, 0xDA, 0xDB, 0xDD, 0x11, 0x14, 0x41, 0x44, 0x22, 0x08, 0x0C]
    cases = []
    for i in range(count):
        rng = np.random.default_rng([seed, i])
        base = bases[i % len(bases)]
        data = bytearray(base)
        if rng.random() < 0.1:
            cut = int(rng.integers(2, len(base)))
            cases.append(Case(f"flip {i}: base {i % len(bases)} cut at {cut}", bytes(data[:cut]), False, None))
            continue
        header = base.find(b"\xff\xda") + 14 if b"\xff\xda" in base else len(base)
        for _ in range(int(rng.integers(1, 5))):
            at = int(rng.integers(2, header if rng.random() < 0.5 else len(base)))
            data[at] = int(rng.choice(special)) if rng.random() < 0.4 else int(rng.integers(0, 256))
        cases.append(Case(f"flip {i}: base {i % len(bases)}", bytes(data), False, None))
    return cases


def corpus(samples: Path | None, flips: int, seed: int = 48) -> list[Case]:
    """The fuzz corpus: valid_cases + edited_cases + `flips` mutants of real sample JPEGs (every 10th of
    `samples`, when given) and of the synthetic bases."""
    bases = synthetic_bases()
    if samples is not None:
        bases += [path.read_bytes() for path in sorted(samples.glob("*.JPEG"))[::10]]
    return valid_cases() + edited_cases() + flipped(bases, flips, seed)
