"""Running privfed under Flower's deployment runtime (SuperLink + SuperNodes).

The simulation path (``privfed train``) needs nothing from here. A real
federation additionally needs TLS material for the SuperLink and one
authentication key per SuperNode; :mod:`privfed.deployment.certs` makes both.
"""
