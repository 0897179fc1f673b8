"""Running privfed under Flower's deployment runtime (SuperLink + SuperNodes), which ``privfed train`` does not need.

A real federation needs TLS material for the SuperLink and one authentication
key per SuperNode: :mod:`privfed.deployment.certs` makes both.
"""
