import math

import numpy as np
import pandas as pd
import torch

from gradleak import metrics


def test_identical_images_score_perfectly(digits):
    x = digits.x[:3]
    assert metrics.psnr(x, x) == 100.0
    assert math.isclose(metrics.ssim(x, x), 1.0)
    assert metrics.mse(x, x) == 0.0


def test_psnr_matches_its_definition(digits):
    x = digits.x[:1]
    noisy = (x + 0.1).clamp(0, 1)
    expected = 10 * math.log10(1 / float(((noisy - x) ** 2).mean()))
    assert math.isclose(metrics.psnr(noisy, x), expected, rel_tol=1e-6)


def test_flat_psnr_is_a_uniform_image_in_the_data_s_mean_colour(digits):
    """The bar of decision 0111: one uniform image in a given colour against each true
    image, unmatched; the images' own mean colour scores it from the mean over pixels."""
    x = digits.x[:3]
    colour = digits.x.mean((0, 2, 3))
    flat = colour.reshape(1, -1, 1, 1).expand_as(x)
    expected = [10 * math.log10(1 / float(((flat[0] - t) ** 2).mean())) for t in x]
    assert np.allclose(metrics.flat_psnr(x, colour, "none"), expected, rtol=1e-6)
    assert math.isclose(metrics.flat_psnr(x, colour), float(np.mean(expected)), rel_tol=1e-6)
    assert metrics.flat_psnr(x, colour) < metrics.psnr((x + 0.02).clamp(0, 1), x)
    assert metrics.flat_psnr(torch.full((1, 3, 4, 4), 0.3), torch.full((3,), 0.3)) == 100.0


def test_matching_undoes_a_permutation(digits):
    x = digits.x[:5]
    shuffled = x[torch.tensor([3, 0, 4, 1, 2])]
    assert torch.equal(metrics.match(shuffled, x), x)
    assert metrics.psnr(shuffled, x) == 100.0


def test_lpips_is_nan_with_a_reason_when_weights_are_missing(digits, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    reason = metrics.lpips_unavailable_reason()
    assert reason is not None and str(tmp_path) in reason
    assert np.isnan(metrics.lpips(digits.x[:2], digits.x[:2]))


def test_lpips_on_vgg_reads_torchvision_s_vgg16_file_from_the_hub_cache(digits, monkeypatch,
                                                                       tmp_path):
    """CENSOR's LPIPS (VGG-16 features, `attack.outputs.lpips_net: vgg`) from a VGG-16 file
    in torchvision's format (random weights here): NaN with a reason before the file is
    there, then 0 for an image itself and more for a noisier copy; AlexNet's stays NaN."""
    from torchvision.models import vgg

    from gradleak.metrics import image

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    image._lpips_model.cache_clear()
    x = digits.x[:2]
    assert "LPIPS vgg backbone weights not found" in metrics.lpips_unavailable_reason("vgg")
    assert np.isnan(metrics.lpips(x, x, net="vgg"))
    torch.manual_seed(0)
    features = vgg.make_layers(vgg.cfgs["D"])  # VGG-16's convolutions, as vgg16().features
    path = image.lpips_backbone_path("vgg")
    path.parent.mkdir(parents=True)
    torch.save({f"features.{k}": v for k, v in features.state_dict().items()}, path)
    try:
        noisy = (x + 0.2 * torch.rand_like(x)).clamp(0, 1)
        noisier = (x + 0.6 * torch.rand_like(x)).clamp(0, 1)
        assert metrics.lpips(x, x, net="vgg") == 0.0
        assert 0 < metrics.lpips(noisy, x, net="vgg") < metrics.lpips(noisier, x, net="vgg")
        assert np.isnan(metrics.lpips(x, x))
    finally:
        image._lpips_model.cache_clear()


def test_pmm_is_the_accuracy_ratio():
    assert metrics.pmm(0.45, 0.9) == 50.0
    assert np.isnan(metrics.pmm(0.0, 0.0))  # an undefended run that learnt nothing: no PMM
    table = pd.Series([0.45, 0.3], index=[3, 7])
    assert metrics.pmm(table, pd.Series([0.9, 0.0], index=[3, 7])).tolist()[0] == 50.0
    assert np.isnan(metrics.pmm(table, pd.Series([0.9, 0.0], index=[3, 7]))[7])


def test_stlpips_is_zero_for_identical_images_and_orders_a_blur_series():
    """ST-LPIPS from the weights inside the stlpips-pytorch wheel, offline: 0 for the image
    itself, and growing with the blur (16x16 digits, upsampled to 32 for its AlexNet)."""
    from torchvision.transforms.functional import gaussian_blur

    from gradleak import data

    x = data.load_digits(channels=1, size=16).x[:4]
    assert metrics.stlpips(x, x) == 0.0
    blurred = [metrics.stlpips(gaussian_blur(x, 7, sigma), x) for sigma in (0.5, 1.0, 2.0, 4.0)]
    assert all(np.isfinite(blurred)) and blurred == sorted(blurred) and blurred[0] > 0
