import torch

from mechanisms import create_mechanism


def test_reps_releases_exactly_its_input_with_unit_weights():
    x = torch.nn.functional.normalize(torch.randn(37, 16, generator=torch.Generator().manual_seed(0)), dim=1)
    release = create_mechanism("reps").release(x, num_centroids=8, generator=torch.Generator())
    assert torch.equal(release.vectors, x)
    assert torch.equal(release.weights, torch.ones(37))
    assert release.guarantee.kind == "none" and release.events == ()


def test_reps_handles_an_empty_client():
    release = create_mechanism("reps").release(torch.zeros(0, 4), num_centroids=8, generator=torch.Generator())
    assert release.vectors.shape == (0, 4)
