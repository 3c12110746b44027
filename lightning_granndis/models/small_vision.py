"""torchvision's MobileNetV2 and ResNet-18 adapted to small images, and cut into blocks.

Small images (8–32 px) lose too much to ImageNet stems, so the first convolution keeps the
resolution (stride 1, 3x3) and ResNet's max-pool is dropped, as usual for CIFAR. The cut follows
the networks' own stages: six blocks for MobileNetV2 are the artifact's teacher
(``mobilenetv2_100.blocks[1:]``): stem + 16 + 24, 32, 64, 96, 160, 320 + head.
"""

from __future__ import annotations

from torch import nn

from lightning_granndis.distill.schedule import row_range

ARCHS = ("mobilenet_v2", "resnet18")


def small_image_net(arch: str = "mobilenet_v2", num_classes: int = 10, in_channels: int = 3,
                    width_mult: float = 1.0) -> nn.Module:
    """A torchvision classifier for small images, randomly initialised (no download).

    Args:
        arch: ``"mobilenet_v2"`` (default) or ``"resnet18"``.
        num_classes: output classes (default 10).
        in_channels: image channels (default 3).
        width_mult: MobileNetV2's width multiplier (default 1.0; ResNet-18 has none).
    """
    import torchvision

    if arch == "mobilenet_v2":
        net = torchvision.models.mobilenet_v2(num_classes=num_classes, width_mult=width_mult)
        stem = net.features[0][0]
        net.features[0][0] = nn.Conv2d(in_channels, stem.out_channels, 3, stride=1, padding=1, bias=False)
        return net
    if arch == "resnet18":
        if width_mult != 1.0:
            raise ValueError("torchvision's ResNet-18 has no width multiplier; use width_mult=1.0 or mobilenet_v2.")
        net = torchvision.models.resnet18(num_classes=num_classes)
        net.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
        return net
    raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(ARCHS)}.")


def _units(net: nn.Module, arch: str) -> tuple[list[nn.Module], list[list[int]]]:
    """The network as a list of consecutive units, and its natural six-block grouping of them."""
    if arch == "mobilenet_v2":
        f = net.features
        head = nn.Sequential(f[18], nn.AdaptiveAvgPool2d(1), nn.Flatten(), net.classifier)
        units = [f[i] for i in range(18)] + [head]
        return units, [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9, 10], [11, 12, 13], [14, 15, 16], [17, 18]]
    stem = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool)
    head = nn.Sequential(net.avgpool, nn.Flatten(), net.fc)
    units = [stem, net.layer1[0], net.layer1[1], net.layer2[0], net.layer2[1], net.layer3[0], net.layer3[1],
             net.layer4[0], net.layer4[1], head]
    return units, [[0, 1], [2], [3, 4], [5, 6], [7], [8, 9]]


def cut_into_blocks(net: nn.Module, arch: str = "mobilenet_v2", num_blocks: int = 6) -> list[nn.Module]:
    """``num_blocks`` consecutive blocks whose composition is ``net``'s forward.

    Up to six blocks merge the natural stages evenly; more split the units (inverted residuals,
    basic blocks) evenly.
    """
    units, natural = _units(net, arch)
    if not 1 <= num_blocks <= len(units):
        raise ValueError(f"{arch} cuts into 1..{len(units)} blocks, not {num_blocks}.")
    if num_blocks <= len(natural):
        groups = [sum(natural[a:b], []) for a, b in (row_range(len(natural), num_blocks, k) for k in range(num_blocks))]
    else:
        groups = [list(range(*row_range(len(units), num_blocks, k))) for k in range(num_blocks)]
    return [nn.Sequential(*[units[i] for i in g]) for g in groups]
