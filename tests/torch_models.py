"""A small PyTorch model for the tests, referenced as tests.torch_models:make_net."""

import torch


class SmallNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        features = torch.relu(self.conv(image)).mean(dim=(2, 3))
        return self.fc(features)


def make_net() -> torch.nn.Module:
    return SmallNet()
