"""apexrl: a distributed actor-learner reinforcement-learning system over ZeroMQ."""

__version__ = "0.1.0"
