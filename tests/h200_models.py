"""The three models of the traces recorded on an H200 (tests/data/h200-profiles), built on the meta device and
counted call by call, so the recorded traces can be joined with what the counter sees for the same calls.

BERT-base and the Llama-2-7B-shaped decoder come from transformers configurations, as on the H200. torchvision does
not import beside this CPU build of torch, so ResNet-50 is written out here with torchvision's layout and module names
(Bottleneck blocks with the stride on the 3x3 convolution, "ResNet v1.5").
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
from torch import nn

PROFILES = Path(__file__).parent / "data" / "h200-profiles"
#: name -> the median of 30 per-call CUDA-event timings taken outside the profiler on the H200, ms.
MEDIANS_MS = {name: entry["p50_ms_events"] for name, entry in json.loads((PROFILES / "medians.json").read_text()).items()}


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # in torchvision's order: the main path, then downsample
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet50(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._layer(64, 3)
        self.layer2 = self._layer(128, 4, stride=2)
        self.layer3 = self._layer(256, 6, stride=2)
        self.layer4 = self._layer(512, 3, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(2048, num_classes)

    def _layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * 4:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * 4, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(planes * 4))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * 4
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def bert_base() -> nn.Module:
    import transformers

    return transformers.BertModel(transformers.BertConfig())


def llama_4_layers() -> nn.Module:
    """Llama-2-7B's shapes with 4 layers, as profiled on the H200."""
    import transformers

    config = transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
                                      num_key_value_heads=32, num_hidden_layers=4, vocab_size=32000)
    return transformers.LlamaModel(config)


#: trace name -> (model builder, input on meta, dtype)
MODELS = {
    "bert-base-bf16-s128-b1": (bert_base, lambda: torch.zeros(1, 128, dtype=torch.long, device="meta"), torch.bfloat16),
    "resnet50-fp16-b1": (ResNet50, lambda: torch.zeros(1, 3, 224, 224, dtype=torch.float16, device="meta"),
                         torch.float16),
    "llama7b-4l-bf16-prefill2048": (llama_4_layers, lambda: torch.zeros(1, 2048, dtype=torch.long, device="meta"),
                                    torch.bfloat16),
}


@functools.cache
def counted_calls(name: str) -> tuple:
    """The counter's calls of one forward of the named model, on meta, in call order."""
    from rpx_plugins.torch.counter import build_on_meta, count_model

    build, make_input, dtype = MODELS[name]
    model = build_on_meta(build).eval().to(dtype)
    with torch.no_grad():
        return count_model(model, (make_input(),), {}, sequence=True).calls
