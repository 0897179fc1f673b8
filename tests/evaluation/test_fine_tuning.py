"""Fine-tuning on a few labels: it learns what the labels teach, is reproducible, and leaves the encoder alone."""

from __future__ import annotations

import torch

from privfed.evaluation.fine_tuning import FineTuning, fine_tune_accuracy
from privfed.models import BACKBONES

QUICK = FineTuning(epochs=15, batch_size=16, lr=0.05)


def colour_classes(per_class: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Three classes any network separates: red, green or blue images, with noise."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(3).repeat_interleave(per_class)
    images = torch.randint(0, 60, (3 * per_class, 3, 32, 32), generator=generator)
    images[torch.arange(len(labels)), labels] += 180
    return images.to(torch.uint8), labels


def test_a_few_labels_teach_an_easy_problem_and_the_encoder_is_untouched():
    train_images, train_labels = colour_classes(40, seed=0)
    test_images, test_labels = colour_classes(20, seed=1)
    torch.manual_seed(0)
    backbone = BACKBONES["resnet8"]()
    before = {k: v.clone() for k, v in backbone.state_dict().items()}
    accuracy, used = fine_tune_accuracy(backbone, train_images, train_labels, test_images, test_labels,
                                        fraction=0.25, seed=0, device=torch.device("cpu"), schedule=QUICK)
    assert used == 30  # 10 of each class's 40
    assert accuracy > 0.9
    assert all(torch.equal(before[k], v) for k, v in backbone.state_dict().items())


def test_the_same_seed_gives_the_same_accuracy():
    train_images, train_labels = colour_classes(20, seed=0)
    test_images = torch.randint(0, 256, (30, 3, 32, 32), dtype=torch.uint8)
    test_labels = torch.randint(0, 3, (30,))
    torch.manual_seed(0)
    backbone = BACKBONES["resnet8"]()
    runs = [fine_tune_accuracy(backbone, train_images, train_labels, test_images, test_labels, fraction=0.5,
                               seed=seed, device=torch.device("cpu"), schedule=FineTuning(epochs=2, batch_size=8))
            for seed in (3, 3)]
    assert runs[0] == runs[1]
