"""What vendors and firmware write where a site has not named a node: tables, not regexes in code.

Every entry is a string seen in real ``ibnetdiscover`` output, the kernel or rdma-core; whitespace is
compared collapsed (firmware pads ``MT4129 ConnectX7   Mellanox Technologies`` with spaces).
"""

from __future__ import annotations

# NodeDescriptions a CA carries before rdma-ndd (or the site) writes "%h %d": the firmware's own.
# Seen verbatim: "MT4129 ConnectX7   Mellanox Technologies" (NVIDIA/topograph
# tests/output/ibnetdiscover/example.out, 69 CAs) and "MT23108 InfiniHost Mellanox Technologies" (the
# ibnetdiscover(8) example, rdma-core).  The other rows follow the same "MT<PCI device id> <family>
# Mellanox Technologies" shape for the other ConnectX/BlueField device ids; add a row for a new family.
FIRMWARE_DEFAULT_CA_DESCRIPTIONS: frozenset[str] = frozenset({
    "MT23108 InfiniHost Mellanox Technologies",
    "MT25204 InfiniHostLx Mellanox Technologies",
    "MT25208 InfiniHostEx Mellanox Technologies",
    "MT25418 ConnectX Mellanox Technologies",
    "MT26418 ConnectX Mellanox Technologies",
    "MT26428 ConnectX Mellanox Technologies",
    "MT26438 ConnectX Mellanox Technologies",
    "MT4099 ConnectX3 Mellanox Technologies",
    "MT4103 ConnectX3Pro Mellanox Technologies",
    "MT4113 ConnectIB Mellanox Technologies",
    "MT4115 ConnectX4 Mellanox Technologies",
    "MT4117 ConnectX4Lx Mellanox Technologies",
    "MT4119 ConnectX5 Mellanox Technologies",
    "MT4121 ConnectX5Ex Mellanox Technologies",
    "MT4123 ConnectX6 Mellanox Technologies",
    "MT4125 ConnectX6Dx Mellanox Technologies",
    "MT4127 ConnectX6Lx Mellanox Technologies",
    "MT4129 ConnectX7 Mellanox Technologies",
    "MT4131 ConnectX8 Mellanox Technologies",
    "MT41682 BlueField2 Mellanox Technologies",
    "MT41686 BlueField2 Mellanox Technologies",
    "MT41692 BlueField3 Mellanox Technologies",
})

# First words that name no host: rdma-ndd writes "%h %d" from the hostname, which is one of these on a
# node booted before its name was set.
PLACEHOLDER_HOSTS: frozenset[str] = frozenset({"localhost", "localhost.localdomain", "(none)", "linux"})

# CAs that are not hosts: SHARP aggregation nodes live inside Quantum switches (a CA on the switch's
# last port, as in topograph's example.out port 65) and must not make that switch a leaf.
AGGREGATION_NODE_DESCRIPTIONS: frozenset[str] = frozenset({
    "Mellanox Technologies Aggregation Node",
    "NVIDIA Technologies Aggregation Node",
})

# Switch NodeDescriptions that are the vendor's default, not a name (several switches share them):
# such a switch is named switch-<guid>.  From the public outputs under tests/fixtures/topology_import
# ("SwitchIB Mellanox Technologies", "Infiniscale-IV Mellanox Technologies", "ISR9024 Voltaire") and
# the other Mellanox/NVIDIA switch families' firmware defaults.
VENDOR_DEFAULT_SWITCH_DESCRIPTIONS: frozenset[str] = frozenset({
    "MT43132 Mellanox Technologies",
    "MT47396 Infiniscale-III Mellanox Technologies",
    "Infiniscale-III Mellanox Technologies",
    "Infiniscale-IV Mellanox Technologies",
    "SwitchX - Mellanox Technologies",
    "SwitchX Mellanox Technologies",
    "SwitchIB Mellanox Technologies",
    "SwitchIB-2 Mellanox Technologies",
    "Switch-IB Mellanox Technologies",
    "Switch-IB 2 Mellanox Technologies",
    "Quantum Mellanox Technologies",
    "Quantum-2 Mellanox Technologies",
    "Quantum2 Mellanox Technologies",
    "Quantum-3 Mellanox Technologies",
    "Quantum3 Mellanox Technologies",
    "MellanoxIS5030",
    "MellanoxIS5035",
    "MellanoxIS5100",
    "MellanoxIS5200",
    "MellanoxIS5300",
    "MellanoxIS5600",
    "ISR9024 Voltaire",
    "ISR9024D Voltaire",
    "ISR9024D-M Voltaire",
    "SW-6IB4 Voltaire",
})

# The "MF0;" prefix Mellanox/NVIDIA managed switches put before the hostname ("MF0;leaf-a3:MQM9700/U1").
SWITCH_DESCRIPTION_PREFIXES: tuple[str, ...] = ("MF0;",)

# RDMA device names as the kernel registers them (ib_register_device name templates in
# drivers/infiniband/hw/*: "mlx5_%d", "mlx4_%d", "hfi1_%d", "bnxt_re%d", "irdma%d", ...): prefix, then a
# decimal index.  The second word of "gpu-a17-03 mlx5_3" is a device only when it has this shape.
RDMA_DEVICE_PREFIXES: tuple[str, ...] = (
    "mlx5_", "mlx4_", "mthca", "hfi1_", "qib", "bnxt_re", "irdma", "i40iw", "qedr", "efa_", "erdma_",
    "ionic_", "mana_", "hns_", "cxgb4_", "ocrdma", "vmw_pvrdma", "siw", "rxe", "usnic_",
)

# Link speed in ibnetdiscover's "4xNDR" column: Gb/s per lane of data (rate_show() in
# drivers/infiniband/core/sysfs.c), kept for the summary.
SPEED_GBPS_PER_LANE: dict[str, float] = {
    "SDR": 2.5, "DDR": 5.0, "QDR": 10.0, "FDR10": 10.0, "FDR": 14.0, "EDR": 25.0, "HDR": 50.0,
    "NDR": 100.0, "XDR": 200.0,
}
