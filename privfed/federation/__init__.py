"""Flower apps: how Orchestra's rounds travel between server and clients."""
