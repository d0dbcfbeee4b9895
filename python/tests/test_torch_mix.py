"""sluice.torch's MixUp / CutMix against torchvision.transforms.v2's: the same parameters
give the same images and soft targets, and the parameters depend only on (seed, epoch,
batch index)."""

from __future__ import annotations

from typing import Any, Dict

import pytest

torch = pytest.importorskip("torch")
v2 = pytest.importorskip("torchvision.transforms.v2")

from sluice.torch import CutMix, MixUp, MixUpOrCutMix  # noqa: E402

B, C, H, W, K = 6, 3, 17, 23, 10


def batch(seed: int = 0) -> Any:
    g = torch.Generator().manual_seed(seed)
    images = torch.rand((B, C, H, W), generator=g)
    labels = torch.randint(0, K, (B,), generator=g)
    return images, labels


def torchvision_apply(tv: Any, images: Any, labels: Any, params: Dict[str, Any]) -> Any:
    """torchvision's own transform step with our parameters (its forward with the draw replaced)."""
    full = {"labels": labels, "batch_size": B, **params}
    return tv.transform(images, full), tv.transform(labels, full)


def test_mixup_matches_torchvision_for_the_same_lambda() -> None:
    images, labels = batch()
    ours = MixUp(alpha=0.4, num_classes=K, seed=3)
    for index in range(4):
        params = ours.params((H, W), index)
        assert 0.0 <= float(params["lam"]) <= 1.0
        got_images, got_labels = ours(images, labels, batch_index=index)
        want_images, want_labels = torchvision_apply(v2.MixUp(alpha=0.4, num_classes=K), images, labels, params)
        torch.testing.assert_close(got_images, want_images)
        torch.testing.assert_close(got_labels, want_labels)
        torch.testing.assert_close(got_labels.sum(dim=1), torch.ones(B))


def test_cutmix_matches_torchvision_for_the_same_box() -> None:
    images, labels = batch(1)
    ours = CutMix(alpha=1.0, num_classes=K, seed=5)
    boxes = set()
    for index in range(8):
        params = ours.params((H, W), index)
        x1, y1, x2, y2 = params["box"]  # type: ignore[misc]
        assert 0 <= x1 <= x2 <= W and 0 <= y1 <= y2 <= H
        boxes.add(params["box"])
        got_images, got_labels = ours(images, labels, batch_index=index)
        want_images, want_labels = torchvision_apply(v2.CutMix(alpha=1.0, num_classes=K), images, labels, params)
        torch.testing.assert_close(got_images, want_images)
        torch.testing.assert_close(got_labels, want_labels)
        # The label weight is the pasted area, as torchvision's lam_adjusted.
        area = (x2 - x1) * (y2 - y1) / (H * W)
        assert abs(float(params["lam_adjusted"]) - (1.0 - area)) < 1e-9
    assert len(boxes) > 1


def test_draws_depend_only_on_seed_epoch_and_batch_index() -> None:
    images, labels = batch()
    a, b = MixUp(alpha=1.0, num_classes=K, seed=7), MixUp(alpha=1.0, num_classes=K, seed=7)
    # Counting calls gives the same as explicit indices.
    counted = [a(images, labels)[0] for _ in range(3)]
    explicit = [b(images, labels, batch_index=i)[0] for i in range(3)]
    for x, y in zip(counted, explicit):
        assert torch.equal(x, y)
    lams = [a.params((H, W), i)["lam"] for i in range(50)]
    assert len(set(lams)) == 50
    # Beta(1, 1) is uniform: the mean of 50 draws is near 0.5.
    assert 0.3 < sum(lams) / 50 < 0.7  # type: ignore[arg-type]
    a.set_epoch(1)
    assert a.params((H, W), 0) != b.params((H, W), 0)
    assert a.params((H, W), 0) == b.params((H, W), 0, epoch=1)
    assert MixUp(seed=8).params((H, W), 0) != b.params((H, W), 0)
    # set_epoch restarts the count.
    a.set_epoch(1)
    first = a(images, labels)[0]
    assert torch.equal(first, a(images, labels, batch_index=0)[0])


def test_mixup_or_cutmix_chooses_per_batch_and_delegates() -> None:
    images, labels = batch(2)
    mix = MixUpOrCutMix(mixup_alpha=0.2, cutmix_alpha=1.0, num_classes=K, seed=11)
    chosen = set()
    for index in range(16):
        params = mix.params((H, W), index)
        chosen.add(params["which"])
        tv = v2.CutMix(alpha=1.0, num_classes=K) if params["which"] == 0.0 else v2.MixUp(alpha=0.2, num_classes=K)
        got = mix(images, labels, batch_index=index)
        want = torchvision_apply(tv, images, labels, params)
        torch.testing.assert_close(got[0], want[0])
        torch.testing.assert_close(got[1], want[1])
    assert chosen == {0.0, 1.0}


def test_soft_labels_pass_through_and_bad_inputs_are_refused() -> None:
    images, labels = batch()
    soft = torch.nn.functional.one_hot(labels, K).float()
    mix = MixUp(alpha=1.0, seed=1)
    _, mixed = mix(images, soft, batch_index=0)
    torch.testing.assert_close(mixed.sum(dim=1), torch.ones(B))
    with pytest.raises(ValueError, match="num_classes"):
        mix(images, labels, batch_index=0)
    with pytest.raises(ValueError, match="alpha"):
        MixUp(alpha=0.0)
    with pytest.raises(ValueError, match="B, C, H, W"):
        mix(images[0], soft, batch_index=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_mixing_runs_on_the_device_the_batch_is_on() -> None:
    images, labels = batch()
    mix = CutMix(num_classes=K, seed=2)
    on_cpu = mix(images, labels, batch_index=3)
    on_gpu = mix(images.cuda(), labels.cuda(), batch_index=3)
    assert on_gpu[0].device.type == "cuda"
    torch.testing.assert_close(on_gpu[0].cpu(), on_cpu[0])
    torch.testing.assert_close(on_gpu[1].cpu(), on_cpu[1])
