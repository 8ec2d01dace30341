"""Tests for apexrl/models.py: shapes, the dueling identity, the weight round trip, and the
actor-critics with their policy distributions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import REPO

from apexrl import models
from apexrl.math import distributions
from apexrl.models import torsos

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
    assert isinstance(models.build_q_network((4, 84, 84), 6), models.ConvQNetwork)
    with pytest.raises(ValueError, match=r"channel-first.*\(84, 84\)"):
        models.build_q_network((84, 84), NUM_ACTIONS, hidden_sizes=(8,), dueling=True)
    # Channel-last frames give a 4-pixel-wide "image": too small, and the message says why.
    with pytest.raises(ValueError, match=r"\(84, 84, 4\) is too small.*\(4, 84, 84\)"):
        models.build_q_network((84, 84, 4), NUM_ACTIONS)


ATARI_SHAPE, ATARI_ACTIONS = (4, 84, 84), 6


@pytest.mark.parametrize("dueling", [True, False])
def test_nature_cnn_shapes(dueling: bool) -> None:
    net = models.ConvQNetwork(ATARI_SHAPE, ATARI_ACTIONS, dueling=dueling)
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
        net = models.ConvQNetwork(ATARI_SHAPE, ATARI_ACTIONS, dueling=dueling)
        assert sum(p.numel() for p in net.parameters()) == conv + fc + head


def test_nature_cnn_scales_pixels_and_dueling_identity() -> None:
    torch.manual_seed(0)
    net = models.ConvQNetwork(ATARI_SHAPE, ATARI_ACTIONS, dueling=True)
    pixels = torch.randint(0, 256, (3, *ATARI_SHAPE), dtype=torch.uint8)
    # uint8 pixels and the same values as float32 give the same Q (both scaled by 1/255 inside).
    torch.testing.assert_close(net(pixels).q, net(pixels.float()).q)
    captured: dict[str, torch.Tensor] = {}
    net.value_head.register_forward_hook(lambda _m, _i, out: captured.update(value=out))
    q = net(pixels).q
    mean_q_minus_v = (q - captured["value"]).mean(dim=-1)
    torch.testing.assert_close(mean_q_minus_v, torch.zeros(3), atol=1e-6, rtol=0)


SMALL_SHAPE = (4, 42, 42)  # Atari at env.atari.screen_size 42


def layer_multiply_adds(net: torch.nn.Module, obs_shape: tuple[int, ...]) -> list[int]:
    """Multiply-adds of one sample's forward pass, layer by layer: per Conv2d output value its
    input channels x kernel area (padding included), per Linear its inputs x outputs."""
    counts: list[int] = []

    def count(module: torch.nn.Module, _inputs: object, output: torch.Tensor) -> None:
        if isinstance(module, torch.nn.Conv2d):
            height, width = module.kernel_size
            per_value = module.in_channels // module.groups * height * width
            counts.append(output[0].numel() * per_value)
        elif isinstance(module, torch.nn.Linear):
            counts.append(module.in_features * module.out_features)

    hooks = [module.register_forward_hook(count) for module in net.modules()]
    net(torch.zeros(1, *obs_shape, dtype=torch.uint8))
    for hook in hooks:
        hook.remove()
    return counts


def test_small_cnn_and_nature_cnn_multiply_adds_are_the_documented_ones() -> None:
    # SmallCNN's docstring: maps 21x21x16 and 11x11x32, then 256 outputs over the 11x11 map.
    small = [21 * 21 * 16 * (4 * 4 * 4), 11 * 11 * 32 * (4 * 4 * 16), 256 * (11 * 11 * 32)]
    assert small == [451_584, 991_232, 991_232] and sum(small) == 2_434_048
    assert layer_multiply_adds(torsos.SmallCNN(SMALL_SHAPE), SMALL_SHAPE) == small
    nature = [
        20 * 20 * 32 * (8 * 8 * 4),
        9 * 9 * 64 * (4 * 4 * 32),
        7 * 7 * 64 * (3 * 3 * 64),
        7 * 7 * 64 * 512,
    ]
    assert sum(nature) == 9_342_976
    assert layer_multiply_adds(torsos.NatureCNN(ATARI_SHAPE), ATARI_SHAPE) == nature


def test_small_cnn_pads_the_same_way_and_reads_any_image_of_16_pixels_or_more() -> None:
    # "same": ceil(size / stride) outputs; the zeros (out - 1) * stride + kernel - size, the odd
    # one after.
    assert torsos.same_padding(42, 4, 2) == (21, 1, 1)  # 20 * 2 + 4 - 42 = 2 zeros
    assert torsos.same_padding(21, 4, 2) == (11, 1, 2)  # 10 * 2 + 4 - 21 = 3 zeros
    torch.manual_seed(0)
    net = torsos.SmallCNN(SMALL_SHAPE)
    pixels = torch.randint(0, 256, (5, *SMALL_SHAPE), dtype=torch.uint8)
    features = net(pixels)
    assert features.shape == (5, 256) and features.dtype == torch.float32
    assert net.out_features == 256 and bool((features >= 0).all())  # after a ReLU
    torch.testing.assert_close(features, net(pixels.float()))  # both scaled by 1/255
    # Conv 16x4x4 and 32x4x4 (in * out * k * k + out), then 256 of 32x11x11.
    assert sum(p.numel() for p in net.parameters()) == (
        (4 * 16 * 4 * 4 + 16) + (16 * 32 * 4 * 4 + 32) + (32 * 256 * 11 * 11 + 256)
    )
    with pytest.raises(ValueError, match=r"\[B, 4, 42, 42\].*\(5, 3, 42, 42\)"):
        net(pixels[:, :3])
    # The last layer spans whatever map is left: 16 -> 8 -> 4; 50x37 -> 25x19 -> 13x10.
    for shape, last_kernel in (((4, 16, 16), (4, 4)), ((1, 50, 37), (13, 10))):
        net = torsos.SmallCNN(shape)
        assert net.layers[-3].kernel_size == last_kernel
        assert net(torch.zeros(2, *shape, dtype=torch.uint8)).shape == (2, 256)


@pytest.mark.parametrize(
    "obs_shape, expected",
    [
        ((4,), "mlp"),
        ((4, 10, 10), "minatar_cnn"),  # MinAtar
        ((4, 35, 35), "minatar_cnn"),
        ((4, 36, 36), "small_cnn"),  # the Nature CNN's map: 1x1
        ((4, 42, 42), "small_cnn"),  # Atari at screen_size 42: 1x1 too
        ((4, 63, 63), "small_cnn"),
        ((4, 64, 64), "nature_cnn"),
        ((4, 42, 84), "nature_cnn"),  # 64 or more one way
        ((4, 84, 84), "nature_cnn"),  # Atari
    ],
)
def test_auto_chooses_the_torso_by_image_size(obs_shape, expected) -> None:
    assert models.choose_torso(obs_shape) == expected


def test_a_named_torso_is_kept_and_the_nature_maps_are_the_documented_ones() -> None:
    assert torsos.conv_out(42, torsos.NATURE_LAYERS) == 1  # (42 - 8) // 4 + 1 = 9, 3, 1
    assert torsos.conv_out(84, torsos.NATURE_LAYERS) == 7  # 20, 9, 7
    assert models.choose_torso((4, 42, 42), "nature_cnn") == "nature_cnn"
    assert models.choose_torso((4, 84, 84), "small_cnn") == "small_cnn"
    assert models.choose_torso((4, 10, 10), "small_cnn") == "small_cnn"
    with pytest.raises(ValueError, match=r"\(42, 42, 4\) is too small"):
        models.choose_torso((42, 42, 4))  # channel-last
    assert isinstance(models.build_q_network(SMALL_SHAPE, 6).torso, torsos.SmallCNN)


def test_the_board_torso_keeps_each_cell_in_place_and_sees_a_line_of_four_around_it() -> None:
    net = torsos.BoardCNN((2, 6, 7))
    assert models.choose_torso((2, 6, 7), "board_cnn") == "board_cnn"
    assert net(torch.zeros(3, 2, 6, 7, dtype=torch.int8)).shape == (3, 128)
    macs = (
        sum(
            layer.weight.numel() * 6 * 7
            for layer in net.layers
            if isinstance(layer, torch.nn.Conv2d)
        )
        + net.layers[-2].weight.numel()
    )
    assert macs == 970_368  # the docstring's count
    # A change in one corner reaches the third map's cells up to 3 away, and no further
    convs = net.layers[:6]
    board = torch.zeros(1, 2, 6, 7)
    moved = board.clone()
    moved[0, 0, 0, 0] = 1.0
    with torch.no_grad():
        torch.nn.init.constant_(net.layers[0].bias, 0.1)  # every map > 0: each cell's change shows
        for layer in (net.layers[2], net.layers[4]):
            torch.nn.init.uniform_(layer.weight, 0.01, 0.1)
            torch.nn.init.constant_(layer.bias, 0.1)
        torch.nn.init.uniform_(net.layers[0].weight, 0.01, 0.1)
        reach = (convs(moved) - convs(board)).abs().sum(dim=1)[0] > 0
    rows, cols = torch.nonzero(reach, as_tuple=True)
    assert rows.max() == 3 and cols.max() == 3


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


# Actor-critics (IMPALA, PPO) and the policy distributions.

ACTION_DIM = 2


@pytest.mark.parametrize("shared_torso", [False, True])
@pytest.mark.parametrize("hidden_sizes", [(), (8,), (16, 8)])
@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_actor_critic_categorical_shapes(
    shared_torso: bool, hidden_sizes: tuple[int, ...], activation: str
) -> None:
    net = models.MLPActorCritic(
        OBS_DIM,
        num_actions=NUM_ACTIONS,
        hidden_sizes=hidden_sizes,
        activation=activation,
        shared_torso=shared_torso,
    )
    out = net(torch.randn(5, OBS_DIM))
    assert isinstance(out, models.CategoricalOutput)
    assert out._fields == ("logits", "value")
    assert out.logits.shape == (5, NUM_ACTIONS)
    assert out.value.shape == (5,)
    assert out.logits.dtype == out.value.dtype == torch.float32
    time_major = net(torch.randn(2, 5, OBS_DIM))
    assert time_major.logits.shape == (2, 5, NUM_ACTIONS)
    assert time_major.value.shape == (2, 5)
    # Other dtypes are cast to float32.
    assert net(torch.ones(5, OBS_DIM, dtype=torch.uint8)).logits.dtype == torch.float32


@pytest.mark.parametrize("shared_torso", [False, True])
@pytest.mark.parametrize("state_dependent_log_std", [False, True])
def test_actor_critic_gaussian_shapes(shared_torso: bool, state_dependent_log_std: bool) -> None:
    net = models.MLPActorCritic(
        OBS_DIM,
        action_dim=ACTION_DIM,
        hidden_sizes=(16, 16),
        shared_torso=shared_torso,
        init_log_std=-0.5,
        state_dependent_log_std=state_dependent_log_std,
    )
    out = net(torch.randn(5, OBS_DIM))
    assert isinstance(out, models.GaussianOutput)
    assert out._fields == ("mean", "log_std", "value")
    assert out.mean.shape == out.log_std.shape == (5, ACTION_DIM)
    assert out.value.shape == (5,)
    assert net(torch.randn(2, 5, OBS_DIM)).log_std.shape == (2, 5, ACTION_DIM)
    if state_dependent_log_std:
        assert "log_std" not in net.state_dict()
        # The head's bias starts at init_log_std and its weights are small (gain 0.01).
        torch.testing.assert_close(
            out.log_std, torch.full_like(out.log_std, -0.5), atol=0.1, rtol=0
        )
    else:
        assert net.log_std.shape == (ACTION_DIM,)
        assert torch.equal(out.log_std, torch.full((5, ACTION_DIM), -0.5))


def test_gaussian_log_std_defaults_to_zero_and_state_dependent_is_clamped() -> None:
    net = models.MLPActorCritic(OBS_DIM, action_dim=ACTION_DIM, hidden_sizes=(8,))
    assert torch.equal(net.log_std.detach(), torch.zeros(ACTION_DIM))
    net = models.MLPActorCritic(
        OBS_DIM, action_dim=ACTION_DIM, hidden_sizes=(8,), state_dependent_log_std=True
    )
    with torch.no_grad():
        net.log_std_head.bias.fill_(100.0)
    assert net(torch.randn(3, OBS_DIM)).log_std.max().item() == models.LOG_STD_MAX


def test_actor_critic_separate_torsos_do_not_share_gradients() -> None:
    net = models.MLPActorCritic(OBS_DIM, num_actions=NUM_ACTIONS, hidden_sizes=(8,))
    assert not hasattr(net, "torso")
    net(torch.randn(5, OBS_DIM)).value.sum().backward()
    assert all(p.grad is None for p in net.policy_torso.parameters())
    assert all(p.grad is not None for p in net.value_torso.parameters())

    shared = models.MLPActorCritic(
        OBS_DIM, num_actions=NUM_ACTIONS, hidden_sizes=(8,), shared_torso=True
    )
    assert not hasattr(shared, "policy_torso") and not hasattr(shared, "value_torso")
    shared(torch.randn(5, OBS_DIM)).value.sum().backward()
    assert all(p.grad is not None for p in shared.torso.parameters())


def test_orthogonal_init_starts_near_uniform_policy() -> None:
    torch.manual_seed(0)
    net = models.MLPActorCritic(OBS_DIM, num_actions=NUM_ACTIONS, hidden_sizes=(64, 64))
    # Hidden layers: orthogonal with gain sqrt(2) (W W^T = 2 I for a wide-enough layer), zero bias.
    weight = net.policy_torso[2].weight.detach()
    torch.testing.assert_close(weight @ weight.T, 2.0 * torch.eye(64), atol=1e-4, rtol=0)
    assert torch.equal(net.policy_torso[0].bias.detach(), torch.zeros(64))
    # Policy output gain 0.01: logits near 0, so the policy starts near uniform.
    assert net(torch.randn(100, OBS_DIM)).logits.abs().max().item() < 0.1
    # Without it, PyTorch's default init (nonzero biases).
    plain = models.MLPActorCritic(
        OBS_DIM, num_actions=NUM_ACTIONS, hidden_sizes=(8,), orthogonal_init=False
    )
    assert plain.policy_torso[0].bias.abs().sum().item() > 0


def test_build_policy_network_chooses_the_head() -> None:
    discrete = models.build_policy_network((OBS_DIM,), num_actions=NUM_ACTIONS, hidden_sizes=(8,))
    assert isinstance(discrete, models.MLPActorCritic) and discrete.discrete
    assert isinstance(discrete(torch.randn(2, OBS_DIM)), models.CategoricalOutput)
    continuous = models.build_policy_network(
        (OBS_DIM,), action_dim=ACTION_DIM, hidden_sizes=(8,), activation="relu", init_log_std=-1.0
    )
    assert not continuous.discrete
    out = continuous(torch.randn(2, OBS_DIM))
    assert isinstance(out, models.GaussianOutput)
    assert torch.equal(out.log_std, torch.full((2, ACTION_DIM), -1.0))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, r"exactly one of num_actions.*action_dim.*None.*None"),
        ({"num_actions": 3, "action_dim": 2}, r"exactly one of num_actions.*action_dim"),
        ({"num_actions": 0}, r"num_actions must be >= 1, got 0"),
        ({"action_dim": 0}, r"action_dim must be >= 1, got 0"),
        ({"num_actions": 3, "init_log_std": 0.0}, r"Gaussian policy.*num_actions=3"),
        ({"num_actions": 3, "state_dependent_log_std": True}, r"Gaussian policy"),
        ({"action_dim": 2, "init_log_std": float("nan")}, r"init_log_std must be finite"),
        ({"num_actions": 3, "hidden_sizes": (8, 0)}, r"hidden_sizes must all be >= 1"),
        ({"num_actions": 3, "activation": "gelu"}, r"activation must be one of.*'gelu'"),
        ({"action_dim": 2, "obs_shape": (4, 84, 84)}, r"image observations.*need a discrete"),
        ({"num_actions": 3, "obs_shape": (84, 84)}, r"flat observations.*\(84, 84\)"),
    ],
)
def test_build_policy_network_rejects_bad_arguments(
    kwargs: dict[str, object], message: str
) -> None:
    kwargs = dict(kwargs)
    obs_shape = kwargs.pop("obs_shape", (OBS_DIM,))
    with pytest.raises(ValueError, match=message):
        models.build_policy_network(obs_shape, **kwargs)  # type: ignore[arg-type]


def test_actor_critic_rejects_bad_obs() -> None:
    with pytest.raises(ValueError, match=r"obs_dim must be >= 1"):
        models.MLPActorCritic(0, num_actions=NUM_ACTIONS)
    net = models.MLPActorCritic(OBS_DIM, action_dim=ACTION_DIM, hidden_sizes=(8,))
    with pytest.raises(ValueError, match=r"\[B, 4\].*\(5, 3\)"):
        net(torch.randn(5, 3))


@pytest.mark.parametrize("kind", ["categorical", "gaussian", "state_dependent"])
def test_params_round_trip_actor_critic(kind: str) -> None:
    def make() -> models.MLPActorCritic:
        if kind == "categorical":
            return models.MLPActorCritic(OBS_DIM, num_actions=NUM_ACTIONS, hidden_sizes=(16,))
        return models.MLPActorCritic(
            OBS_DIM,
            action_dim=ACTION_DIM,
            hidden_sizes=(16,),
            state_dependent_log_std=kind == "state_dependent",
        )

    torch.manual_seed(0)
    source = make()
    torch.manual_seed(1)
    dest = make()
    if kind == "gaussian":
        with torch.no_grad():
            source.log_std.fill_(-0.7)
    obs = torch.randn(7, OBS_DIM)
    arrays = models.params_to_arrays(source)
    assert set(arrays) == set(source.state_dict())
    assert ("log_std" in arrays) == (kind == "gaussian")
    for array in arrays.values():
        assert array.dtype == np.float32
        array.flags.writeable = False
    models.arrays_to_params(dest, arrays)
    for got, want in zip(dest(obs), source(obs), strict=True):
        assert torch.equal(got, want)
    if kind == "gaussian":
        assert torch.equal(dest.log_std.detach(), torch.full((ACTION_DIM,), -0.7))
        # A Gaussian network's weights do not load into a categorical one, and vice versa.
        categorical = models.MLPActorCritic(OBS_DIM, num_actions=NUM_ACTIONS, hidden_sizes=(16,))
        with pytest.raises(ValueError):
            models.arrays_to_params(categorical, arrays)


def test_categorical_log_prob_and_entropy_match_torch() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 5) * 2.0
    action = torch.randint(0, 5, (3, 4))
    reference = torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(
        distributions.categorical_log_prob(logits, action), reference.log_prob(action)
    )
    torch.testing.assert_close(distributions.categorical_entropy(logits), reference.entropy())
    assert distributions.categorical_log_prob(logits, action).shape == (3, 4)


def test_categorical_entropy_with_masked_actions_has_finite_gradients() -> None:
    logits = torch.tensor([[0.5, float("-inf"), -0.2], [1.0, 2.0, float("-inf")]])
    logits.requires_grad_(True)
    entropy = distributions.categorical_entropy(logits)
    reference = torch.distributions.Categorical(logits=logits.detach()).entropy()
    torch.testing.assert_close(entropy.detach(), reference)
    entropy.sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    # Masked actions are never drawn.
    draws = distributions.categorical_sample(logits.detach().expand(1000, 2, 3))
    assert not (draws[:, 0] == 1).any() and not (draws[:, 1] == 2).any()


def test_categorical_sample_frequencies_match_softmax() -> None:
    logits = torch.tensor([1.0, 0.0, -1.0, 0.5])
    probs = torch.softmax(logits, dim=-1)
    num_draws = 20_000
    generator = torch.Generator().manual_seed(0)
    draws = distributions.categorical_sample(logits.expand(num_draws, 4), generator=generator)
    assert draws.shape == (num_draws,) and draws.dtype == torch.int64
    frequencies = torch.bincount(draws, minlength=4).float() / num_draws
    # The standard error of each frequency is sqrt(p (1 - p) / N) <= 0.0036; allow over 4 of them.
    torch.testing.assert_close(frequencies, probs, atol=0.015, rtol=0)
    # The same seed gives the same draws.
    again = distributions.categorical_sample(
        logits.expand(num_draws, 4), generator=torch.Generator().manual_seed(0)
    )
    assert torch.equal(draws, again)
    # Leading dims are kept; a single row of logits gives a scalar action.
    assert distributions.categorical_sample(torch.zeros(2, 3, 4)).shape == (2, 3)
    assert distributions.categorical_sample(logits).shape == ()


def test_gaussian_log_prob_and_entropy_match_torch() -> None:
    torch.manual_seed(0)
    mean = torch.randn(6, 3)
    log_std = torch.randn(6, 3) * 0.5
    action = torch.randn(6, 3) * 2.0
    reference = torch.distributions.Normal(mean, log_std.exp())
    torch.testing.assert_close(
        distributions.gaussian_log_prob(mean, log_std, action), reference.log_prob(action).sum(-1)
    )
    torch.testing.assert_close(distributions.gaussian_entropy(log_std), reference.entropy().sum(-1))
    # A state-independent [D] log-std broadcasts over the batch.
    shared = torch.tensor([-0.3, 0.1, 0.4])
    torch.testing.assert_close(
        distributions.gaussian_log_prob(mean, shared, action),
        torch.distributions.Normal(mean, shared.exp()).log_prob(action).sum(-1),
    )


def test_gaussian_sample_moments_and_reproducibility() -> None:
    mean = torch.tensor([1.0, -2.0])
    log_std = torch.tensor([0.0, -1.0])
    num_draws = 20_000
    draws = distributions.gaussian_sample(
        mean.expand(num_draws, 2), log_std, generator=torch.Generator().manual_seed(0)
    )
    assert draws.shape == (num_draws, 2)
    # Standard errors: std / sqrt(N) <= 0.0071 for the mean, about std / sqrt(2N) for the std.
    torch.testing.assert_close(draws.mean(0), mean, atol=0.03, rtol=0)
    torch.testing.assert_close(draws.std(0), log_std.exp(), atol=0.03, rtol=0)
    again = distributions.gaussian_sample(
        mean.expand(num_draws, 2), log_std, generator=torch.Generator().manual_seed(0)
    )
    assert torch.equal(draws, again)


@pytest.mark.parametrize("state_dependent_log_std", [False, True])
def test_gradients_flow_to_log_std(state_dependent_log_std: bool) -> None:
    torch.manual_seed(0)
    net = models.MLPActorCritic(
        OBS_DIM,
        action_dim=ACTION_DIM,
        hidden_sizes=(8,),
        state_dependent_log_std=state_dependent_log_std,
    )
    out = net(torch.randn(5, OBS_DIM))
    action = torch.randn(5, ACTION_DIM)
    loss = -distributions.gaussian_log_prob(out.mean, out.log_std, action).mean()
    loss = loss - 0.01 * distributions.gaussian_entropy(out.log_std).mean()
    # A reparameterized squashed draw (SAC's actor loss) also carries gradients.
    loss = loss + distributions.squashed_gaussian_sample(out.mean, out.log_std).log_prob.mean()
    loss.backward()
    log_std_param = net.log_std_head.weight if state_dependent_log_std else net.log_std
    assert log_std_param.grad is not None
    assert torch.isfinite(log_std_param.grad).all() and log_std_param.grad.abs().sum() > 0


def _tanh_normal(mean: torch.Tensor, log_std: torch.Tensor) -> torch.distributions.Distribution:
    return torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.exp()), torch.distributions.TanhTransform()
    )


def test_squashed_gaussian_log_prob_matches_tanh_transformed_normal() -> None:
    torch.manual_seed(0)
    mean = torch.randn(64, 3) * 0.5
    log_std = torch.randn(64, 3) * 0.3 - 0.5
    # Actions away from the +-1 edges: |u| <= 2, |a| <= 0.965.
    pre_tanh = torch.rand(64, 3) * 4.0 - 2.0
    action = torch.tanh(pre_tanh)
    reference = _tanh_normal(mean, log_std).log_prob(action).sum(-1)
    torch.testing.assert_close(
        distributions.squashed_gaussian_log_prob(mean, log_std, action),
        reference,
        atol=1e-4,
        rtol=0,
    )
    # The sampler's log-prob (from u, no atanh) agrees with the reference at its own actions.
    sample = distributions.squashed_gaussian_sample(
        mean, log_std, generator=torch.Generator().manual_seed(1)
    )
    assert sample.action.shape == sample.pre_tanh.shape == (64, 3)
    assert sample.log_prob.shape == (64,)
    torch.testing.assert_close(sample.action, torch.tanh(sample.pre_tanh))
    inside = (sample.action.abs() < 0.99).all(dim=-1)
    assert inside.sum() > 50
    reference = _tanh_normal(mean, log_std).log_prob(sample.action).sum(-1)
    torch.testing.assert_close(sample.log_prob[inside], reference[inside], atol=1e-4, rtol=0)


def test_tanh_correction_is_stable_for_large_pre_tanh() -> None:
    pre_tanh = torch.tensor([[0.0, 1.0], [-5.0, 10.0], [20.0, -50.0]])
    got = distributions.tanh_log_det_jacobian(pre_tanh)
    # log(1 - tanh(u)^2) = -2 log cosh(u), exact in float64 for these u.
    want = (-2.0 * torch.log(torch.cosh(pre_tanh.double()))).sum(-1).float()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-6)
    # Actions at the edges are clamped before atanh: finite log-probs.
    edge = torch.tensor([[1.0, -1.0], [0.0, 1.0]])
    log_prob = distributions.squashed_gaussian_log_prob(torch.zeros(2, 2), torch.zeros(2, 2), edge)
    assert torch.isfinite(log_prob).all()


def test_distribution_helpers_reject_bad_arguments() -> None:
    logits = torch.zeros(4, 3)
    with pytest.raises(ValueError, match=r"logits must be \[B, A\]"):
        distributions.categorical_entropy(torch.zeros(4, 0))
    with pytest.raises(ValueError, match=r"logits must be \[B, A\]"):
        distributions.categorical_sample(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"action must have shape \(4,\).*\(4, 1\)"):
        distributions.categorical_log_prob(logits, torch.zeros(4, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"integer tensor.*float32"):
        distributions.categorical_log_prob(logits, torch.zeros(4))
    mean = torch.zeros(4, 2)
    with pytest.raises(ValueError, match=r"log_std of shape \(3,\) does not broadcast.*\(4, 2\)"):
        distributions.gaussian_sample(mean, torch.zeros(3))
    with pytest.raises(ValueError, match=r"log_std of shape \(5, 2\)"):
        distributions.gaussian_log_prob(mean, torch.zeros(5, 2), mean)
    with pytest.raises(ValueError, match=r"action must have mean's shape \(4, 2\).*\(4, 3\)"):
        distributions.gaussian_log_prob(mean, torch.zeros(2), torch.zeros(4, 3))
    with pytest.raises(ValueError, match=r"log_std must be \[B, D\]"):
        distributions.gaussian_entropy(torch.tensor(0.0))
    with pytest.raises(ValueError, match=r"eps must be in \(0, 1\)"):
        distributions.squashed_gaussian_log_prob(mean, torch.zeros(2), mean, eps=0.0)


def test_scale_action_maps_unit_box_to_env_box_and_back() -> None:
    low = np.array([-2.0, 0.0], dtype=np.float32)
    high = np.array([2.0, 10.0], dtype=np.float32)
    unit = np.array([[-1.0, -1.0], [0.0, 0.0], [1.0, 1.0], [0.5, -0.5]], dtype=np.float32)
    scaled = distributions.scale_action(unit, low, high)
    assert isinstance(scaled, np.ndarray) and scaled.dtype == np.float32
    np.testing.assert_allclose(scaled, [[-2.0, 0.0], [0.0, 5.0], [2.0, 10.0], [1.0, 2.5]])
    np.testing.assert_allclose(distributions.unscale_action(scaled, low, high), unit, atol=1e-6)
    # Tensors stay tensors, with their dtype; scalar bounds broadcast.
    tensor = torch.tensor(unit, dtype=torch.float64)
    scaled_tensor = distributions.scale_action(tensor, low, high)
    assert isinstance(scaled_tensor, torch.Tensor) and scaled_tensor.dtype == torch.float64
    np.testing.assert_allclose(scaled_tensor.numpy(), scaled, atol=1e-6)
    torch.testing.assert_close(distributions.unscale_action(scaled_tensor, low, high), tensor)
    np.testing.assert_allclose(distributions.scale_action(unit, -3.0, 3.0), 3.0 * unit)


@pytest.mark.parametrize(
    ("low", "high", "message"),
    [
        (-np.inf, 1.0, r"must be bounded"),
        (np.array([-1.0, -1.0]), np.array([1.0, np.inf]), r"must be bounded"),
        (1.0, 1.0, r"high > low"),
        (np.array([-1.0, 2.0]), np.array([1.0, 1.0]), r"high > low"),
    ],
)
def test_scale_action_rejects_bad_boxes(low: object, high: object, message: str) -> None:
    unit = np.zeros((3, 2), dtype=np.float32)
    with pytest.raises(ValueError, match=message):
        distributions.scale_action(unit, low, high)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        distributions.unscale_action(torch.zeros(3, 2), low, high)  # type: ignore[arg-type]


def test_obs_normalizer_keeps_the_moments_of_everything_it_saw() -> None:
    rng = np.random.default_rng(3)
    batches = [rng.normal(5.0, 3.0, size=(n, 3)).astype(np.float32) for n in (1, 7, 50, 2)]
    normalizer = models.ObsNormalizer(3)
    for batch in batches:
        normalizer.update(torch.from_numpy(batch))
    seen = np.concatenate(batches).astype(np.float64)
    np.testing.assert_allclose(normalizer.mean.numpy(), seen.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(normalizer.var.numpy(), seen.var(axis=0), rtol=1e-4)
    assert float(normalizer.count[0]) == len(seen)
    out = normalizer(torch.from_numpy(seen.astype(np.float32)))
    np.testing.assert_allclose(out.mean(dim=0).numpy(), 0.0, atol=1e-4)
    np.testing.assert_allclose(out.std(dim=0, unbiased=False).numpy(), 1.0, atol=1e-3)
    assert float(normalizer(torch.full((1, 3), 1e6)).max()) == normalizer.clip


def test_normalized_network_ships_its_statistics_with_the_weights() -> None:
    net = models.NormalizedObsNetwork(
        models.ObsNormalizer(OBS_DIM), models.build_policy_network((OBS_DIM,), num_actions=2)
    )
    net.normalizer.update(torch.randn(64, OBS_DIM) * 4 + 1)
    arrays = models.params_to_arrays(net)
    assert {"normalizer.mean", "normalizer.var", "normalizer.count"} <= set(arrays)
    copy = models.NormalizedObsNetwork(
        models.ObsNormalizer(OBS_DIM), models.build_policy_network((OBS_DIM,), num_actions=2)
    )
    models.arrays_to_params(copy, arrays)
    obs = torch.randn(5, OBS_DIM)
    torch.testing.assert_close(copy(obs).logits, net(obs).logits)


def test_frames_are_cast_once_to_bf16_under_bf16_autocast_and_to_float32_elsewhere() -> None:
    torso = torsos.SmallCNN(SMALL_SHAPE, pixel_scale=1 / 255)
    frames = torch.arange(256, dtype=torch.uint8).repeat(8 * 42 * 42 // 256 + 1)
    frames = frames[: 2 * 4 * 42 * 42].reshape(2, 4, 42, 42)
    fp32 = torso.pixels(frames)
    assert fp32.dtype == torch.float32
    assert torch.equal(fp32, frames.float() * (1 / 255))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = torso.pixels(frames)
    assert bf16.dtype == torch.bfloat16
    # 0..255 are exact in bf16; the scaled values are within one bf16 rounding of fp32's
    assert torch.equal(frames.to(torch.bfloat16).float(), frames.float())
    assert torch.allclose(bf16.float(), fp32, rtol=2**-8, atol=0)
    with torch.autocast("cpu", dtype=torch.float16):  # another autocast dtype: float32 frames
        assert torso.pixels(frames).dtype == torch.float32


def test_a_policy_obs_dim_keeps_the_policy_to_its_part_and_the_value_reads_all() -> None:
    torch.manual_seed(0)
    net = models.MLPActorCritic(5, num_actions=3, policy_obs_dim=2, hidden_sizes=(8,))
    assert net.policy_torso[0].in_features == 2 and net.value_torso[0].in_features == 5
    obs = torch.randn(4, 5)
    other = obs.clone()
    other[:, 2:] += 1.0  # the part only the value reads
    first, second = net(obs), net(other)
    torch.testing.assert_close(first.logits, second.logits)
    assert not torch.allclose(first.value, second.value)
    changed = obs.clone()
    changed[:, :2] += 1.0
    assert not torch.allclose(net(changed).logits, first.logits)
    for bad, message in [
        ({"policy_obs_dim": 6}, r"policy_obs_dim must be in \[0, 5\], got 6"),
        ({"policy_obs_dim": 2, "shared_torso": True}, "separate torsos"),
    ]:
        with pytest.raises(ValueError, match=message):
            models.MLPActorCritic(5, num_actions=3, **bad)


def test_a_mirrored_board_network_plays_a_mirrored_board_mirrored() -> None:
    import gymnasium as gym

    from apexrl.algos.actor_critic import make_policy_network

    planes = gym.spaces.Box(0, 1, (2, 6, 7), np.float32)
    torch.manual_seed(0)
    net = make_policy_network(
        planes, gym.spaces.Discrete(7), (64,), "relu", 0.0, torso="board_cnn", mirror_board=True
    )
    assert isinstance(net, models.MirroredBoardNetwork) and net.discrete  # read through to net
    board = torch.zeros(3, 2, 6, 7)
    board[:, 0, 5, 0] = 1.0  # a piece in the left column, then more on the right
    board[1:, 1, 5, 4] = 1.0
    board[2, 0, 4, 4] = 1.0
    out, mirrored = net(board), net(board.flip(-1))
    torch.testing.assert_close(mirrored.logits, out.logits.flip(-1))
    torch.testing.assert_close(mirrored.value, out.value)
    # The mean of the board's and the mirror's outputs, the mirror's columns reversed.
    inner = net.net(torch.cat([board, board.flip(-1)]))
    torch.testing.assert_close(out.logits, (inner.logits[:3] + inner.logits[3:].flip(-1)) / 2)
    # Time-major unrolls [T, B, C, H, W] as the learner reads them
    unroll = torch.stack([board, board.flip(-1)])
    assert net(unroll).logits.shape == (2, 3, 7)
    torch.testing.assert_close(net(unroll).logits[1], out.logits.flip(-1))
    with pytest.raises(ValueError, match="mirror_board takes a board"):
        make_policy_network(
            planes, gym.spaces.Discrete(6), (64,), "relu", 0.0, torso="board_cnn", mirror_board=True
        )


def test_the_launchers_env_check_refuses_mirror_board_on_an_env_that_is_no_board() -> None:
    from apexrl.config import load_config
    from apexrl.envs import EnvError, check_env

    cfg = load_config(REPO / "configs" / "ppo_cartpole.yaml", ["algo.mirror_board=true"])
    with pytest.raises(EnvError, match="algo.mirror_board takes a board's channel-first planes"):
        check_env(cfg)  # before any role starts, in one line
