"""Pickling namespace values: C speed for data, code by value, loud about what cannot persist."""
