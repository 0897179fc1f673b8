"""Tests for the batched tensor augmentations and Orchestra's views."""

import pytest
import torch
import torchvision.transforms.functional as TF

from privfed.data.augment import (
    NORM_MEAN,
    ORCHESTRA_VIEW_DRAWS,
    color_jitter,
    gaussian_blur,
    normalize,
    orchestra_views,
    orchestra_views_from,
    random_grayscale,
    random_resized_crop_flip,
    rotate_quarter_turns,
    solarize,
    to_float,
    view_draws,
)
from privfed.data.shapes import make_shapes


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def images_uint8() -> torch.Tensor:
    # The shapes are grey; tint each image so the colour ops have colour to act on.
    grey = make_shapes(32, seed=0).to_tensor().float()
    tint = torch.Generator().manual_seed(0)
    gains = 0.55 + 0.45 * torch.rand(32, 3, 1, 1, generator=tint)
    return (grey * gains).round().clamp(0, 255).to(torch.uint8)


@pytest.fixture(scope="module")
def images(images_uint8) -> torch.Tensor:
    return to_float(images_uint8)


OPS = {
    "crop": lambda x, g: random_resized_crop_flip(x, generator=g),
    "jitter": lambda x, g: color_jitter(x, generator=g, p=1.0),
    "grayscale": lambda x, g: random_grayscale(x, generator=g, p=0.5),
    "blur": lambda x, g: gaussian_blur(x, generator=g, p=1.0),
    "solarize": lambda x, g: solarize(x, generator=g, p=0.5),
    "rotate": lambda x, g: rotate_quarter_turns(x, generator=g)[0],
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_ops_keep_shape_dtype_and_range(images, name):
    out = OPS[name](images, _gen())
    assert out.shape == images.shape and out.dtype == images.dtype and out.device == images.device
    assert out.min() >= 0.0 and out.max() <= 1.0


@pytest.mark.parametrize("name", ["crop", "jitter", "blur"])
def test_per_sample_randomness(images, name):
    same = images[:1].expand(16, -1, -1, -1).contiguous()
    out = OPS[name](same, _gen())
    distinct = {tuple(o.flatten()[::37].tolist()) for o in out}
    assert len(distinct) == 16


def test_to_float_and_normalize():
    x = torch.tensor([0, 128, 255], dtype=torch.uint8).view(1, 3, 1, 1)
    f = to_float(x)
    assert f.dtype == torch.float32
    torch.testing.assert_close(f.flatten(), torch.tensor([0.0, 128 / 255, 1.0]))
    torch.testing.assert_close(normalize(f).flatten(), (f.flatten() - 0.5) / 0.25)
    assert normalize(torch.full((1,), NORM_MEAN)).item() == 0.0
    with pytest.raises(ValueError):
        to_float(f)


def test_full_crop_is_identity_or_flip(images):
    out = random_resized_crop_flip(images, generator=_gen(), scale=(1.0, 1.0), ratio=(1.0, 1.0))
    flipped = images.flip(-1)
    kinds = []
    for o, x, fx in zip(out, images, flipped, strict=True):
        if torch.allclose(o, x, atol=1e-5):
            kinds.append("same")
        else:
            torch.testing.assert_close(o, fx, atol=1e-5, rtol=0)
            kinds.append("flip")
    assert {"same", "flip"} == set(kinds)


def test_small_crops_zoom_in(images):
    # A crop of ≤ 20 % of the area shows fewer distinct colours than the whole image.
    out = random_resized_crop_flip(images, generator=_gen(), scale=(0.05, 0.05))
    assert out.std(dim=(2, 3)).mean() < images.std(dim=(2, 3)).mean()


def test_grayscale_has_equal_channels(images):
    out = random_grayscale(images, generator=_gen(), p=1.0)
    torch.testing.assert_close(out[:, 0], out[:, 1])
    torch.testing.assert_close(out[:, 1], out[:, 2])
    assert torch.equal(random_grayscale(images, generator=_gen(), p=0.0), images)


def test_jitter_keeps_gray_images_gray_and_p0_is_identity(images):
    gray = random_grayscale(images, generator=_gen(), p=1.0)
    out = color_jitter(gray, generator=_gen(1), p=1.0)
    assert not torch.allclose(out, gray)
    torch.testing.assert_close(out[:, 0], out[:, 1], atol=1e-5, rtol=0)
    torch.testing.assert_close(out[:, 1], out[:, 2], atol=1e-5, rtol=0)
    assert torch.equal(color_jitter(images, generator=_gen(), p=0.0), images)


def test_hue_only_jitter_preserves_luma(images):
    out = color_jitter(
        images, generator=_gen(), brightness=0, contrast=0, saturation=0, hue=0.5, p=1.0
    )
    weights = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
    unclipped = (out > 0.001) & (out < 0.999)
    mask = unclipped.all(dim=1, keepdim=True)
    luma_in = (images * weights).sum(1, keepdim=True)
    luma_out = (out * weights).sum(1, keepdim=True)
    assert mask.float().mean() > 0.3
    torch.testing.assert_close(luma_out[mask], luma_in[mask], atol=2e-3, rtol=0)
    assert (out - images).abs().max() > 0.1


def test_blur_is_torchvisions_3x3_gaussian_and_p0_is_identity(images):
    for sigma in (0.3, 2.0):
        out = gaussian_blur(images, generator=_gen(), p=1.0, sigma=(sigma, sigma))
        torch.testing.assert_close(out, TF.gaussian_blur(images, [3, 3], [sigma, sigma]), atol=1e-5, rtol=0)
    assert torch.equal(gaussian_blur(images, generator=_gen(), p=0.0), images)


def test_solarize_inverts_bright_pixels():
    x = torch.tensor([0.1, 0.5, 0.9]).view(1, 3, 1, 1).repeat(2, 1, 1, 1)
    out = solarize(x, generator=_gen(), p=1.0)
    torch.testing.assert_close(out[0].flatten(), torch.tensor([0.1, 0.5, 0.1]))
    assert torch.equal(solarize(x, generator=_gen(), p=0.0), x)


def test_rotation_labels_match_rot90(images):
    out, k = rotate_quarter_turns(images, generator=_gen())
    assert k.dtype == torch.int64 and set(k.tolist()) == {0, 1, 2, 3}
    for o, x, turns in zip(out, images, k.tolist(), strict=True):
        assert torch.equal(o, torch.rot90(x, turns, dims=(-2, -1)))
        assert torch.equal(torch.rot90(o, -turns, dims=(-2, -1)), x)


def test_rotation_needs_square_images():
    with pytest.raises(ValueError, match="square"):
        rotate_quarter_turns(torch.rand(2, 3, 4, 5), generator=_gen())


def test_bad_inputs_rejected(images_uint8):
    with pytest.raises(ValueError, match="B×3×H×W"):
        random_grayscale(torch.rand(3, 8, 8), generator=_gen())
    with pytest.raises(ValueError, match="to_float"):
        random_grayscale(images_uint8, generator=_gen())


def test_orchestra_views_shapes_and_determinism(images_uint8):
    a = orchestra_views(images_uint8, generator=_gen(5))
    b = orchestra_views(images_uint8, generator=_gen(5))
    c = orchestra_views(images_uint8, generator=_gen(6))
    for view in (a.view1, a.view2, a.view3):
        assert view.shape == images_uint8.shape and view.dtype == torch.float32
        assert view.min() >= -2.0 and view.max() <= 2.0
    assert (
        a.rotation_labels.shape == (len(images_uint8),) and a.rotation_labels.dtype == torch.int64
    )
    for field in ("view1", "view2", "view3", "rotation_labels"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    assert not torch.equal(a.view1, c.view1)
    assert not torch.equal(a.view1, a.view2)


def test_orchestra_view3_rotated_back_is_upright():
    # Brightness grows downwards in every row; crops, horizontal flips, jitter and
    # blur keep that, so rotating view3 back by -k must restore a downward gradient.
    ramp = torch.linspace(0, 255, 32).round().to(torch.uint8)
    x = ramp.view(1, 1, 32, 1).expand(64, 3, 32, 32).contiguous()
    views = orchestra_views(x, generator=_gen())
    assert set(views.rotation_labels.tolist()) == {0, 1, 2, 3}
    for view, turns in zip(views.view3, views.rotation_labels.tolist(), strict=True):
        upright = torch.rot90(view, -turns, dims=(-2, -1))[0]
        assert upright[-1].mean() > upright[0].mean() + 0.1
        torch.testing.assert_close(upright[:, 0], upright[:, -1], atol=1e-5, rtol=0)


def test_orchestra_view3_is_colour_augmented_like_view1():
    # Crops, flips, blur and quarter turns leave a one-colour image as it is;
    # only view 1's colour jitter (p 0.8) and greyscale (p 0.2) change it.
    x = torch.tensor([200, 60, 30], dtype=torch.uint8).view(1, 3, 1, 1).expand(64, 3, 32, 32).contiguous()
    assert torch.allclose(random_resized_crop_flip(to_float(x), generator=_gen()), to_float(x), atol=1e-5)
    colour = orchestra_views(x, generator=_gen()).view3.mean(dim=(2, 3))
    changed = (colour - normalize(to_float(x[:, :, 0, 0]))).abs().amax(dim=1) > 0.05
    assert changed.float().mean() > 0.6
    assert (colour.std(dim=1) < 1e-4).any()  # some are greyscale


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_views_stay_on_the_gpu(images_uint8):
    x = images_uint8.cuda()
    views = orchestra_views(x, generator=torch.Generator(device="cuda").manual_seed(0))
    for tensor in (views.view1, views.view2, views.view3, views.rotation_labels):
        assert tensor.is_cuda
    with pytest.raises(ValueError, match=r"torch\.Generator"):
        orchestra_views(x, generator=_gen())


def test_views_of_two_batches_made_in_one_transform_are_each_batchs_own(images_uint8):
    """A cohort makes all its clients' views at once from each client's own draws: every image's views are its own."""
    first, second = images_uint8[:10], images_uint8[10:]
    draws = [view_draws(len(part), ORCHESTRA_VIEW_DRAWS, generator=_gen(seed)) for part, seed in ((first, 1), (second, 2))]
    together = orchestra_views_from(torch.cat([first, second]), torch.cat(draws))
    apart = [orchestra_views_from(part, d) for part, d in zip((first, second), draws)]
    for field in ("view1", "view2", "view3", "rotation_labels"):
        assert torch.equal(getattr(together, field), torch.cat([getattr(a, field) for a in apart])), field
    alone = orchestra_views(first, generator=_gen(1))
    assert torch.equal(alone.view1, apart[0].view1) and torch.equal(alone.rotation_labels, apart[0].rotation_labels)
