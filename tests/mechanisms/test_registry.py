import pytest
import torch

from mechanisms import (
    Guarantee,
    Mechanism,
    Release,
    UnknownMechanismError,
    available_mechanisms,
    create_mechanism,
    register_mechanism,
)
from mechanisms import registry


def test_builtin_kanon_is_listed_with_a_description():
    assert "kanon" in available_mechanisms()
    assert available_mechanisms()["kanon"]


def test_unknown_name_lists_installed_mechanisms():
    with pytest.raises(UnknownMechanismError, match="kanon"):
        create_mechanism("no-such-mechanism")


def test_third_party_mechanism_can_register_without_editing_privfed(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    @register_mechanism
    class FirstVector(Mechanism):
        name = "first-vector-test"
        description = "test mechanism"

        def guarantee(self, *, num_reps, num_centroids):
            return Guarantee(kind="none", statement="none")

        def release(self, reps, *, num_centroids, generator):
            return Release(reps[:1], torch.ones(1), self.guarantee(num_reps=len(reps), num_centroids=1))

    assert "first-vector-test" in available_mechanisms()
    out = create_mechanism("first-vector-test").release(torch.eye(3), num_centroids=1, generator=torch.Generator())
    assert out.num_vectors == 1


def test_name_clash_is_rejected(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    with pytest.raises(ValueError, match="already taken"):

        @register_mechanism
        class Clash(Mechanism):
            name = "kanon"
            description = "clash"

            def guarantee(self, *, num_reps, num_centroids):
                raise NotImplementedError

            def release(self, reps, *, num_centroids, generator):
                raise NotImplementedError


def test_release_validates_shapes():
    with pytest.raises(ValueError):
        Release(torch.zeros(3, 2), torch.zeros(2), Guarantee(kind="none", statement=""))
