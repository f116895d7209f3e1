"""StyleGAN2 (rosinality/stylegan2-pytorch layout) and BigGAN-deep (huggingface/
pytorch-pretrained-BigGAN layout) generators: built small with random weights, images of
the right shape in [0, 1], the synthesis split into the blocks GIFD searches gives the
same images, a saved state reloads through the port-format loader bit for bit, and a file
that does not fit is refused naming the file and the first bad key (docs/errors.md)."""

from __future__ import annotations

import pytest
import torch

from gradleak.models.biggan import BigGANGenerator, load_biggan
from gradleak.models.stylegan2 import StyleGAN2Generator, load_stylegan2
from gradleak.utils.io import ArtifactError, save_torch

SG_ARCH = {"latent_dim": 16, "n_mlp": 2, "widths": {4: 8, 8: 8, 16: 4, 32: 4}}
BG_ARCH = {"latent_dim": 8, "channel_width": 4, "num_classes": 5, "widths": (4, 4, 2, 1),
           "attention_resolution": 16}


def _stylegan(seed: int = 0) -> StyleGAN2Generator:
    torch.manual_seed(seed)
    net = StyleGAN2Generator(32, **SG_ARCH).eval()
    with torch.no_grad():  # non-zero noise strengths and biases, so every parameter matters
        for name, p in net.named_parameters():
            if name.endswith(("noise.weight", "activate.bias", "to_rgb1.bias")):
                p.normal_(0, 0.1)
    return net


def _biggan(seed: int = 0) -> BigGANGenerator:
    torch.manual_seed(seed)
    net = BigGANGenerator(32, **BG_ARCH).eval()
    with torch.no_grad():  # the attention's gain starts at 0; BatchNorm statistics not 0/1
        for name, b in [*net.named_parameters(), *net.named_buffers()]:
            if name.endswith("gamma"):
                b.fill_(0.5)
            elif name.endswith("running_means"):
                b.normal_(0, 0.1)
            elif name.endswith("running_vars"):
                b.uniform_(0.5, 1.5)
    return net


