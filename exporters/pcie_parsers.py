"""Parsers of PCIe sysfs values and PCI addresses, on plain strings, and the link
arithmetic built on them (generation by rate, bytes per second after encoding)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from inferd.exporters.sysfs import parse_key_value_counts

_BDF = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_SPEED = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s")

# Transfer rate (GT/s) -> PCIe generation.
GENERATION_BY_SPEED = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}


# ---- parsers (plain strings) ----


def parse_link_speed(text: str) -> float | None:
    """GT/s from current_link_speed / max_link_speed: "16.0 GT/s PCIe" (kernel >= 4.19),
    "8 GT/s" (older); None for "Unknown speed" / "Unknown"."""
    match = _SPEED.match(text)
    if match:
        return float(match.group(1))
    if text.strip().lower().startswith("unknown"):
        return None
    raise ValueError(f"bad PCIe link speed {text!r}: expected like '16.0 GT/s PCIe'")


def parse_link_width(text: str) -> int:
    """Lanes from current_link_width / max_link_width ("16"; 0 means the link is down)."""
    try:
        width = int(text.strip())
    except ValueError:
        raise ValueError(f"bad PCIe link width {text!r}: expected an integer like '16'") from None
    if width < 0:
        raise ValueError(f"bad PCIe link width {text!r}: negative")
    return width


def parse_hex_id(text: str, what: str) -> int:
    try:
        return int(text.strip(), 16)
    except ValueError:
        raise ValueError(f"bad PCI {what} {text!r}: expected hex like '0x10de'") from None


def parse_aer_counters(text: str) -> dict[str, int]:
    """Counters by error name from an aer_dev_* file ("RxErr 0", "BadTLP 3", ...,
    "dev_cor_errs_bit[3] 5" for unnamed bits). The TOTAL_* line is dropped: it is the
    sum of the others, which PromQL can compute."""
    counts = parse_key_value_counts(text, source="aer_dev_* file")
    return {name: value for name, value in counts.items() if not name.startswith("TOTAL_")}


def generation_of(speed_gts: float | None) -> int | None:
    return GENERATION_BY_SPEED.get(speed_gts) if speed_gts is not None else None


def lane_bytes_per_second(speed_gts: float) -> float:
    """Payload bytes per second one lane carries in one direction at this rate.

    Gen1/2 (2.5, 5 GT/s) use 8b/10b encoding, Gen3-5 128b/130b. Gen6+ (64 GT/s, PAM4)
    uses 256-byte FLITs of which 242 carry TLP and DLLP bytes (the rest FEC and CRC).
    """
    if speed_gts <= 5.0:
        efficiency = 8 / 10
    elif speed_gts < 64.0:
        efficiency = 128 / 130
    else:
        efficiency = 242 / 256
    return speed_gts * 1e9 * efficiency / 8


def link_capacity_bytes_per_second(speed_gts: float | None, width: int | None) -> float | None:
    if speed_gts is None or width is None:
        return None
    return width * lane_bytes_per_second(speed_gts)


def bdf_sort_key(bdf: str) -> tuple[int, int, int, int]:
    match = _BDF.match(bdf)
    if not match:
        raise ValueError(f"bad PCI address {bdf!r}: expected DDDD:BB:DD.F")
    return tuple(int(group, 16) for group in match.groups())  # type: ignore[return-value]


def nvml_bus_id(bdf: str) -> str:
    """sysfs "0000:c3:00.0" -> NVML's "00000000:C3:00.0" (8-digit domain, upper case)."""
    domain, bus, device, function = bdf_sort_key(bdf)
    return f"{domain:08X}:{bus:02X}:{device:02X}.{function:X}"


def is_bdf(name: str) -> bool:
    return bool(_BDF.match(name))


# ---- config space: the PCI Express capability ----

PCI_STATUS = 0x06
PCI_STATUS_CAP_LIST = 0x10
PCI_CAPABILITY_LIST = 0x34
PCI_CAP_ID_EXP = 0x10
# offsets inside the PCI Express capability
PCI_EXP_DEVCAP, PCI_EXP_DEVCTL, PCI_EXP_LNKCAP, PCI_EXP_LNKCTL = 0x04, 0x08, 0x0C, 0x10
ASPM_STATES = {1: ("L0s",), 2: ("L1",), 3: ("L0s", "L1")}


@dataclass(frozen=True, slots=True)
class PcieCapability:
    """Max Payload Size (supported and set), Max Read Request Size and ASPM (supported
    and enabled) from a device's PCI Express capability."""

    mps_supported_bytes: int
    mps_bytes: int
    mrrs_bytes: int
    aspm_supported: tuple[str, ...]
    aspm_enabled: tuple[str, ...]


def parse_pcie_capability(config: bytes) -> PcieCapability | None:
    """The PCI Express capability from config-space bytes (sysfs `config`); None when the
    capability list does not reach it within the bytes given (unprivileged readers see
    only the first 64) or the device has none. ValueError on a malformed list."""
    if len(config) < 0x40:
        raise ValueError(f"config space holds {len(config)} bytes; the standard header alone is 64")
    if not int.from_bytes(config[PCI_STATUS : PCI_STATUS + 2], "little") & PCI_STATUS_CAP_LIST:
        return None
    pointer = config[PCI_CAPABILITY_LIST] & 0xFC
    seen = set()
    while pointer:
        if pointer in seen or pointer < 0x40:
            raise ValueError(f"config space capability list loops or points into the header (0x{pointer:02x})")
        seen.add(pointer)
        if pointer + PCI_EXP_LNKCTL + 2 > len(config):
            return None
        if config[pointer] == PCI_CAP_ID_EXP:
            return _pcie_capability(config, pointer)
        pointer = config[pointer + 1] & 0xFC
    return None


def _pcie_capability(config: bytes, base: int) -> PcieCapability:
    def word(offset: int, size: int) -> int:
        return int.from_bytes(config[base + offset : base + offset + size], "little")

    devcap, devctl = word(PCI_EXP_DEVCAP, 4), word(PCI_EXP_DEVCTL, 2)
    lnkcap, lnkctl = word(PCI_EXP_LNKCAP, 4), word(PCI_EXP_LNKCTL, 2)
    return PcieCapability(
        mps_supported_bytes=128 << (devcap & 0x7),
        mps_bytes=128 << ((devctl >> 5) & 0x7),
        mrrs_bytes=128 << ((devctl >> 12) & 0x7),
        aspm_supported=ASPM_STATES.get((lnkcap >> 10) & 0x3, ()),
        aspm_enabled=ASPM_STATES.get(lnkctl & 0x3, ()),
    )
