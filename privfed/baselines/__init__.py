"""The paper's federated SSL baselines' losses (f-SimCLR, f-SimSiam, f-BYOL, f-SpecLoss).

Their local training is :mod:`privfed.orchestra.baseline_training`, beside
Orchestra's own.
"""
