"""The units of `toolkit plan`'s flags and table: bandwidths, durations and GPU counts read from text (a bad one is a
one-line error naming the flag), and written back for people."""
from __future__ import annotations

import re

from toolkit.errors import ToolkitError

_PREFIX = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_bandwidth(text: str, flag: str) -> float:
    """'25gbit', '100Mbit/s', '10gbps' (bits) or '300GB/s', '12.5GB' (bytes) -> bytes per second."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kKmMgGtT]?)(bit|bps|b|B)(?:/s|ps)?\s*", str(text))
    if not m or float(m.group(1)) <= 0:
        raise ToolkitError(f"{flag} {text!r}: expected a positive bandwidth with its unit, e.g. 25gbit, "
                           f"100mbit or 300GB/s (bit = bits/s, B = bytes/s)")
    value = float(m.group(1)) * _PREFIX[m.group(2).lower()]
    return value if m.group(3) == "B" else value / 8


def parse_duration(text: str, flag: str) -> float:
    """'5us', '0.5ms', '2s', '100ns' -> seconds (0 allowed)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(ns|us|µs|ms|s)\s*", str(text))
    if not m:
        raise ToolkitError(f"{flag} {text!r}: expected a time with its unit, e.g. 5us, 0.5ms or 2s")
    return float(m.group(1)) * {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2)]


def parse_counts(text: str, flag: str) -> list[int]:
    """'8,64,512' -> [8, 64, 512]: distinct, ascending, each at least 1."""
    try:
        counts = sorted({int(item) for item in str(text).split(",") if item.strip()})
    except ValueError:
        raise ToolkitError(f"{flag} {text!r}: expected whole numbers separated by commas, e.g. {flag} 8,64,512") \
            from None
    if not counts or counts[0] < 1:
        raise ToolkitError(f"{flag} {text!r}: every count must be at least 1, e.g. {flag} 8,64,512")
    return counts


def format_bandwidth(bytes_per_s: float) -> str:
    bits = bytes_per_s * 8
    for unit, scale in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.3g} {unit}"
    return f"{bits:.3g} bit/s"


def format_duration(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"
