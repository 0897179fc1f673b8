"""The method registry: Orchestra, its ablations and the baselines, and the rules a method must follow."""

import pytest

from privfed.config import build_config
from privfed.errors import PrivfedError
from privfed.methods import (
    CLUSTERED,
    FIXED_RANDOM,
    NO_CENTROIDS,
    Orchestra,
    available_methods,
    get_method,
    register_method,
)

BASELINES = ("simclr", "simsiam", "byol", "specloss")


def test_orchestra_and_its_ablations_are_registered_with_what_they_switch_off():
    methods = available_methods()
    assert list(methods)[:5] == [
        "orchestra", "rotpred", "orchestra-no-rotation", "orchestra-no-target", "orchestra-fixed-centroids"
    ]
    assert methods["orchestra"] == Orchestra(name="orchestra", description=methods["orchestra"].description)
    assert not methods["rotpred"].cluster_loss and methods["rotpred"].centroids == NO_CENTROIDS
    assert not methods["orchestra-no-rotation"].rotation_loss
    assert methods["orchestra-no-rotation"].untrained_heads == ("rotation",)
    assert not methods["orchestra-no-target"].ema_targets and methods["orchestra-no-target"].heads.target
    assert methods["orchestra-fixed-centroids"].centroids == FIXED_RANDOM
    assert {m.loss for m in list(methods.values())[:5]} == {"orchestra"}
    assert [name for name, m in methods.items() if m.releases] == [
        "orchestra", "orchestra-no-rotation", "orchestra-no-target"
    ]


def test_a_method_must_be_consistent():
    with pytest.raises(ValueError, match="needs the cluster loss, the rotation loss or both"):
        Orchestra(name="x", description="x", cluster_loss=False, rotation_loss=False, centroids=NO_CENTROIDS)
    with pytest.raises(ValueError, match="cluster loss needs global centroids"):
        Orchestra(name="x", description="x", centroids=NO_CENTROIDS)
    with pytest.raises(ValueError, match="cluster loss needs global centroids"):
        Orchestra(name="x", description="x", cluster_loss=False, centroids=CLUSTERED)
    with pytest.raises(ValueError, match="unknown centroid source"):
        Orchestra(name="x", description="x", centroids="learned")
    with pytest.raises(ValueError, match="declares no target encoder"):
        get_method("simsiam").__class__(name="x", description="x", pair_loss=lambda *a: None, ema_targets=True)


def test_names_are_unique_and_unknown_names_list_the_choices():
    with pytest.raises(ValueError, match="already registered"):
        register_method(Orchestra(name="rotpred", description="again", cluster_loss=False, centroids=NO_CENTROIDS))
    with pytest.raises(ValueError, match="choose from orchestra, rotpred"):
        get_method("moco")
    with pytest.raises(PrivfedError, match="unknown method 'moco'"):
        build_config(method="moco")


def test_a_method_that_releases_nothing_is_not_held_to_the_centroid_count():
    # 2 sampled clients x 1 local centroid < 16 global centroids: refused only when centroids are released.
    options = dict(num_clients=2, participation=1.0, num_local_centroids=1, num_global_centroids=16)
    with pytest.raises(PrivfedError, match="fewer than num_global_centroids"):
        build_config(**options)
    assert build_config(**options, method="rotpred").method == "rotpred"


def test_the_papers_baselines_are_registered_and_release_nothing():
    methods = available_methods()
    for name in BASELINES:
        assert methods[name].loss == name and methods[name].centroids == NO_CENTROIDS
        assert not methods[name].releases
        assert build_config(method=name).release_mechanism is None
        with pytest.raises(PrivfedError, match="releases nothing, so --mechanism does not apply"):
            build_config(method=name, mechanism="ldp", epsilon=1.0)
    assert [n for n in BASELINES if methods[n].ema_targets] == ["byol"]
    assert [n for n in BASELINES if methods[n].couples_batch] == ["simclr", "specloss"]
    assert not any(methods[n].reads_labels for n in BASELINES)
    supervised = methods["supervised"]
    assert supervised.reads_labels and not supervised.releases and not supervised.couples_batch


def test_dp_sgd_is_refused_where_the_method_declares_a_coupled_batch():
    for name in ("simclr", "specloss"):
        with pytest.raises(PrivfedError, match="per-sample clipping does not bound"):
            build_config(method=name, dp_sgd=True)
