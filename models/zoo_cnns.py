"""The CNN zoo models, plain torch.nn: ResNet-50, GoogLeNet (Inception v1), Inception v3."""
from __future__ import annotations

from zoo_core import CONFIGS, SEED, ZooModel
from zoo_export import calibrate_batchnorm, import_torch, torch_zoo_model


# --------------------------------------------------------------------------------------------
# CNNs: ResNet-50 and GoogLeNet (Inception v1), plain torch.nn
# --------------------------------------------------------------------------------------------


def _cnn_classes():
    """Define the CNN modules (needs torch; called lazily)."""
    nn = import_torch().nn

    class ConvBNReLU(nn.Sequential):
        def __init__(self, cin, cout, k, stride=1, padding=0, relu=True):
            layers = [nn.Conv2d(cin, cout, k, stride=stride, padding=padding, bias=False), nn.BatchNorm2d(cout)]
            if relu:
                layers.append(nn.ReLU(inplace=True))
            super().__init__(*layers)

    class Bottleneck(nn.Module):
        """ResNet v1.5 bottleneck: 1x1 -> 3x3 (stride here) -> 1x1 (x4), projection shortcut when needed."""

        expansion = 4

        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * self.expansion
            self.conv1 = ConvBNReLU(cin, width, 1)
            self.conv2 = ConvBNReLU(width, width, 3, stride=stride, padding=1)
            self.conv3 = ConvBNReLU(width, cout, 1, relu=False)
            self.conv3[1].init_gain = 0.5  # read by _calibrate_batchnorm
            self.downsample = ConvBNReLU(cin, cout, 1, stride=stride, relu=False) if (stride != 1 or cin != cout) else None
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            return self.relu(self.conv3(self.conv2(self.conv1(x))) + identity)

    class ResNet50(nn.Module):
        def __init__(self, base_width=64, num_classes=1000, blocks=(3, 4, 6, 3)):
            super().__init__()
            w = base_width
            self.stem = nn.Sequential(ConvBNReLU(3, w, 7, stride=2, padding=3), nn.MaxPool2d(3, stride=2, padding=1))
            layers, cin = [], w
            for i, n in enumerate(blocks):
                width = w * 2**i
                for j in range(n):
                    layers.append(Bottleneck(cin, width, stride=2 if (j == 0 and i > 0) else 1))
                    cin = width * Bottleneck.expansion
            self.layers = nn.Sequential(*layers)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(cin, num_classes)

        def forward(self, x):
            x = self.pool(self.layers(self.stem(x)))
            return self.fc(x.flatten(1))

    class Inception(nn.Module):
        """Inception v1 block: 4 parallel branches (1x1 | 1x1->3x3 | 1x1->5x5 | maxpool->1x1), concatenated."""

        def __init__(self, cin, c1, c3r, c3, c5r, c5, cp):
            super().__init__()
            self.b1 = ConvBNReLU(cin, c1, 1)
            self.b2 = nn.Sequential(ConvBNReLU(cin, c3r, 1), ConvBNReLU(c3r, c3, 3, padding=1))
            self.b3 = nn.Sequential(ConvBNReLU(cin, c5r, 1), ConvBNReLU(c5r, c5, 5, padding=2))
            self.b4 = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1, ceil_mode=True), ConvBNReLU(cin, cp, 1))
            self.cout = c1 + c3 + c5 + cp

        def forward(self, x):
            return import_torch().cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], dim=1)

    # (name, in, 1x1, 3x3reduce, 3x3, 5x5reduce, 5x5, poolproj) from Szegedy et al. 2014, table 1
    GOOGLENET_BLOCKS = [
        ("3a", 192, 64, 96, 128, 16, 32, 32), ("3b", 256, 128, 128, 192, 32, 96, 64), "pool",
        ("4a", 480, 192, 96, 208, 16, 48, 64), ("4b", 512, 160, 112, 224, 24, 64, 64),
        ("4c", 512, 128, 128, 256, 24, 64, 64), ("4d", 512, 112, 144, 288, 32, 64, 64),
        ("4e", 528, 256, 160, 320, 32, 128, 128), "pool",
        ("5a", 832, 256, 160, 320, 32, 128, 128), ("5b", 832, 384, 192, 384, 48, 128, 128),
    ]

    class GoogLeNet(nn.Module):
        """Inception v1 (no auxiliary classifiers; BatchNorm after every conv, as torchvision, no LRN)."""

        def __init__(self, div=1, num_classes=1000):
            super().__init__()

            def c(n):
                return max(2, n // div)

            self.stem = nn.Sequential(
                ConvBNReLU(3, c(64), 7, stride=2, padding=3), nn.MaxPool2d(3, stride=2, ceil_mode=True),
                ConvBNReLU(c(64), c(64), 1), ConvBNReLU(c(64), c(192), 3, padding=1),
                nn.MaxPool2d(3, stride=2, ceil_mode=True),
            )
            blocks, cin, pools = [], c(192), 0
            for blk_spec in GOOGLENET_BLOCKS:
                if blk_spec == "pool":
                    pools += 1
                    # 3x3/2 after 3b, 2x2/2 after 4e (torchvision's choice; the paper's 3x3/2 also fits)
                    blocks.append(nn.MaxPool2d(3 if pools == 1 else 2, stride=2, ceil_mode=True))
                    continue
                _, _, *widths = blk_spec
                blk = Inception(cin, *[c(w) for w in widths])
                blocks.append(blk)
                cin = blk.cout
            self.blocks = nn.Sequential(*blocks)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.dropout = nn.Dropout(0.4)
            self.fc = nn.Linear(cin, num_classes)
            for m in self.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.init_bias_mean = 0.5  # read by _calibrate_batchnorm (fp16 conditioning, see there)

        def forward(self, x):
            x = self.pool(self.blocks(self.stem(x)))
            return self.fc(self.dropout(x.flatten(1)))

    class InceptionV3(nn.Module):
        """Inception v3 as torchvision builds it (no auxiliary classifier, no input transform): a
        stem, then Mixed_5b..7c: blocks of 4 parallel branches (factorised 1x7/7x1 and 1x3/3x1
        convolutions, average- and max-pool branches), concatenated. Widths divided by `div`."""

        def __init__(self, div=1, num_classes=1000):
            super().__init__()
            F = import_torch().nn.functional

            def c(n):
                return max(2, n // div)

            def conv(cin, cout, k, **kw):
                block = ConvBNReLU(cin, c(cout), k, **kw)
                block[1].eps = 1e-3   # torchvision's BasicConv2d
                block[1].init_bias_mean = 0.5
                return block

            def seq(cin, *specs):   # a chain of convs: (cout, kernel, kwargs) each
                layers = []
                for cout, k, kw in specs:
                    layers.append(conv(cin, cout, k, **kw))
                    cin = c(cout)
                return nn.Sequential(*layers)

            def avg_pool(x):
                return F.avg_pool2d(x, 3, stride=1, padding=1)

            def max_pool(x):
                return F.max_pool2d(x, 3, stride=2)

            class Block(nn.Module):
                """Branches and a pool branch, concatenated; forks[i]: convs branch i ends in, side
                by side (Mixed_7b/7c split a branch into a 1x3 and a 3x1)."""

                def __init__(self, branches, pool, pool_conv=None, forks=()):
                    super().__init__()
                    self.branches, self.pool, self.pool_conv = nn.ModuleList(branches), pool, pool_conv
                    self.forks = nn.ModuleList(nn.ModuleList(f) for f in forks)

                def forward(self, x):
                    outs = []
                    for i, b in enumerate(self.branches):
                        y = b(x)
                        ends = self.forks[i] if i < len(self.forks) else []
                        outs += [f(y) for f in ends] if len(ends) else [y]
                    p = self.pool(x)
                    outs.append(self.pool_conv(p) if self.pool_conv is not None else p)
                    return import_torch().cat(outs, 1)

            P1, P2 = dict(padding=1), dict(padding=2)
            r17, r71 = dict(padding=(0, 3)), dict(padding=(3, 0))
            r13, r31 = dict(padding=(0, 1)), dict(padding=(1, 0))

            def block_a(cin, pool_features):
                return Block([seq(cin, (64, 1, {})), seq(cin, (48, 1, {}), (64, 5, P2)),
                              seq(cin, (64, 1, {}), (96, 3, P1), (96, 3, P1))], avg_pool, conv(cin, pool_features, 1)), \
                    c(64) + c(64) + c(96) + c(pool_features)

            def block_b(cin):
                return Block([seq(cin, (384, 3, dict(stride=2))),
                              seq(cin, (64, 1, {}), (96, 3, P1), (96, 3, dict(stride=2)))], max_pool), c(384) + c(96) + cin

            def block_c(cin, c7):
                return Block([seq(cin, (192, 1, {})), seq(cin, (c7, 1, {}), (c7, (1, 7), r17), (192, (7, 1), r71)),
                              seq(cin, (c7, 1, {}), (c7, (7, 1), r71), (c7, (1, 7), r17), (c7, (7, 1), r71),
                                  (192, (1, 7), r17))], avg_pool, conv(cin, 192, 1)), 4 * c(192)

            def block_d(cin):
                return Block([seq(cin, (192, 1, {}), (320, 3, dict(stride=2))),
                              seq(cin, (192, 1, {}), (192, (1, 7), r17), (192, (7, 1), r71), (192, 3, dict(stride=2)))],
                             max_pool), c(320) + c(192) + cin

            def block_e(cin):
                forks = [[], *([conv(c(384), 384, (1, 3), **r13), conv(c(384), 384, (3, 1), **r31)] for _ in range(2))]
                return Block([seq(cin, (320, 1, {})), seq(cin, (384, 1, {})), seq(cin, (448, 1, {}), (384, 3, P1))],
                             avg_pool, conv(cin, 192, 1), forks), c(320) + 4 * c(384) + c(192)

            self.stem = nn.Sequential(seq(3, (32, 3, dict(stride=2)), (32, 3, {}), (64, 3, P1)), nn.MaxPool2d(3, stride=2),
                                      seq(c(64), (80, 1, {}), (192, 3, {})), nn.MaxPool2d(3, stride=2))
            blocks, cin = [], c(192)
            for make, args in [(block_a, (32,)), (block_a, (64,)), (block_a, (64,)), (block_b, ()),
                               (block_c, (128,)), (block_c, (160,)), (block_c, (160,)), (block_c, (192,)),
                               (block_d, ()), (block_e, ()), (block_e, ())]:
                blk, cin = make(cin, *args)
                blocks.append(blk)
            self.blocks = nn.Sequential(*blocks)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.dropout = nn.Dropout(0.5)
            self.fc = nn.Linear(cin, num_classes)

        def forward(self, x):
            x = self.pool(self.blocks(self.stem(x)))
            return self.fc(self.dropout(x.flatten(1)))

    return ResNet50, GoogLeNet, InceptionV3


def _cnn_zoo_model(name: str, size: str, seed: int, build) -> ZooModel:
    """build(cfg) -> the network, made after seeding torch; BatchNorm calibrated on a random batch."""
    torch = import_torch()
    cfg = CONFIGS[name][size]
    torch.manual_seed(seed)
    net = build(cfg)
    calibrate_batchnorm(net, (8, 3, cfg["image_size"], cfg["image_size"]), seed)
    return torch_zoo_model(name, size, seed, net)


def resnet50(size: str = "tiny", seed: int = SEED) -> ZooModel:
    """ResNet-50 (v1.5: bottleneck blocks [3, 4, 6, 3], stride in the 3x3): input -> logits."""
    ResNet50, _, _ = _cnn_classes()
    return _cnn_zoo_model("resnet50", size, seed,
                          lambda cfg: ResNet50(base_width=cfg["base_width"], num_classes=cfg["num_classes"]))


def googlenet(size: str = "tiny", seed: int = SEED) -> ZooModel:
    """GoogLeNet / Inception v1 (9 inception blocks of 4 concatenated branches): input -> logits."""
    _, GoogLeNet, _ = _cnn_classes()
    return _cnn_zoo_model("googlenet", size, seed,
                          lambda cfg: GoogLeNet(div=cfg["width_div"], num_classes=cfg["num_classes"]))


def inception_v3(size: str = "tiny", seed: int = SEED) -> ZooModel:
    """Inception v3 (torchvision's layout: 11 blocks of parallel branches, Opara's headline model):
    input -> logits."""
    _, _, InceptionV3 = _cnn_classes()
    return _cnn_zoo_model("inception_v3", size, seed,
                          lambda cfg: InceptionV3(div=cfg["width_div"], num_classes=cfg["num_classes"]))
