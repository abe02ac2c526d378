"""The CPU this process runs on, as the kernels see it: its model, the features that decide ONNX
Runtime's kernels, and which 8-bit product kernel ONNX Runtime's MLAS picks for uint8 x int8.

The features are read the way MLAS reads them (onnxruntime/core/mlas/lib/platform.cpp): on x86-64
the CPUID instruction and XGETBV (a feature counts only where the OS saves its registers), on ARM64
the kernel's auxiliary vector (getauxval). Not /proc/cpuinfo: under an emulator (qemu-user) or a
hypervisor that masks features, what the instructions report is what the kernels run.

CPUID runs from a few bytes of machine code mapped read-and-execute from a memfd (never a writable
and executable page, so the daemon keeps working under MemoryDenyWriteExecute=).
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import platform
from dataclasses import dataclass

# cpuid(leaf, subleaf, out[4]): eax, ebx, ecx, edx into out (System V AMD64 ABI)
_CPUID = bytes.fromhex("53" "4989d0" "89f8" "89f1" "0fa2" "418900" "41895804" "41894808" "4189500c" "5b" "c3")
# xgetbv(index) -> edx:eax
_XGETBV = bytes.fromhex("89f9" "0f01d0" "48c1e220" "4809d0" "c3")

SATURATING = ("avx2", "avx512")
"""Kernels whose uint8 x int8 products sum pairs into 16 bits with saturation (vpmaddubsw): ONNX
Runtime's quantization guide, "On x86-64 machines with AVX2 and AVX512 extensions, ORT uses the
VPMADDUBSW instruction for U8S8 ... this instruction might suffer from saturation issues"."""
DOT = ("avx-vnni", "avx512-vnni", "amx", "neon-dot", "neon-i8mm")
"""Kernels with 8-bit dot-product instructions summing into 32 bits: exact, and faster than fp32."""


@dataclass(frozen=True)
class Cpu:
    model: str
    arch: str
    features: tuple[str, ...]
    """Those that decide the kernels: avx2 fma avx512f avx512_core avx512_vnni avx_vnni avx512_bf16
    amx_int8 (x86-64); neon dotprod i8mm bf16 sve (ARM64)."""
    int8_products: str
    """The uint8 x int8 product kernel MLAS picks: sse, avx2, avx-vnni, avx512, avx512-vnni, amx (x86-64);
    neon, neon-dot, neon-i8mm (ARM64); generic elsewhere."""

    @property
    def int8_saturates(self) -> bool:
        return self.int8_products in SATURATING

    def line(self) -> str:
        """One line for logs and benchmark headers."""
        features = " ".join(self.features) or "no vector features"
        return f"{self.model} ({self.arch}: {features}; int8 products: {self.int8_products})"

    def to_json(self) -> dict:
        return {"model": self.model, "arch": self.arch, "features": list(self.features),
                "int8_products": self.int8_products, "int8_saturates": self.int8_saturates}


@functools.cache
def this_cpu() -> Cpu:
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        try:
            return _x86()
        except OSError as exc:  # the probe's page could not be mapped: the kernels stay unknown, and say so
            return Cpu(_proc_model() or machine, "x86_64", (), f"unknown (CPUID probe failed: {exc})")
    if machine in ("aarch64", "arm64"):
        return _arm64()
    return Cpu(_proc_model() or machine, machine, (), "generic")


def classify_x86(features: set[str]) -> str:
    """The U8S8 kernel MLAS's platform.cpp picks for these features (each later check overrides)."""
    kernel = "sse"
    if "avx2" in features and "fma" in features:
        kernel = "avx2"
        if "avx_vnni" in features:
            kernel = "avx-vnni"
        if "avx512f" in features and "avx512_core" in features:
            kernel = "avx512"
            if "avx512_vnni" in features:
                kernel = "avx512-vnni"
        if "amx_int8" in features:
            kernel = "amx"
    return kernel


def classify_arm64(features: set[str]) -> str:
    if "i8mm" in features:
        return "neon-i8mm"
    return "neon-dot" if "dotprod" in features else "neon"


