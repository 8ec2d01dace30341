"""Tests for apexrl/models.py: shapes, the dueling identity, and the weight round trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from apexrl import models

OBS_DIM, NUM_ACTIONS = 4, 3


@pytest.mark.parametrize("dueling", [True, False])
@pytest.mark.parametrize("hidden_sizes", [(), (8,), (16, 8)])
def test_output_shapes(dueling: bool, hidden_sizes: tuple[int, ...]) -> None:
    net = models.MLPQNetwork(OBS_DIM, NUM_ACTIONS, hidden_sizes=hidden_sizes, dueling=dueling)
    out = net(torch.randn(5, OBS_DIM))
    assert isinstance(out, models.QOutput)
    assert out.q.shape == (5, NUM_ACTIONS)
    assert out.q.dtype == torch.float32
    # Time-major input keeps its leading dims.
    assert net(torch.randn(2, 5, OBS_DIM)).q.shape == (2, 5, NUM_ACTIONS)


def test_other_dtypes_are_cast_to_float32() -> None:
    net = models.MLPQNetwork(OBS_DIM, NUM_ACTIONS, hidden_sizes=(8,))
    obs = torch.randn(5, OBS_DIM, dtype=torch.float64)
    torch.testing.assert_close(net(obs).q, net(obs.float()).q)
    assert net(torch.ones(5, OBS_DIM, dtype=torch.uint8)).q.dtype == torch.float32


def test_wrong_obs_dim_raises() -> None:
    net = models.MLPQNetwork(OBS_DIM, NUM_ACTIONS, hidden_sizes=(8,))
    with pytest.raises(ValueError, match=r"\[B, 4\].*\(5, 3\)"):
        net(torch.randn(5, 3))


def test_dueling_identity() -> None:
    torch.manual_seed(0)
    net = models.MLPQNetwork(OBS_DIM, NUM_ACTIONS, hidden_sizes=(16,), dueling=True)
    captured: dict[str, torch.Tensor] = {}
    net.value_head.register_forward_hook(lambda _m, _i, out: captured.update(value=out))
    q = net(torch.randn(10, OBS_DIM)).q
    # Q = V + A - mean(A), so the mean over actions of Q - V is zero.
    mean_q_minus_v = (q - captured["value"]).mean(dim=-1)
    torch.testing.assert_close(mean_q_minus_v, torch.zeros(10), atol=1e-6, rtol=0)


def test_build_q_network_flat_images_and_rejects_others() -> None:
    net = models.build_q_network((OBS_DIM,), NUM_ACTIONS, hidden_sizes=(8,), dueling=False)
    assert net(torch.randn(2, OBS_DIM)).q.shape == (2, NUM_ACTIONS)
    assert isinstance(models.build_q_network((4, 84, 84), 6), models.NatureCNNQNetwork)
    with pytest.raises(ValueError, match=r"channel-first.*\(84, 84\)"):
        models.build_q_network((84, 84), NUM_ACTIONS, hidden_sizes=(8,), dueling=True)
    # Channel-last frames give a 4-pixel-wide "image": too small, and the message says why.
    with pytest.raises(ValueError, match=r"\(84, 84, 4\) is too small.*\(4, 84, 84\)"):
        models.build_q_network((84, 84, 4), NUM_ACTIONS)


ATARI_SHAPE, ATARI_ACTIONS = (4, 84, 84), 6


@pytest.mark.parametrize("dueling", [True, False])
def test_nature_cnn_shapes(dueling: bool) -> None:
    net = models.NatureCNNQNetwork(ATARI_SHAPE, ATARI_ACTIONS, dueling=dueling)
    obs = torch.randint(0, 256, (5, *ATARI_SHAPE), dtype=torch.uint8)
    out = net(obs)
    assert isinstance(out, models.QOutput)
    assert out.q.shape == (5, ATARI_ACTIONS)
    assert out.q.dtype == torch.float32
    with pytest.raises(ValueError, match=r"\[B, 4, 84, 84\].*\(5, 3, 84, 84\)"):
        net(obs[:, :3])


def test_nature_cnn_parameter_count() -> None:
    # Mnih et al. 2015 layer by layer: (in * out * k * k + out) per conv, then the fc layers.
    conv = (4 * 32 * 8 * 8 + 32) + (32 * 64 * 4 * 4 + 64) + (64 * 64 * 3 * 3 + 64)
    fc = 64 * 7 * 7 * 512 + 512
    plain_head = 512 * 6 + 6
    dueling_head = (512 * 1 + 1) + (512 * 6 + 6)
    assert conv + fc + plain_head == 1_687_206
    for dueling, head in ((False, plain_head), (True, dueling_head)):
        net = models.NatureCNNQNetwork(ATARI_SHAPE, ATARI_ACTIONS, dueling=dueling)
        assert sum(p.numel() for p in net.parameters()) == conv + fc + head


def test_nature_cnn_scales_pixels_and_dueling_identity() -> None:
    torch.manual_seed(0)
    net = models.NatureCNNQNetwork(ATARI_SHAPE, ATARI_ACTIONS, dueling=True)
    pixels = torch.randint(0, 256, (3, *ATARI_SHAPE), dtype=torch.uint8)
    # uint8 pixels and the same values as float32 give the same Q (both scaled by 1/255 inside).
    torch.testing.assert_close(net(pixels).q, net(pixels.float()).q)
    captured: dict[str, torch.Tensor] = {}
    net.value_head.register_forward_hook(lambda _m, _i, out: captured.update(value=out))
    q = net(pixels).q
    mean_q_minus_v = (q - captured["value"]).mean(dim=-1)
    torch.testing.assert_close(mean_q_minus_v, torch.zeros(3), atol=1e-6, rtol=0)


def test_params_round_trip_gives_identical_outputs() -> None:
    torch.manual_seed(0)
    source = models.MLPQNetwork(OBS_DIM, NUM_ACTIONS, hidden_sizes=(16, 16))
    torch.manual_seed(1)
    dest = models.MLPQNetwork(OBS_DIM, NUM_ACTIONS, hidden_sizes=(16, 16))
    obs = torch.randn(7, OBS_DIM)
    assert not torch.equal(source(obs).q, dest(obs).q)

    arrays = models.params_to_arrays(source)
    assert set(arrays) == set(source.state_dict())
    for array in arrays.values():
        assert isinstance(array, np.ndarray)
        assert array.flags.c_contiguous
        assert array.dtype == np.float32
        # Arrays decoded from message frames are read-only; loading must accept them.
        array.flags.writeable = False
    models.arrays_to_params(dest, arrays)
    assert torch.equal(source(obs).q, dest(obs).q)


def test_params_to_arrays_are_copies() -> None:
    net = models.MLPQNetwork(OBS_DIM, NUM_ACTIONS, hidden_sizes=(8,))
    arrays = models.params_to_arrays(net)
    before = arrays["value_head.bias"].copy()
    with torch.no_grad():
        net.value_head.bias.add_(1.0)
    np.testing.assert_array_equal(arrays["value_head.bias"], before)


def _mismatches(arrays: dict[str, np.ndarray]) -> list[tuple[dict[str, np.ndarray], str]]:
    missing = dict(arrays)
    del missing["torso.0.weight"]
    extra = {**arrays, "extra.weight": np.zeros(3, dtype=np.float32)}
    wrong_shape = {**arrays, "torso.0.bias": np.zeros(9, dtype=np.float32)}
    wrong_dtype = {**arrays, "value_head.bias": arrays["value_head.bias"].astype(np.float64)}
    not_array = {**arrays, "value_head.bias": [0.0]}
    return [
        (missing, "torso.0.weight"),
        (extra, "extra.weight"),
        (wrong_shape, "torso.0.bias"),
        (wrong_dtype, "value_head.bias"),
        (not_array, "value_head.bias"),
    ]


@pytest.mark.parametrize("case", range(5))
def test_mismatched_arrays_raise_and_leave_module_unchanged(case: int) -> None:
    torch.manual_seed(0)
    dest = models.MLPQNetwork(OBS_DIM, NUM_ACTIONS, hidden_sizes=(8,))
    # Good arrays from a different network, so a partial load would show.
    torch.manual_seed(1)
    source_arrays = models.params_to_arrays(
        models.MLPQNetwork(OBS_DIM, NUM_ACTIONS, hidden_sizes=(8,))
    )
    # Most cases break an entry that comes after good ones, so a load-as-you-check would show.
    bad_arrays, bad_name = _mismatches(source_arrays)[case]
    before = {name: t.clone() for name, t in dest.state_dict().items()}
    with pytest.raises(ValueError, match=bad_name):
        models.arrays_to_params(dest, bad_arrays)
    for name, tensor in dest.state_dict().items():
        assert torch.equal(tensor, before[name]), name
