import pytest
import torch

from mechanisms import (
    Guarantee,
    Mechanism,
    MechanismRegistrationError,
    Release,
    ReleaseMechanism,
    SecureSumMechanism,
    UnknownMechanismError,
    available_mechanisms,
    create_mechanism,
    get_mechanism_class,
    register_mechanism,
    registry,
)


def test_builtin_kanon_is_listed_with_a_description():
    assert "kanon" in available_mechanisms()
    assert available_mechanisms()["kanon"]


def test_unknown_name_lists_installed_mechanisms():
    with pytest.raises(UnknownMechanismError, match="kanon"):
        create_mechanism("no-such-mechanism")


def test_third_party_mechanism_can_register_without_editing_privfed(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    @register_mechanism
    class FirstVector(ReleaseMechanism):
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
        class Clash(ReleaseMechanism):
            name = "kanon"
            description = "clash"

            def guarantee(self, *, num_reps, num_centroids):
                raise NotImplementedError

            def release(self, reps, *, num_centroids, generator):
                raise NotImplementedError


def test_release_validates_shapes():
    with pytest.raises(ValueError):
        Release(torch.zeros(3, 2), torch.zeros(2), Guarantee(kind="none", statement=""))


def _mechanism(name: str, **attributes) -> type[Mechanism]:
    def guarantee(self, *, num_reps, num_centroids):
        return Guarantee(kind="none", statement="none")

    def release(self, reps, *, num_centroids, generator):
        raise NotImplementedError

    return type(name, (ReleaseMechanism,), {"name": name, "description": "test", "guarantee": guarantee, "release": release, **attributes})


def test_a_mechanism_that_does_not_say_claims_nothing(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    cls = register_mechanism(_mechanism("silent"))
    assert cls.guarantee_kind == "none" and not cls.is_differentially_private() and not cls.releases_raw_data
    with pytest.raises(NotImplementedError, match="not differentially private"):
        cls.calibrate(epsilon=1.0, delta=1e-5, num_releases=3)


def test_a_class_of_neither_kind_or_of_both_is_refused(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    neither = type("neither", (Mechanism,), {"name": "neither", "description": "test", **{
        name: getattr(_mechanism("x"), name) for name in ("guarantee", "release", "releases_in")
    }})
    both = type("both", (_mechanism("x"), SecureSumMechanism), {"name": "both"})
    for cls in (neither, both):
        with pytest.raises(MechanismRegistrationError, match=r"must subclass exactly one of .*ReleaseMechanism and SecureSumMechanism"):
            register_mechanism(cls)
    assert not {"neither", "both"} & set(registry._REGISTRY)


def test_a_class_that_changes_when_its_kind_sends_is_refused(monkeypatch):
    """The server clusters round 0's releases and a secure sum has none: when a kind sends is the kind's, not a plug-in's."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    skipping = _mechanism("skips-round-0", releases_in=classmethod(lambda cls, *, train: train))
    with pytest.raises(MechanismRegistrationError, match=r"overrides releases_in.*a ReleaseMechanism sends in every round"):
        register_mechanism(skipping)
    fewer = _mechanism("plans-one-release", max_releases=classmethod(lambda cls, rounds: 1))
    with pytest.raises(MechanismRegistrationError, match="overrides max_releases"):
        register_mechanism(fewer)
    assert not {"skips-round-0", "plans-one-release"} & set(registry._REGISTRY)


def test_an_instance_cannot_answer_otherwise_than_its_class_whether_a_round_sends():
    from mechanisms import create_mechanism, round_releases

    sums = create_mechanism("ddp-sums", **get_mechanism_class("ddp-sums").calibrate(epsilon=20.0, delta=1e-6, num_releases=3),
                            min_shares=2)
    sums.releases_in = lambda *, train: True  # what the client guard asks is the class's answer, so the compute path's is too
    assert not round_releases(sums, round_index=0) and round_releases(sums, round_index=1)


def test_a_dp_claim_without_its_own_calibration_and_events_is_refused(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    with pytest.raises(MechanismRegistrationError, match="calibrate or privacy_events"):
        register_mechanism(_mechanism("bare-dp", guarantee_kind="differential-privacy"))
    with pytest.raises(MechanismRegistrationError, match="privacy_events"):
        register_mechanism(
            _mechanism("half-dp", guarantee_kind="differential-privacy", calibrate=classmethod(lambda cls, **kw: {}))
        )
    with pytest.raises(MechanismRegistrationError, match="guarantee_kind 'private-ish'"):
        register_mechanism(_mechanism("vague", guarantee_kind="private-ish"))
    assert not {"bare-dp", "half-dp", "vague"} & set(registry._REGISTRY)


@pytest.mark.parametrize(
    "value,message",
    [("no_such_module_anywhere:Mechanism", "cannot be loaded"), ("mechanisms.kanon:KAnonymousCentroids", "must agree")],
)
def test_a_broken_plugin_is_named(monkeypatch, value, message):
    from importlib.metadata import EntryPoint

    plugin = EntryPoint(name="plugin", value=value, group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_loaded_groups", set())
    monkeypatch.setattr(registry, "entry_points", lambda group: [plugin] if group == registry.ENTRY_POINT_GROUP else [])
    with pytest.raises(MechanismRegistrationError, match=f"'plugin'.*{message}"):
        available_mechanisms()


def test_raw_data_cannot_claim_a_guarantee_and_a_static_calibrate_is_read(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    with pytest.raises(MechanismRegistrationError, match="releases raw data"):
        register_mechanism(_mechanism("raw-kanon", guarantee_kind="k-anonymity", releases_raw_data=True))
    with pytest.raises(MechanismRegistrationError, match="privacy_events"):
        register_mechanism(
            _mechanism("static-dp", guarantee_kind="differential-privacy", calibrate=staticmethod(lambda **kw: {}))
        )
