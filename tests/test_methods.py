"""The method registry: Orchestra, its ablations and the baselines, and the rules a method must follow."""

import pytest

from privfed.config import build_config
from privfed.errors import PrivfedError
from privfed.methods import (
    BASELINE_LOSSES,
    CLUSTERED,
    FIXED_RANDOM,
    NO_CENTROIDS,
    Method,
    Objective,
    available_methods,
    get_method,
    register_method,
)


def test_orchestra_and_its_ablations_are_registered_with_what_they_switch_off():
    methods = available_methods()
    assert methods["orchestra"].objective == Objective() and methods["orchestra"].centroids == CLUSTERED
    assert methods["rotpred"].objective == Objective(cluster_loss=False) and methods["rotpred"].centroids == NO_CENTROIDS
    assert methods["orchestra-no-rotation"].objective == Objective(rotation_loss=False)
    assert methods["orchestra-no-target"].objective == Objective(ema_targets=False)
    assert methods["orchestra-fixed-centroids"].centroids == FIXED_RANDOM
    assert [name for name, m in methods.items() if m.releases] == [
        "orchestra", "orchestra-no-rotation", "orchestra-no-target"
    ]


def test_a_method_must_be_consistent():
    with pytest.raises(ValueError, match="needs the cluster loss, the rotation loss or both"):
        Objective(cluster_loss=False, rotation_loss=False)
    with pytest.raises(ValueError, match="cluster loss needs global centroids"):
        Method("x", "x", Objective(), centroids=NO_CENTROIDS)
    with pytest.raises(ValueError, match="cluster loss needs global centroids"):
        Method("x", "x", Objective(cluster_loss=False), centroids=CLUSTERED)
    with pytest.raises(ValueError, match="unknown centroid source"):
        Method("x", "x", Objective(), centroids="learned")


def test_names_are_unique_and_unknown_names_list_the_choices():
    with pytest.raises(ValueError, match="already registered"):
        register_method(Method("rotpred", "again", Objective(cluster_loss=False), centroids=NO_CENTROIDS))
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
    for name in BASELINE_LOSSES:
        assert methods[name].objective.loss == name and methods[name].centroids == NO_CENTROIDS
        assert not methods[name].releases
        assert build_config(method=name, mechanism="ldp", epsilon=1.0).release_mechanism is None
    assert [n for n in BASELINE_LOSSES if methods[n].objective.ema_targets] == ["byol"]
    assert [n for n in BASELINE_LOSSES if methods[n].objective.couples_batch] == ["simclr", "specloss"]
    assert not any(methods[n].objective.uses_labels for n in BASELINE_LOSSES)
    supervised = methods["supervised"]
    assert supervised.objective.uses_labels and not supervised.releases and not supervised.objective.couples_batch

def test_a_baseline_objective_has_only_its_own_loss():
    with pytest.raises(ValueError, match="no cluster or rotation term"):
        Objective(loss="simclr", cluster_loss=False, rotation_loss=True, ema_targets=False)
    with pytest.raises(ValueError, match="BYOL and only BYOL"):
        Objective(loss="simsiam", cluster_loss=False, rotation_loss=False, ema_targets=True)
    with pytest.raises(ValueError, match="unknown loss 'moco'"):
        Objective(loss="moco")


@pytest.mark.parametrize(("method", "reason"), [
    ("simclr", "compares every image with the rest of its batch"),
    ("specloss", "compares every image with the rest of its batch"),
    ("byol", "DP-SGD trainer covers Orchestra and its ablations"),
    ("simsiam", "DP-SGD trainer covers Orchestra and its ablations"),
    ("supervised", "DP-SGD trainer covers Orchestra and its ablations"),
])
def test_dp_sgd_is_refused_for_the_baselines(method, reason):
    with pytest.raises(PrivfedError, match=reason):
        build_config(method=method, dp_sgd=True, dp_sgd_noise_multiplier=1.0)
    assert build_config(method="rotpred", dp_sgd=True, dp_sgd_noise_multiplier=1.0).dp_sgd
