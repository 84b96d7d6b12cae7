"""Module EEPROM images of simulated transceivers (SFF-8636 rev 2.10a layout, see
sources/transceiver.py), so the agent's module parser runs on what the simulator writes."""

from __future__ import annotations

import struct


def _u16(x: float) -> int:
    return max(0, min(0xFFFF, round(x)))


def sff8636_image(temp_c: float, vcc_v: float, rx_w: list[float], tx_w: list[float], bias_a: list[float],
                  rx_los: tuple[bool, ...] = ()) -> bytes:
    """Lower page 00h + upper page 00h (256 bytes) of a QSFP28-style 4-lane module."""
    img = bytearray(256)
    img[0] = 0x11  # QSFP28
    img[1] = 0x08  # SFF-8636 rev 2.10a
    img[2] = 0x00  # paged
    los = 0
    for ch, dark in enumerate(rx_los):
        if dark:
            los |= 1 << ch
    img[3] = los  # Table 6-4: L-Rx LOS ch 1-4 in bits 0-3
    struct.pack_into(">h", img, 22, max(-32768, min(32767, round(temp_c * 256))))  # Table 6-7
    struct.pack_into(">H", img, 26, _u16(vcc_v * 1e4))
    for ch in range(4):  # Table 6-8
        struct.pack_into(">H", img, 34 + 2 * ch, _u16(rx_w[ch] * 1e7))
        struct.pack_into(">H", img, 42 + 2 * ch, _u16(bias_a[ch] / 2e-6))
        struct.pack_into(">H", img, 50 + 2 * ch, _u16(tx_w[ch] * 1e7))
    img[128] = 0x11
    return bytes(img)
