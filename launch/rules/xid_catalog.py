"""NVIDIA's Xid catalogue: what each Xid the driver logs means, how bad it is and what to do.

Source: NVIDIA's "Analyzing Xid Errors with the Xid Catalog"
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), the catalogue for Ampere
and later GPUs (its downloadable sheet "Catalog", revision of October 2025: codes 1 to 172), and
its sheet "XID 144-150 Decode" for the NVLink5 errors. Each code here is NVIDIA's mnemonic, its
description and its *Resolution Bucket (Immediate Action)*; fleetrun's severity and action follow
from the bucket (``BUCKETS``), so the table is NVIDIA's, the judgement one line per bucket:

* ``RESET_GPU`` -> bad, action ``reset`` (the GPU, or the node when it cannot be reset alone);
* ``RESTART_BM`` / ``RESTART_VM`` (Xid 79: fallen off the bus) -> bad, ``drain`` (reboot the node);
* ``WORKFLOW_XID_48`` (double-bit ECC) and ``WORKFLOW_NVLINK_ERR`` (Xid 74) -> bad, ``reset``;
* ``RESTART_APP``, ``CHECK_APP/CUDA``, ``WORKFLOW_XID_45`` -> warn, ``application error`` (the
  job's own fault, or the sympathetic cleanup after another Xid, which is judged by itself);
* ``IGNORE``, ``CHECK_UVM``, ``UPDATE_SWFW``, ``CONTACT_SUPPORT`` on a code NVIDIA marks unused
  -> warn, action ``none`` / ``check``: said, never the reason a node is refused;
* ``CHECK_MECHANICALS`` (Xid 54: auxiliary power not connected) -> bad, ``replace`` (hands on);
* ``WORKFLOW_NVLINK5_ERR`` (144-150): the driver's line says ``Fatal`` or ``Nonfatal`` (the decode
  sheet's severity per unit and status bit): fatal -> bad, ``reset``; non-fatal -> warn;
* ``XID_154`` (GPU recovery action changed): the line names the recovery the driver now asks for
  (``GPU Reset Required``, ``Node Reboot Required``, ``Drain P2P``...): that action, bad; ``None``
  -> warn.

Codes 162 to 172 came without a bucket in the catalogue revision this was taken from; their level
is read from NVIDIA's description (``NO_BUCKET``) and said so. A code not in the catalogue is a
warning that names the code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["CATALOGUE", "XidMeaning", "xid_meaning"]

CATALOGUE: Mapping[int, tuple[str, str, str]] = {
    1: ("ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", "Unused", "CONTACT_SUPPORT"),
    2: ("ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT"),
    3: ("ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD", "Unused", "CONTACT_SUPPORT"),
    4: ("ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY", "Unused", "CONTACT_SUPPORT"),
    5: ("ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW", "Unused", "CONTACT_SUPPORT"),
    6: ("ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR", "Unused", "CONTACT_SUPPORT"),
    7: ("ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", "Unused", "CONTACT_SUPPORT"),
    8: ("ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", "RESTART_APP"),
    9: ("ROBUST_CHANNEL_GR_ERROR_INSTANCE", "Unused", "CONTACT_SUPPORT"),
    10: ("ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP", "Unused", "CONTACT_SUPPORT"),
    11: ("ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "Invalid or corrupted push buffer stream", "RESTART_APP"),
    12: ("ROBUST_CHANNEL_GR_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT"),
    13: ("ROBUST_CHANNEL_GR_EXCEPTION", "Graphics Engine Exception", "RESTART_APP"),
    14: ("ROBUST_CHANNEL_FAKE_ERROR", "Unused", "IGNORE"),
    15: ("ROBUST_CHANNEL_SCANLINE_TIMEOUT", "Unused", "CONTACT_SUPPORT"),
    16: ("ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", "Unused", "CONTACT_SUPPORT"),
    17: ("ROBUST_CHANNEL_PARAMETER_ERROR", "Unused", "CONTACT_SUPPORT"),
    18: ("ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR", "Unused", "CONTACT_SUPPORT"),
    19: ("ROBUST_CHANNEL_DISP_MISSED_NOTIFIER", "Unused", "CONTACT_SUPPORT"),
    20: ("ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT"),
    21: ("ROBUST_CHANNEL_ME_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT"),
    22: ("ROBUST_CHANNEL_VP_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT"),
    23: ("ROBUST_CHANNEL_RC_LOGGING_ENABLED", "Unused", "CONTACT_SUPPORT"),
    24: ("ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT", "Unused", "CONTACT_SUPPORT"),
    25: ("ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "Invalid or illegal push buffer stream", "RESTART_APP"),
    26: ("ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT", "Unused", "CONTACT_SUPPORT"),
    27: ("ROBUST_CHANNEL_VP_ERROR", "Unused", "CONTACT_SUPPORT"),
    28: ("ROBUST_CHANNEL_VP2_ERROR", "Unused", "CONTACT_SUPPORT"),
    29: ("ROBUST_CHANNEL_BSP_ERROR", "Unused", "CONTACT_SUPPORT"),
    30: ("ROBUST_CHANNEL_BAD_ADDR_ACCESS", "Unused", "CONTACT_SUPPORT"),
    31: ("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", "RESTART_APP"),
    32: ("ROBUST_CHANNEL_PBDMA_ERROR", "Invalid or corrupted push buffer stream", "RESTART_APP"),
    33: ("ROBUST_CHANNEL_SEC_ERROR", "Unused", "CONTACT_SUPPORT"),
    34: ("ROBUST_CHANNEL_MSVLD_ERROR", "Unused", "CONTACT_SUPPORT"),
    35: ("ROBUST_CHANNEL_MSPDEC_ERROR", "Unused", "CONTACT_SUPPORT"),
    36: ("ROBUST_CHANNEL_MSPPP_ERROR", "Unused", "CONTACT_SUPPORT"),
    37: ("ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "Driver firmware error", "IGNORE"),
    38: ("ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "Driver firmware error", "IGNORE"),
    39: ("ROBUST_CHANNEL_CE0_ERROR", "Copy Engine Exception", "RESTART_APP"),
    40: ("ROBUST_CHANNEL_CE1_ERROR", "Copy Engine Exception", "RESTART_APP"),
    41: ("ROBUST_CHANNEL_CE2_ERROR", "Copy Engine Exception", "RESTART_APP"),
    42: ("ROBUST_CHANNEL_VIC_ERROR", "Unused", "CONTACT_SUPPORT"),
    43: ("ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", "IGNORE"),
    44: ("ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "Graphics Engine fault during context switch", "IGNORE"),
    45: (
        "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
        "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda applications and hitting a DBE",
        "WORKFLOW_XID_45",
    ),
    46: ("ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing", "RESET_GPU"),
    47: ("ROBUST_CHANNEL_NVENC0_ERROR", "Unused", "CONTACT_SUPPORT"),
    48: ("ROBUST_CHANNEL_GPU_ECC_DBE", "Double Bit ECC Error", "WORKFLOW_XID_48"),
    49: ("SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY", "Unused", "CONTACT_SUPPORT"),
    50: ("SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR", "Unused", "CONTACT_SUPPORT"),
    51: ("SILENT_RUNNING_STRESS_TEST_FAILURE", "Unused", "CONTACT_SUPPORT"),
    52: ("SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE", "Unused", "CONTACT_SUPPORT"),
    53: ("SILENT_RUNNING_TEMP_REDUCED_CLOCKING", "Unused", "CONTACT_SUPPORT"),
    54: (
        "SILENT_RUNNING_PWR_REDUCED_CLOCKING",
        "Auxiliary power is not connected to the GPU board",
        "CHECK_MECHANICALS",
    ),
    55: ("SILENT_RUNNING_TEMPERATURE_READ_ERROR", "Unused", "CONTACT_SUPPORT"),
    56: ("DISPLAY_CHANNEL_EXCEPTION", "Unused", "CONTACT_SUPPORT"),
    57: ("FB_LINK_TRAINING_FAILURE_ERROR", "Unused", "CONTACT_SUPPORT"),
    58: ("FB_MEMORY_ERROR", "Unused", "CONTACT_SUPPORT"),
    59: ("PMU_ERROR", "Unused", "CONTACT_SUPPORT"),
    60: ("ROBUST_CHANNEL_SEC2_ERROR", "Video processor exception", "RESTART_APP"),
    61: ("PMU_BREAKPOINT", "Unused", "CONTACT_SUPPORT"),
    62: ("PMU_HALT_ERROR", "Internal micro-controller halt (newer drivers)", "RESET_GPU"),
    63: ("INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory remapping event", "IGNORE"),
    64: ("INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", "RESET_GPU"),
    65: ("ROBUST_CHANNEL_NVENC1_ERROR", "Unused", "CONTACT_SUPPORT"),
    66: ("ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "Illegal access by driver", "IGNORE"),
    67: ("ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "Illegal access by driver", "IGNORE"),
    68: ("ROBUST_CHANNEL_NVDEC0_ERROR", "NVDEC0 Exception", "RESTART_APP"),
    69: ("ROBUST_CHANNEL_GR_CLASS_ERROR", "Graphics Engine class error", "RESTART_APP"),
    70: ("ROBUST_CHANNEL_CE3_ERROR", "CE3: Unknown Error", "RESTART_APP"),
    71: ("ROBUST_CHANNEL_CE4_ERROR", "CE4: Unknown Error", "RESTART_APP"),
    72: ("ROBUST_CHANNEL_CE5_ERROR", "CE5: Unknown Error", "RESTART_APP"),
    73: ("ROBUST_CHANNEL_NVENC2_ERROR", "Unused", "CONTACT_SUPPORT"),
    74: ("NVLINK_ERROR", "NVLINK Error", "WORKFLOW_NVLINK_ERR"),
    75: ("ROBUST_CHANNEL_CE6_ERROR", "CE6: Unknown Error", "RESTART_APP"),
    76: ("ROBUST_CHANNEL_CE7_ERROR", "CE7: Unknown Error", "RESTART_APP"),
    77: ("ROBUST_CHANNEL_CE8_ERROR", "CE8: Unknown Error", "RESTART_APP"),
    78: ("VGPU_START_ERROR", "vGPU Start Error", "UPDATE_SWFW"),
    79: ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "RESTART_BM"),
    80: ("PBDMA_PUSHBUFFER_CRC_MISMATCH", "Corrupted data sent to GPU", "RESTART_APP"),
    81: ("ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", "Unused", "CONTACT_SUPPORT"),
    82: ("ROBUST_CHANNEL_NVJPG0_ERROR", "NVJPG0 Error", "RESTART_APP"),
    83: ("ROBUST_CHANNEL_NVDEC1_ERROR", "NVDEC1 Error", "RESTART_APP"),
    84: ("ROBUST_CHANNEL_NVDEC2_ERROR", "NVDEC2 Error", "RESTART_APP"),
    85: ("ROBUST_CHANNEL_CE9_ERROR", "CE9: Unknown Error", "RESTART_APP"),
    86: ("ROBUST_CHANNEL_OFA0_ERROR", "OFA Exception", "RESTART_APP"),
    87: ("NVTELEMETRY_DRIVER_REPORT", "Unused", "CONTACT_SUPPORT"),
    88: ("ROBUST_CHANNEL_NVDEC3_ERROR", "NVDEC3 Error", "RESTART_APP"),
    89: ("ROBUST_CHANNEL_NVDEC4_ERROR", "NVDEC4 Error", "RESTART_APP"),
    90: ("LTC_ERROR", "Unused", "CONTACT_SUPPORT"),
    91: ("RESERVED_XID", "Unused", "CONTACT_SUPPORT"),
    92: ("EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "IGNORE"),
    93: ("INFOROM_ERASE_LIMIT_EXCEEDED", "Non-fatal violation of provisioned InfoROM wear limit", "IGNORE"),
    94: ("ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error", "RESTART_APP"),
    95: ("ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error", "RESET_GPU"),
    96: ("ROBUST_CHANNEL_NVDEC5_ERROR", "NVDEC5 Error", "RESTART_APP"),
    97: ("ROBUST_CHANNEL_NVDEC6_ERROR", "NVDEC6 Error", "RESTART_APP"),
    98: ("ROBUST_CHANNEL_NVDEC7_ERROR", "NVDEC7 Error", "RESTART_APP"),
    99: ("ROBUST_CHANNEL_NVJPG1_ERROR", "NVJPG1 Error", "RESTART_APP"),
    100: ("ROBUST_CHANNEL_NVJPG2_ERROR", "NVJPG2 Error", "RESTART_APP"),
    101: ("ROBUST_CHANNEL_NVJPG3_ERROR", "NVJPG3 Error", "RESTART_APP"),
    102: ("ROBUST_CHANNEL_NVJPG4_ERROR", "NVJPG4 Error", "RESTART_APP"),
    103: ("ROBUST_CHANNEL_NVJPG5_ERROR", "NVJPG5 Error", "RESTART_APP"),
    104: ("ROBUST_CHANNEL_NVJPG6_ERROR", "NVJPG6 Error", "RESTART_APP"),
    105: ("ROBUST_CHANNEL_NVJPG7_ERROR", "NVJPG7 Error", "RESTART_APP"),
    106: ("SMBPBI_TEST_MESSAGE", "SMBPBI Test Message", "IGNORE"),
    107: ("SMBPBI_TEST_MESSAGE_SILENT", "SMBPBI Test Message Silent", "IGNORE"),
    108: ("NVLINK_REMOTE_TRANSLATION_ERROR", "Unused", "IGNORE"),
    109: ("ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "Context Switch Timeout Error", "RESET_GPU"),
    110: ("SEC_FAULT_ERROR", "Security Fault Error", "RESET_GPU"),
    111: ("BUNDLE_ERROR_EVENT", "Unused", "CONTACT_SUPPORT"),
    112: ("DISP_SUPERVISOR_ERROR", "Unused", "CONTACT_SUPPORT"),
    113: ("DP_LT_FAILURE", "Unused", "CONTACT_SUPPORT"),
    114: ("HEAD_RG_UNDERFLOW", "Unused", "CONTACT_SUPPORT"),
    115: ("CORE_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT"),
    116: ("WINDOW_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT"),
    117: ("CURSOR_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT"),
    118: ("HEAD_REGS", "Unused", "CONTACT_SUPPORT"),
    119: ("GSP_RPC_TIMEOUT", "GSP RPC Timeout", "RESET_GPU"),
    120: ("GSP_ERROR", "GSP Error", "RESET_GPU"),
    121: ("C2C_ERROR", "C2C Error", "IGNORE"),
    122: ("SPI_PMU_RPC_READ_FAIL", "Unused", "CONTACT_SUPPORT"),
    123: ("SPI_PMU_RPC_WRITE_FAIL", "Unused", "CONTACT_SUPPORT"),
    124: ("SPI_PMU_RPC_ERASE_FAIL", "Unused", "CONTACT_SUPPORT"),
    125: ("INFOROM_FS_ERROR", "Unused", "CONTACT_SUPPORT"),
    126: ("ROBUST_CHANNEL_CE10_ERROR", "CE10: Unknown Error", "RESTART_APP"),
    127: ("ROBUST_CHANNEL_CE11_ERROR", "CE11: Unknown Error", "RESTART_APP"),
    128: ("ROBUST_CHANNEL_CE12_ERROR", "CE12: Unknown Error", "RESTART_APP"),
    129: ("ROBUST_CHANNEL_CE13_ERROR", "CE13: Unknown Error", "RESTART_APP"),
    130: ("ROBUST_CHANNEL_CE14_ERROR", "CE14: Unknown Error", "RESTART_APP"),
    131: ("ROBUST_CHANNEL_CE15_ERROR", "CE15: Unknown Error", "RESTART_APP"),
    132: ("ROBUST_CHANNEL_CE16_ERROR", "CE16: Unknown Error", "RESTART_APP"),
    133: ("ROBUST_CHANNEL_CE17_ERROR", "CE17: Unknown Error", "RESTART_APP"),
    134: ("ROBUST_CHANNEL_CE18_ERROR", "CE18: Unknown Error", "RESTART_APP"),
    135: ("ROBUST_CHANNEL_CE19_ERROR", "CE19: Unknown Error", "RESTART_APP"),
    136: ("ALI_TRAINING_FAIL", "Link Training Failed", "RESET_GPU"),
    137: ("NVLINK_PRIV_ERR", "NVLink Privilege Error", "IGNORE"),
    138: ("ROBUST_CHANNEL_DLA_ERROR", "Unused", "CONTACT_SUPPORT"),
    139: ("ROBUST_CHANNEL_OFA1_ERROR", "OFA1 Error", "RESTART_APP"),
    140: ("UNRECOVERABLE_ECC_ERROR_ESCAPE", "ECC Unrecovered Error", "RESET_GPU"),
    141: ("ROBUST_CHANNEL_FAST_PATH_ERROR", "CUDA Fast Path Error", "IGNORE"),
    142: ("ROBUST_CHANNEL_NVENC3_ERROR", "NVENC3 Error", "CONTACT_SUPPORT"),
    143: ("GPU_INIT_ERROR", "GPU Initialization Error", "RESET_GPU"),
    144: ("NVLINK_SAW_ERROR", "NVLINK: SAW Error", "WORKFLOW_NVLINK5_ERR"),
    145: ("NVLINK_RLW_ERROR", "NVLINK: RLW Error", "WORKFLOW_NVLINK5_ERR"),
    146: ("NVLINK_TLW_ERROR", "NVLINK: TLW Error", "WORKFLOW_NVLINK5_ERR"),
    147: ("NVLINK_TREX_ERROR", "NVLINK: TREX Error", "WORKFLOW_NVLINK5_ERR"),
    148: ("NVLINK_NVLPW_CTRL_ERROR", "NVLINK: NVLPW_CTRL Error", "WORKFLOW_NVLINK5_ERR"),
    149: ("NVLINK_NETIR_ERROR", "NVLINK: NETIR Error", "WORKFLOW_NVLINK5_ERR"),
    150: ("NVLINK_MSE_ERROR", "NVLINK: MSE Error", "WORKFLOW_NVLINK5_ERR"),
    151: ("ROBUST_CHANNEL_KEY_ROTATION_ERROR", "Key rotation Error", "RESTART_VM"),
    152: ("ROBUST_CHANNEL_DLA_SMMU_ERROR", "DLA SMMU Error", "IGNORE"),
    153: ("ROBUST_CHANNEL_DLA_TIMEOUT", "DLA timeout Error", "IGNORE"),
    154: ("GPU_RECOVERY_ACTION_CHANGED", "GPU Recovery Action Changed", "XID_154"),
    155: ("NVLINK_SW_DEFINED_ERROR", "NVLINK: SW Defined Error", "RESET_GPU"),
    156: ("RESOURCE_RETIREMENT_EVENT", "Resource Retirement Event", "RESET_GPU"),
    157: ("RESOURCE_RETIREMENT_FAILURE", "Resource Retirement Failure", "IGNORE"),
    158: ("GPU_FATAL_TIMEOUT", "GPU Fatal Timeout", "RESET_GPU"),
    159: ("ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHI Non-Data Error", "CHECK_UVM"),
    160: ("CHANNEL_RETIREMENT_EVENT", "Channel Retirement Event", "IGNORE"),
    161: ("CHANNEL_RETIREMENT_FAILURE", "Channel Retirement Failure", "IGNORE"),
    162: ("PSHC_REENGAGED", "Power Smoothing HW Circuitry capability reengaged", ""),
    163: ("PSHC_DISENGAGED", "Power Smoothing HW Circuitry capability disengaged", ""),
    164: ("PSHC_LOW_LIFETIME", "Power Smoothing HW Circuitry low lifetime reached", ""),
    165: ("PSHC_ZERO_LIFETIME", "Power Smoothing HW Circuitry lifetime exhausted", ""),
    166: (
        "NVLINK_SECURE_CRYPTO_ERR",
        "CC traffic seen prior to link properly being configured for encrypted traffic",
        "",
    ),
    167: ("PCIE_FATAL_TIMEOUT", "PCIE_FATAL_TIMEOUT", ""),
    168: ("REDUCED_GPU_MEMORY_CAPACITY", "Errors found in WPR (write protected region)", ""),
    169: ("SEC2_HALT_ERROR", "Internal micro-controller halt", ""),
    170: ("NVLINK_SECURE_OTHER", "Interrupt seen in CC mode", ""),
    171: (
        "UNCORRECTABLE_DRAM_ERROR",
        "Additional to Xid 48 providing more details on particulars of fault to differentiate DRAM/SRAM",
        "",
    ),
    172: (
        "UNCORRECTABLE_SRAM_ERROR",
        "Additional to Xid 48 providing more details on particulars of fault to differentiate DRAM/SRAM",
        "",
    ),
}
"""Per code: (mnemonic, description, immediate-action bucket), as NVIDIA's catalogue gives them."""