def _x86() -> Cpu:
    cpuid, xgetbv = _machine_code()
    leaf0 = cpuid(0, 0)
    leaf1 = cpuid(1, 0)
    leaf7 = cpuid(7, 0) if leaf0[0] >= 7 else (0, 0, 0, 0)
    leaf7_1 = cpuid(7, 1) if leaf0[0] >= 7 and leaf7[0] >= 1 else (0, 0, 0, 0)
    xcr0 = xgetbv(0) if leaf1[2] >> 27 & 1 else 0  # OSXSAVE: else XGETBV faults
    avx_os, avx512_os, amx_os = xcr0 & 0x6 == 0x6, xcr0 & 0xE0 == 0xE0, xcr0 & 0x60000 == 0x60000
    bit = lambda word, n: bool(word >> n & 1)  # noqa: E731
    found = {
        "avx2": avx_os and bit(leaf1[2], 28) and bit(leaf7[1], 5),
        "fma": avx_os and bit(leaf1[2], 12),
        "avx_vnni": avx_os and bit(leaf7_1[0], 4),
        "avx512f": avx512_os and bit(leaf7[1], 16),
        "avx512_core": avx512_os and leaf7[1] & 0xC0020000 == 0xC0020000,  # BW, DQ, VL
        "avx512_vnni": avx512_os and bit(leaf7[2], 11),
        "avx512_bf16": avx512_os and bit(leaf7_1[0], 5),
        "amx_int8": amx_os and bit(leaf7[3], 24) and bit(leaf7[3], 25),
    }
    features = {name for name, has in found.items() if has}
    order = list(found)
    return Cpu(_brand(cpuid) or _proc_model() or "x86-64", "x86_64", tuple(f for f in order if f in features),
               classify_x86(features))


def _brand(cpuid) -> str:
    if cpuid(0x80000000, 0)[0] < 0x80000004:
        return ""
    words = [w for leaf in (0x80000002, 0x80000003, 0x80000004) for w in cpuid(leaf, 0)]
    return b"".join(w.to_bytes(4, "little") for w in words).split(b"\0")[0].decode("ascii", "replace").strip()


def _arm64() -> Cpu:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.getauxval.restype, libc.getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
    hwcap, hwcap2 = libc.getauxval(16), libc.getauxval(26)  # AT_HWCAP, AT_HWCAP2
    found = {"neon": hwcap >> 1 & 1, "dotprod": hwcap >> 20 & 1, "i8mm": hwcap2 >> 13 & 1,
             "bf16": hwcap2 >> 14 & 1, "sve": hwcap >> 22 & 1}
    features = {name for name, has in found.items() if has}
    return Cpu(_proc_model() or "ARM64", "aarch64", tuple(f for f in found if f in features), classify_arm64(features))


def _proc_model() -> str:
    """The model from /proc/cpuinfo ("model name"; on ARM64 the board's device-tree model and the core's part)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return ""
    if fields.get("model name"):
        return fields["model name"]
    board = ""
    try:
        with open("/proc/device-tree/model", "rb") as f:
            board = f.read().rstrip(b"\0").decode("ascii", "replace")
    except OSError:
        pass
    part = fields.get("CPU part", "")
    core = {"0xd42": "Cortex-A78AE", "0xd41": "Cortex-A78", "0xd0c": "Neoverse-N1", "0xd40": "Neoverse-V1",
            "0xd4f": "Neoverse-V2", "0xd08": "Cortex-A72", "0xd03": "Cortex-A53", "0x004": "Carmel"}.get(part, part)
    return ", ".join(x for x in (board, core) if x)


def _machine_code():
    """cpuid(leaf, subleaf) -> (eax, ebx, ecx, edx) and xgetbv(index) -> int, run from one read+exec page."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    fd = os.memfd_create("edged-cpuid")
    try:
        os.write(fd, _CPUID.ljust(64, b"\xcc") + _XGETBV)
        os.ftruncate(fd, mmap.PAGESIZE)
        page = libc.mmap(None, mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_EXEC, mmap.MAP_SHARED, fd, 0)
    finally:
        os.close(fd)
    if page in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), f"cannot map the CPUID probe: {os.strerror(ctypes.get_errno())}")
    raw = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32 * 4))(page)
    xgetbv = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint32)(page + 64)

    def cpuid(leaf: int, subleaf: int) -> tuple[int, int, int, int]:
        out = (ctypes.c_uint32 * 4)()
        raw(leaf, subleaf, ctypes.byref(out))
        return tuple(out)

    return cpuid, xgetbv
