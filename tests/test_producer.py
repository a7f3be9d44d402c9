"""The kernel that writes a candidate's inputs just before it (harness/producer.py): its word for
any address and byte count, its compile for each word (CPU, CI), and its copy on the GPU, an input
of more than 2^31 bytes included (KernelBench 100's 4 GiB predictions had failed the judge)."""

from __future__ import annotations

import pytest
import torch

from llmcompile.harness import producer


@pytest.mark.parametrize(
    ("shape", "dtype", "offset", "width"),
    [
        ((1024,), torch.float32, 0, 8),  # 4 KiB, aligned: eight-byte words
        ((1023,), torch.float32, 0, 4),  # an odd count of fp32: four
        ((1024,), torch.float32, 1, 4),  # a view one fp32 in: its address is four-aligned
        ((7,), torch.bfloat16, 0, 2),
        ((6,), torch.bfloat16, 1, 2),
        ((5,), torch.uint8, 3, 1),
    ],
)
def test_the_word_is_the_widest_that_address_and_size_allow(shape, dtype, offset, width) -> None:
    base = torch.zeros(offset + torch.Size(shape).numel(), dtype=dtype)
    src = base[offset:].view(shape)
    dst = torch.zeros(shape, dtype=dtype)
    got, word = producer.word_of(src, dst)
    assert got == width and torch.empty(0, dtype=word).element_size() == width
    assert producer.word_of(dst, src)[0] == width  # an unaligned destination alone narrows it too


@pytest.mark.parametrize("width", [w for w, _, _ in producer.WORDS])
def test_each_word_compiles_with_a_64_bit_count(width: int) -> None:
    ir = str(producer._compiled(width).ir_module)
    # (a 32-bit count makes TVM-FFI refuse a longer tensor before the launch, as it refused 2^32 bytes)
    assert "expected to be in int32 range" not in ir


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("numel", "dtype", "offset"),
    [((1 << 29) + 3, torch.float32, 1), (3001, torch.bfloat16, 1), (4097, torch.uint8, 3)],
)
def test_the_copy_is_exact_at_any_size_and_offset(numel: int, dtype: torch.dtype, offset: int) -> None:
    src = torch.randint(0, 255, (numel,), device="cuda", dtype=torch.uint8).to(dtype)
    src.view(torch.uint8)[0::7] = 0xA5  # (bytes no conversion makes)
    dst = torch.full((numel + offset + 1,), 77, device="cuda", dtype=dtype)
    producer.produce(src, dst[offset : offset + numel], spin_ns=0)
    torch.cuda.synchronize()
    assert torch.equal(dst[offset : offset + numel].view(torch.uint8), src.view(torch.uint8))
    assert (dst[:offset] == 77).all() and (dst[offset + numel :] == 77).all()  # nothing around it written


@pytest.mark.gpu
def test_an_input_of_more_than_2_31_bytes_is_copied() -> None:
    n = (1 << 31) // 4 + 1024  # fp32: 2 GiB and 4 KiB
    src = torch.rand(n, device="cuda")
    dst = torch.full_like(src, float("nan"))
    producer.produce(src, dst, spin_ns=0)
    torch.cuda.synchronize()
    assert torch.equal(src, dst)
