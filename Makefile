# The two commands a newcomer needs (see README.md).
.PHONY: reproduce test setup setup-tl4 test-tl3 test-tl4

setup:
	bash scripts/setup.sh

setup-tl4:
	bash scripts/setup.sh --tl4

reproduce: setup
	.venv/bin/lens-position reproduce --out results

# Both locked environments: the full suite on TransformerLens 3.9 (in a network namespace that counts
# every packet off the loopback: there must be none), then on 4.3 the tests marked
# tl4, every analysis sub-command on two tiny models and the quick reproduction (scripts/test-tl4.sh).
# Either failing fails the target.
test: test-tl3 test-tl4

test-tl3: setup
	bash scripts/test-tl3.sh

test-tl4: setup-tl4
	bash scripts/test-tl4.sh
