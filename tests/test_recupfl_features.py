"""RecUP-FL's gradient features (Cui et al., Eq. 4: the concatenated update max-pooled to a
fixed size, differentiable) and the model zoo's file checks, without a trained setup."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gradleak.adversaries import gradient_features, load_zoo


def test_gradient_features_pool_the_concatenated_update_and_are_differentiable():
    update = {"a": torch.tensor([1.0, 5.0, 2.0]), "b": torch.tensor([[0.0, 7.0], [3.0, -1.0]])}
    leaves = {k: v.clone().requires_grad_(True) for k, v in update.items()}
    features = gradient_features(leaves, 2)  # windows [1, 5, 2, 0] and [0, 7, 3, -1]
    flat = torch.cat([v.flatten() for v in update.values()])
    expected = F.adaptive_max_pool1d(flat[None, None], 2)[0, 0]
    assert features.tolist() == expected.tolist() == [5.0, 7.0]
    features.sum().backward()
    assert leaves["a"].grad.tolist() == [0.0, 1.0, 0.0]  # only the window maxima
    assert leaves["b"].grad.tolist() == [[0.0, 1.0], [0.0, 0.0]]
    with pytest.raises(ValueError, match="feature size"):
        gradient_features(update, 0)


def test_load_zoo_refuses_a_file_that_is_not_a_zoo(tmp_path):
    torch.save({"weights": torch.zeros(3)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match=r"other\.pt is not a model zoo"):
        load_zoo(tmp_path / "other.pt")
    (tmp_path / "text.pt").write_text("not a checkpoint")
    with pytest.raises(ValueError, match=r"text\.pt is not a model zoo"):
        load_zoo(tmp_path / "text.pt")
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        load_zoo(tmp_path / "missing.pt")
