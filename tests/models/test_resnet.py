"""specs/resnet.yaml against a torch ResNet-18 (torchvision's layout, written out here
so torchvision is not needed) with random weights and BatchNorm running statistics,
at 16 base channels (the spec's ``tiny`` variant): logits for 3x64x64 images."""

import numpy as np
import pytest

import maxdecl as md

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
nn = torch.nn

SPEC = "specs/resnet.yaml"


class BasicBlock(nn.Module):
    def __init__(self, cin, c, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, c, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.downsample = None
        if stride != 1 or cin != c:
            self.downsample = nn.Sequential(nn.Conv2d(cin, c, 1, stride, bias=False),
                                            nn.BatchNorm2d(c))

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        s = x if self.downsample is None else self.downsample(x)
        return self.relu(y + s)


class ResNet18(nn.Module):
    def __init__(self, base=16, n_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, base, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(base)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        chans = [base, base * 2, base * 4, base * 8]
        cin = base
        for s, c in enumerate(chans):
            stride = 1 if s == 0 else 2
            setattr(self, f"layer{s + 1}",
                    nn.Sequential(BasicBlock(cin, c, stride), BasicBlock(c, c, 1)))
            cin = c
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, n_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def make_model():
    torch.manual_seed(0)
    model = ResNet18(16, 10)
    with torch.no_grad():                 # non-trivial BatchNorm statistics and affines
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.2)
                m.running_mean.normal_(0.0, 0.2)
                m.running_var.uniform_(0.5, 2.0)
    return model.eval()


def rel_err(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("batch,layout", [(1, "folder"), (2, "file")])
def test_resnet18_logits_match_torch(tmp_path, batch, layout):
    model = make_model()
    x = np.random.default_rng(1).standard_normal((batch, 3, 64, 64)).astype(np.float32)
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    if layout == "folder":            # a Hugging Face style folder: read as format hf
        safetensors_torch.save_file(model.state_dict(), str(tmp_path / "model.safetensors"))
        (tmp_path / "config.json").write_text("{}")
        weights = str(tmp_path)
    else:                             # a bare .safetensors file is format "safetensors", which
        path = tmp_path / "resnet.safetensors"     # formats.hf does not map: say it is hf
        safetensors_torch.save_file(model.state_dict(), str(path))
        weights = md.load_weights(str(path))
        weights.metadata["maxdecl.format"] = "hf"
    m = md.load_model(SPEC, weights, variant="tiny")
    (logits,) = m(x)
    assert logits.shape == (batch, 10)
    err = rel_err(logits, ref)
    print(f"resnet18 vs torch ({layout}, batch {batch}): {err:.2e}")
    assert err < 1e-4
