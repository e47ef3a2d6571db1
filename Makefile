# The two commands a newcomer needs (see README.md).
.PHONY: reproduce test setup

setup:
	bash scripts/setup.sh

reproduce: setup
	.venv/bin/lens-position reproduce --out results

test: setup
	.venv/bin/python -m pytest