BAD, WARN = "bad", "warn"

BUCKETS: Mapping[str, tuple[str, str]] = {
    "RESET_GPU": (BAD, "reset"),
    "RESTART_BM": (BAD, "drain"),
    "RESTART_VM": (BAD, "drain"),
    "WORKFLOW_XID_48": (BAD, "reset"),
    "WORKFLOW_NVLINK_ERR": (BAD, "reset"),
    "CHECK_MECHANICALS": (BAD, "replace"),
    "RESTART_APP": (WARN, "application error"),
    "CHECK_APP/CUDA": (WARN, "application error"),
    "WORKFLOW_XID_45": (WARN, "application error"),
    "IGNORE": (WARN, "none"),
    "CHECK_UVM": (WARN, "check"),
    "UPDATE_SWFW": (WARN, "check"),
    "CONTACT_SUPPORT": (WARN, "check"),
}
"""NVIDIA's immediate-action buckets as fleetrun's (level, action)."""

NO_BUCKET: Mapping[int, tuple[str, str]] = {
    162: (WARN, "none"),  # power smoothing circuitry re-engaged
    163: (WARN, "check"),  # power smoothing circuitry disengaged
    164: (WARN, "replace"),  # power smoothing circuitry near the end of its life
    165: (BAD, "replace"),  # power smoothing circuitry lifetime exhausted
    166: (BAD, "reset"),  # NVLink traffic before the link was set up for encryption
    167: (BAD, "drain"),  # PCIe fatal timeout
    168: (BAD, "reset"),  # errors in the write-protected region: less usable memory
    169: (BAD, "reset"),  # SEC2 micro-controller halt (as Xid 62 is for the PMU)
    170: (WARN, "check"),  # NVLink interrupt in confidential-computing mode
    171: (BAD, "reset"),  # uncorrectable DRAM error (details of an Xid 48)
    172: (BAD, "reset"),  # uncorrectable SRAM error (details of an Xid 48)
}
"""Codes the catalogue revision lists without a bucket: fleetrun's reading of the description."""

