"""Algorithms: each module holds one algorithm's loss and update; hyperparameters live in
``hyperparams.py`` (torch-free). Only Ape-X DQN exists so far."""
