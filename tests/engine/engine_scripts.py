"""Scripts the engine tests migrate (a module of its own: test modules import it by name)."""

TRAIN = b'''import torch

torch.manual_seed(0)
device = torch.device("cuda")
model = torch.nn.Linear(4, 4).cuda()
'''