NVLINK5 = range(144, 151)
NVLINK5_FATAL = re.compile(r"\b(Non-?fatal|Fatal)\b", re.I)
RECOVERY = (
    ("node reboot required", "drain"),
    ("drain and reset", "drain"),
    ("drain p2p", "drain"),
    ("gpu reset required", "reset"),
)
"""Xid 154's recovery actions as the driver prints them, most drastic first."""


@dataclass(frozen=True)
class XidMeaning:
    code: int
    name: str
    """NVIDIA's description (its mnemonic where the description is only "Unused")."""
    level: str
    """``bad`` or ``warn``."""
    action: str
    """``reset``, ``drain``, ``replace``, ``application error``, ``check`` or ``none``."""
    known: bool = True


def xid_meaning(code: int, text: str = "") -> XidMeaning:
    """What Xid ``code`` means, with its line's ``text`` where the catalogue says the line decides
    (144-150: fatal or not; 154: the recovery asked for)."""
    found = CATALOGUE.get(code)
    if found is None:
        return XidMeaning(code, f"Xid {code} is not in NVIDIA's Xid catalogue", WARN, "check", known=False)
    mnemonic, description, bucket = found
    name = mnemonic.lower().replace("_", " ") if description == "Unused" else description
    if code in NVLINK5:
        severity = NVLINK5_FATAL.search(text)
        fatal = severity is not None and severity.group(1).lower() == "fatal"
        return XidMeaning(code, name, BAD if fatal else WARN, "reset" if fatal else "none")
    if code == 154:
        low = text.lower()
        low = low.rsplit(" to ", 1)[1] if " to " in low else low  # "changed from 0x0 (None) to 0x1 (...)"
        for words, action in RECOVERY:
            if words in low:
                return XidMeaning(code, name, BAD, action)
        return XidMeaning(code, name, WARN, "none")
    level, action = NO_BUCKET.get(code) or BUCKETS.get(bucket, (WARN, "check"))
    return XidMeaning(code, name, level, action)
