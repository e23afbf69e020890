# Two entry points: `make demo` (install, then the main job) and `make test` (install, then tests).
PYTHON ?= python3

.PHONY: install install-test demo test

install:
	$(PYTHON) -m pip install -q -e ".[cpu]"

# keras-hub is installed without its dependencies: they would pull the full `tensorflow` wheel
# over `tensorflow-cpu`. Its few pure-Python needs are listed by hand.
install-test: install
	$(PYTHON) -m pip install -q -e ".[cpu,test]"
	$(PYTHON) -m pip install -q --no-deps "keras-hub==0.32.0"
	$(PYTHON) -m pip install -q regex tokenizers kagglehub

demo: install
	$(PYTHON) -m tofu_tf.train

test: install-test
	$(PYTHON) -m pytest -q -n 2 tests
