"""The learner's parts; the loop that strings them together is ``apexrl.learner.main``."""
