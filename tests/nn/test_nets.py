"""The paper's networks in their CIFAR-10 forms (Section 5): output shapes and parameter counts."""

import pytest
import torch

from stlsgd.problems.nets import VGG16, ResNet18, SmallCNN, make_model, num_parameters


@pytest.mark.parametrize(
    ("cls", "expected"),
    [(ResNet18, 11_173_962), (VGG16, 14_728_266)],  # kuangliu/pytorch-cifar's counts for the same forms
)
def test_cifar_models_give_ten_logits_and_paper_sizes(cls: type, expected: int) -> None:
    torch.manual_seed(0)
    model = cls().eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)
    assert num_parameters(model) == expected
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())


def test_resnet18_has_3x3_stem_and_no_maxpool() -> None:
    model = ResNet18()
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in model.modules())


def test_small_cnn_on_mnist_and_cifar_shapes() -> None:
    assert SmallCNN()(torch.randn(4, 1, 28, 28)).shape == (4, 10)
    assert num_parameters(SmallCNN()) == 9_250  # 200 + 16 + 1152 + 32 conv/BN, 16*7*7*10 + 10 linear
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in SmallCNN().modules())
    assert make_model("cnn", 3, 10, 32)(torch.randn(1, 3, 32, 32)).shape == (1, 10)


def test_vgg16_refuses_images_smaller_than_32() -> None:
    with pytest.raises(ValueError, match="32x32"):
        make_model("vgg16", 1, 10, 28)
