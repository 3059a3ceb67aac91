"""Deterministic replay: canonical state digests (digest.py); the replay driver lands next."""
