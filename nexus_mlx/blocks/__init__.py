"""Compiled tool blocks and splicing them into a live cache; the ``.atb`` file format is
:mod:`.atb`."""
