"""The GPU facts' lookups (fp8lab.core.hardware, fp8attn.generation): what each answers for the GPU names fp8lab meets.

Pinned from the code before the facts moved into one table (hB's review mend), so that move changed no answer.
Names are as torch.cuda.get_device_name() reports them, or as fp8lab.core.hardware.INSTANCES writes them. Some answers
are the tables' fallbacks rather than data-sheet facts (a GH200's memory is the H200's): pinned as they are. Two
fallbacks were wrong and are mended after the move: torch's "NVIDIA A100-SXM4-80GB" got the 40 GB part's memory
and bandwidth, and an L40 matched "L4" (121 TFLOP/s instead of its 181).
"""
import pytest

from fp8lab.plan import fp8attn
from fp8lab.core import hardware as hw

# name: (generation, memory GiB, dense BF16 FLOP/s, dense FP8 FLOP/s, HBM bytes/s, NVLink bytes/s per direction)
PINNED = {
    "NVIDIA H100 80GB HBM3": ("hopper", 79.2, 989e12, 1979e12, 3.35e12, 450e9),
    "NVIDIA H100 PCIe": ("hopper", 79.2, 756e12, 1513e12, 2.0e12, 450e9),
    "NVIDIA H100 NVL": ("hopper", 79.2, 835e12, 1671e12, 3.9e12, 450e9),
    "NVIDIA H200": ("hopper", 139.8, 989e12, 1979e12, 4.8e12, 450e9),
    "NVIDIA H200 NVL": ("hopper", 139.8, 989e12, 1979e12, 4.8e12, 450e9),
    "NVIDIA GH200 480GB": ("hopper", 139.8, 989e12, 1979e12, 4.8e12, 450e9),
    "NVIDIA H800": ("hopper", None, 989e12, 1979e12, 3.35e12, None),
    "NVIDIA H20": ("hopper", None, None, None, None, None),
    "NVIDIA B200": ("blackwell", 178.4, 2250e12, 4500e12, 8.0e12, 900e9),
    "NVIDIA GB200": ("blackwell", 178.4, 2250e12, 4500e12, 8.0e12, 900e9),
    "NVIDIA B100": ("blackwell", None, 1750e12, 3500e12, 8.0e12, None),
    "NVIDIA B300": ("blackwell", None, None, None, None, None),
    "NVIDIA A100-SXM4-80GB": (None, 79.2, 312e12, None, 2.0e12, 300e9),
    "NVIDIA A100-SXM4-40GB": (None, 39.4, 312e12, None, 1.555e12, 300e9),
    "NVIDIA A100 80GB PCIe": (None, 79.2, 312e12, None, 2.0e12, 300e9),
    "NVIDIA L40S": (None, None, 362e12, 733e12, 0.864e12, None),
    "NVIDIA L4": (None, None, 121e12, 242e12, 0.3e12, None),
    "NVIDIA L40": (None, None, 181e12, 362e12, 0.864e12, None),
    "Tesla T4": (None, None, None, None, None, None),
    "H100 80GB": ("hopper", 79.2, 989e12, 1979e12, 3.35e12, 450e9),
    "H200 141GB": ("hopper", 139.8, 989e12, 1979e12, 4.8e12, 450e9),
    "B200 180GB": ("blackwell", 178.4, 2250e12, 4500e12, 8.0e12, 900e9),
    "A100 40GB": (None, 39.4, 312e12, None, 1.555e12, 300e9),
    "A100 80GB": (None, 79.2, 312e12, None, 2.0e12, 300e9),
    "cpu": (None, None, None, None, None, None),
    "Some Future GPU": (None, None, None, None, None, None),
}


@pytest.mark.parametrize("name", list(PINNED))
def test_each_lookup_answers_as_pinned(name):
    got = (fp8attn.generation(name), hw.gpu_memory_gib(name), hw.peak_bf16_flops(name),
           hw.gpu_spec(hw.PEAK_FP8_DENSE, name), hw.gpu_spec(hw.HBM_BANDWIDTH, name),
           hw.gpu_spec(hw.NVLINK_BANDWIDTH, name))
    assert got == PINNED[name], (name, got)


def test_no_name_has_no_facts():
    assert hw.peak_bf16_flops(None) is None and hw.peak_bf16_flops("") is None
    assert hw.gpu_spec(hw.HBM_BANDWIDTH, None) is None


def test_every_instance_gpu_has_memory_and_its_listed_peak():
    for itype, info in hw.INSTANCES.items():
        assert hw.gpu_memory_gib(info.gpu) is not None, itype
        assert hw.peak_bf16_flops(info.gpu) == info.bf16_tflops * 1e12, itype
