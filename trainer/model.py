"""The model: a two-layer MLP, small enough to train on CPU in seconds."""

from torch import nn


class MLP(nn.Module):
    def __init__(self, features, hidden, classes):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x):
        return self.net(x)  # logits, [batch, classes]
