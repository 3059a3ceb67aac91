"""The Jupyter adapter: the Kernos kernel, its magics and its kernelspec.

Importing this package imports ipykernel; the core (``kernos``) does not.
"""
