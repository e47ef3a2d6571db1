"""Measurements on the controlled zoo's checkpoints: the sink rate stored beside each
checkpoint (``measure``) and the sweep that finds the budget at which sinks form (``sweep``)."""
