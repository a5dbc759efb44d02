"""Mamba block and BiMamba encoder: step parity, padding that never leaks, backend parity, the fused inference
pass against the reference, mamba-ssm names."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from model.bimamba import BiMambaEncoder, MambaBlock, MambaConfig, reverse_valid
from model.scan import cpu_extension, fused_inference

CONFIG = MambaConfig(d_model=16, d_state=8, n_layers=3)


def test_parameter_names_are_mamba_ssm_names() -> None:
    names = {name for name, _ in MambaBlock(CONFIG).named_parameters()}
    assert names == {"in_proj.weight", "conv1d.weight", "conv1d.bias", "x_proj.weight", "dt_proj.weight",
                     "dt_proj.bias", "A_log", "D", "out_proj.weight"}


def test_step_by_step_equals_the_full_forward() -> None:
    torch.manual_seed(0)
    block = MambaBlock(CONFIG)
    x = torch.randn(3, 12, CONFIG.d_model)
    with torch.no_grad():
        full = block(x)
        state = block.initial_state(3)
        steps = []
        for t in range(12):
            y, state = block.step(x[:, t], state)
            steps.append(y)
    torch.testing.assert_close(torch.stack(steps, 1), full, rtol=1e-4, atol=1e-5)


def test_reverse_valid_keeps_padding_in_place() -> None:
    x = torch.arange(10.0).view(2, 5)
    out = reverse_valid(x, torch.tensor([3, 5]))
    assert out.tolist() == [[2.0, 1.0, 0.0, 3.0, 4.0], [9.0, 8.0, 7.0, 6.0, 5.0]]
    assert torch.equal(reverse_valid(out, torch.tensor([3, 5])), x)


def test_padding_never_reaches_valid_positions_or_the_pool() -> None:
    torch.manual_seed(1)
    encoder = BiMambaEncoder(CONFIG).eval()
    lengths = torch.tensor([4, 9, 1])
    x = torch.randn(3, 9, CONFIG.d_model)
    junk = x.clone()
    for b, n in enumerate(lengths.tolist()):
        junk[b, n:] = torch.randn(9 - n, CONFIG.d_model) * 100
    with torch.no_grad():
        pooled, pooled_junk = encoder(x, lengths), encoder(junk, lengths)
        alone = encoder(x[:1, :4], lengths[:1])
    torch.testing.assert_close(pooled, pooled_junk)
    torch.testing.assert_close(pooled[:1], alone, rtol=1e-5, atol=1e-6)


def test_a_plain_flip_would_leak_padding() -> None:
    """The trap the design avoids: flipping whole padded rows puts padding first in the backward scan."""
    torch.manual_seed(2)
    block = MambaBlock(CONFIG).eval()
    x = torch.randn(1, 6, CONFIG.d_model)
    junk = x.clone()
    junk[:, 4:] = 50.0
    with torch.no_grad():
        naive = block(x.flip(1)).flip(1)[:, :4] - block(junk.flip(1)).flip(1)[:, :4]
        safe = (block(reverse_valid(x, torch.tensor([4])))[:, :4]
                - block(reverse_valid(junk, torch.tensor([4])))[:, :4])
    assert naive.abs().max() > 1e-3 and safe.abs().max() == 0


def test_backends_agree_and_gradients_flow() -> None:
    torch.manual_seed(3)
    reference = BiMambaEncoder(MambaConfig(d_model=16, d_state=8, backend="reference"))
    fast = BiMambaEncoder(MambaConfig(d_model=16, d_state=8, backend="cpu"))
    fast.load_state_dict(reference.state_dict())
    x, lengths = torch.randn(5, 10, 16), torch.tensor([10, 3, 7, 1, 10])
    out_ref, out_fast = reference(x, lengths), fast(x, lengths)
    torch.testing.assert_close(out_fast, out_ref, rtol=1e-4, atol=1e-5)
    out_fast.sum().backward()
    out_ref.sum().backward()
    for (name, p_fast), p_ref in zip(fast.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p_fast.grad, p_ref.grad, rtol=1e-3, atol=1e-4, msg=name)


def test_lengths_are_checked() -> None:
    with pytest.raises(ValueError, match="lengths"):
        BiMambaEncoder(CONFIG)(torch.zeros(1, 3, CONFIG.d_model), torch.tensor([0]))


FUSED_TOLERANCE = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=1e-4, atol=2e-5)}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("d_model, d_state, d_conv, length", [(8, 4, 4, 1), (16, 8, 4, 9), (32, 16, 4, 32), (20, 5, 3, 17)],
                         ids=str)  # d_model 20: 40 channels, a tail that is not a whole vector of 16
def test_fused_inference_matches_the_reference_path(dtype, d_model, d_state, d_conv, length) -> None:
    """Inference on the CPU runs both directions' inner passes in one C++ call with out_proj folded into mix: the same
    weights on the reference scan give the same blocks, layers and pooled encodings, for padding of every length."""
    torch.manual_seed(4)
    config = MambaConfig(d_model=d_model, d_state=d_state, d_conv=d_conv)
    reference = BiMambaEncoder(replace(config, backend="reference")).to(dtype).eval()
    with torch.no_grad():
        for parameter in reference.parameters():  # away from the init's structure (A_log's ranks, D = 1)
            parameter.add_(torch.randn_like(parameter) * 0.1)
    fused = BiMambaEncoder(config).to(dtype).eval()
    fused.load_state_dict(reference.state_dict())
    x = torch.randn(7, length, d_model, dtype=dtype)
    lengths = torch.randint(1, length + 1, (7,))
    lengths[:2] = torch.tensor([length, 1])
    with torch.no_grad():
        assert fused_inference(x, config.backend) and not fused_inference(x, "reference")
        for got, want in [(fused.layers[0].forward_block(x), reference.layers[0].forward_block(x)),
                          (fused.layers[0](x, lengths), reference.layers[0](x, lengths)),
                          (fused(x, lengths), reference(x, lengths))]:
            torch.testing.assert_close(got, want, **FUSED_TOLERANCE[dtype])


def test_training_keeps_autograd_and_the_fused_pass_checks_its_inputs() -> None:
    x = torch.randn(2, 5, 8, requires_grad=True)
    assert not fused_inference(x, "auto")  # grad mode: the scan with its hand-written backward
    with torch.no_grad():
        assert fused_inference(x, "auto") and not fused_inference(x.to(torch.float16), "auto")
    weights = [w[None] for w in MambaBlock(MambaConfig(d_model=8, d_state=4)).inner_weights()]
    with pytest.raises(RuntimeError, match="lengths: each must be in"):
        cpu_extension().inner_forward(torch.zeros(2, 5, 32), torch.tensor([5, 0]), *weights)
    with pytest.raises(RuntimeError, match="xz: last dimension"):
        cpu_extension().inner_forward(torch.zeros(2, 5, 31), torch.tensor([5, 5]), *weights)