def test_stylegan2_images_and_blocks():
    net = _stylegan()
    z = torch.randn(3, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        images = net(z)
        w = net.mapping(z)
        raw = net.synthesis(w)
        state = net.block(1, w, net.block(0, w))  # 8x8 features and rgb skip
        resumed = net.synthesis(w, start=2, state=state)
        w_plus = net.synthesis(w.unsqueeze(1).expand(-1, net.n_latent, -1))
    assert images.shape == (3, 3, 32, 32) and net.n_latent == 8 and net.blocks == 4
    assert images.min() >= 0 and images.max() <= 1 and images.std() > 0
    assert not torch.equal(images[0], images[1])
    assert torch.equal(images, ((raw + 1) / 2).clamp(0, 1))
    assert state[0].shape == (3, 8, 8, 8) and state[1].shape == (3, 3, 8, 8)
    assert torch.equal(resumed, raw) and torch.equal(w_plus, raw)
    assert raw.shape == (3, 3, 32, 32)


def test_stylegan2_port_keys():
    keys = set(_stylegan().state_dict())
    assert {"style.1.weight", "style.2.bias", "input.input", "conv1.conv.modulation.bias",
            "conv1.noise.weight", "conv1.activate.bias", "to_rgb1.conv.weight",
            "convs.0.conv.blur.kernel", "convs.5.activate.bias", "to_rgbs.2.upsample.kernel",
            "noises.noise_6"} <= keys
    assert "noises.noise_7" not in keys and "to_rgb1.upsample.kernel" not in keys


def test_stylegan2_reload_is_bit_exact(tmp_path):
    net = _stylegan()
    path = save_torch(tmp_path / "g.pt", {"g_ema": net.state_dict(),
                                          "latent_avg": torch.zeros(16)})
    bare = save_torch(tmp_path / "bare.pt", net.state_dict())
    z = torch.randn(4, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = net(z)
        for file in (path, bare):
            torch.manual_seed(99)  # a different construction draw: the file decides
            loaded = load_stylegan2(file, 32, **SG_ARCH)
            assert not loaded.training
            assert torch.equal(loaded(z), expected)


def test_stylegan2_refuses_a_file_that_does_not_fit(tmp_path):
    state = _stylegan().state_dict()
    missing = dict(state)
    del missing["convs.1.conv.weight"]
    with pytest.raises(ArtifactError, match=r"missing\.pt does not fit the StyleGAN2 generator"
                       r" .*missing key 'convs\.1\.conv\.weight' \(1 missing\)"):
        load_stylegan2(save_torch(tmp_path / "missing.pt", {"g_ema": missing}), 32, **SG_ARCH)
    extra = {**state, "convs.9.conv.weight": torch.zeros(1)}
    with pytest.raises(ArtifactError, match=r"extra\.pt does not fit .*unexpected key "
                       r"'convs\.9\.conv\.weight'"):
        load_stylegan2(save_torch(tmp_path / "extra.pt", extra), 32, **SG_ARCH)
    with pytest.raises(ArtifactError, match=r"g\.pt does not fit .*key 'input\.input' has "
                       r"shape \(1, 8, 4, 4\), expected \(1, 16, 4, 4\)"):
        load_stylegan2(save_torch(tmp_path / "g.pt", state), 32,
                       **{**SG_ARCH, "widths": {4: 16, 8: 8, 16: 4, 32: 4}})
    with pytest.raises(ArtifactError, match=r"odd\.pt is not a state dict of the StyleGAN2"):
        load_stylegan2(save_torch(tmp_path / "odd.pt", {"g_ema": [1, 2]}), 32, **SG_ARCH)
    with pytest.raises(FileNotFoundError, match=r"checkpoint not found: .*absent\.pt"):
        load_stylegan2(tmp_path / "absent.pt", 32, **SG_ARCH)


def test_stylegan2_bad_architecture():
    with pytest.raises(ValueError, match="resolution must be a power of 2, at least 4; got 48"):
        StyleGAN2Generator(48)
    with pytest.raises(ValueError, match=r"widths must give .* \[4, 8\]; got \{4: 8\}"):
        StyleGAN2Generator(8, widths={4: 8})
    net = _stylegan()
    with pytest.raises(ValueError, match=r"styles must be \(B, 16\) or \(B, 8, 16\); got "
                       r"\(2, 3, 16\)"):
        net.synthesis(torch.zeros(2, 3, 16))


def test_biggan_images_classes_and_blocks():
    net = _biggan()
    z = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    classes = torch.tensor([0, 3, 4])
    with torch.no_grad():
        images = net(z, classes)
        onehot = net(z, torch.nn.functional.one_hot(classes, 5).float())
        other = net(z, torch.tensor([1, 1, 1]))
        cond = net.condition(z, classes)
        h = net.stem(cond)
        for k in range(net.blocks):
            h = net.block(k, h, cond)
        split = (net.head(h) + 1) / 2
    assert images.shape == (3, 3, 32, 32) and net.blocks == 7
    assert images.min() >= 0 and images.max() <= 1 and images.std() > 0
    assert torch.equal(images, onehot) and torch.equal(images, split)
    assert not torch.equal(images, other)  # class-conditional
    assert type(net.generator.layers[4]).__name__ == "SelfAttn"  # before the 16x16 blocks


def test_biggan_port_keys():
    keys = set(_biggan().state_dict())
    assert {"embeddings.weight", "generator.gen_z.weight_orig", "generator.gen_z.weight_u",
            "generator.gen_z.weight_v", "generator.gen_z.bias",
            "generator.layers.0.bn_0.running_means", "generator.layers.0.bn_0.scale.weight_orig",
            "generator.layers.0.conv_3.weight_v", "generator.layers.4.gamma",
            "generator.layers.4.snconv1x1_o_conv.weight_orig", "generator.bn.weight",
            "generator.bn.running_vars", "generator.conv_to_rgb.weight_orig"} <= keys
    assert "generator.layers.0.bn_0.scale.bias" not in keys


def test_biggan_reload_is_bit_exact(tmp_path):
    net = _biggan()
    path = save_torch(tmp_path / "pytorch_model.bin", net.state_dict())
    z = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    classes = torch.tensor([0, 1, 2, 4])
    with torch.no_grad():
        torch.manual_seed(99)
        loaded = load_biggan(path, 32, **BG_ARCH)
        assert not loaded.training
        assert torch.equal(loaded(z, classes), net(z, classes))
        net.truncation = loaded.truncation = 0.45  # interpolated BatchNorm statistics
        assert torch.equal(loaded(z, classes), net(z, classes))


def test_biggan_refuses_a_file_that_does_not_fit(tmp_path):
    state = _biggan().state_dict()
    missing = {k: v for k, v in state.items() if k != "generator.layers.2.conv_1.weight_u"}
    with pytest.raises(ArtifactError, match=r"m\.bin does not fit the BigGAN-deep generator "
                       r".*missing key 'generator\.layers\.2\.conv_1\.weight_u'"):
        load_biggan(save_torch(tmp_path / "m.bin", missing), 32, **BG_ARCH)
    extra = {**state, "generator.layers.0.bn_0.scale.bias": torch.zeros(16)}
    with pytest.raises(ArtifactError, match=r"e\.bin does not fit .*unexpected key "
                       r"'generator\.layers\.0\.bn_0\.scale\.bias'"):
        load_biggan(save_torch(tmp_path / "e.bin", extra), 32, **BG_ARCH)
    with pytest.raises(ArtifactError, match=r"w\.bin does not fit .*key 'embeddings\.weight' "
                       r"has shape \(8, 5\), expected \(8, 10\)"):
        load_biggan(save_torch(tmp_path / "w.bin", state), 32, **{**BG_ARCH, "num_classes": 10})


def test_biggan_bad_architecture():
    with pytest.raises(ValueError, match="resolution must be 4 times a power of 2, at least 8; "
                       "got 48"):
        BigGANGenerator(48)
    with pytest.raises(ValueError, match=r"widths must be 4 positive multipliers"):
        BigGANGenerator(32, widths=(16, 4, 2, 1))
    with pytest.raises(ValueError, match=r"attention_resolution must be one of \[4, 8, 16\]; "
                       r"got 32"):
        BigGANGenerator(32, widths=(16, 16, 8, 4), attention_resolution=32)
    with pytest.raises(ValueError, match=r"truncation must be in \(0, 1\]; got 0"):
        BigGANGenerator(128, truncation=0)
