"""SecAgg+ for privfed's rounds, in two layers.

The Flower-free core (``masks``, ``mask_pool``, ``quantization``,
``encoding``, ``settings``) is what privacy accounting and the run's plan
use. On top, over Flower: ``masking`` (both ends' mask arithmetic),
``client_encoding`` and ``client_mod`` (a client's side), ``workflow`` (the
server's). ``tests/test_layering.py`` holds the split.
"""
