# Two set-up commands: `make demo` and `make test`. Each creates .venv and installs what it needs
# on first use (MindSpore 2.10 CPU wheel, ~0.8 GB download), then runs. constraints.txt holds every installed
# version (what the suite's behaviour depends on): it changes on purpose, with the suite run against it.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mindfoundry-installed

.PHONY: install demo demo-images demo-mm test test-fast bench clean-runs

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[mindspore,torch,demo,dev,eval,ray,s3,zh]"
	@# optional: where mindstudio-probe cannot install, its interop tests skip and say so
	$(PY) -m pip install -q -c constraints.txt -e ".[mindspore,torch,probe]" || echo "mindstudio-probe did not install: tests/debug/test_msprobe_interop.py will skip"
	@# MindFormers, the judge of `export --format mindformers`: 1.9.0 without its pins (its transformers==4.57.1 would replace
	@# the transformers the HF-export tests use; 2.0.0, which declares mindspore~=2.10, imports hyper-parallel, not on PyPI)
	$(PY) -m pip install -q -c constraints.txt --no-deps mindformers==1.9.0 deprecated wrapt setproctitle ftfy jieba sentencepiece mindpet==1.0.4 \
		tensorboardX rouge-chinese tiktoken || echo "mindformers did not install: tests/checkpoint/test_mindformers_export.py will skip"
	@# the image demo corpus (emoji from Debian packages, digits from scikit-learn), so configs/demo-mae.yaml and
	@# demo-caption.yaml run after install; where apt-get cannot fetch, `make demo-images` says what it needs
	$(VENV)/bin/mindfoundry data demo-images || echo "the image demo corpus was not written: run make demo-images"
	@touch $(STAMP)

install: $(STAMP)

# The main job: prepare -> train -> evaluate -> sample on the embedded real-text corpus.
# --resume auto makes a second `make demo` continue (or just re-evaluate) the same run.
demo: $(STAMP)
	$(VENV)/bin/mindfoundry run configs/demo.yaml --resume auto

# The image demo corpus (Noto Color Emoji with their Unicode CLDR names, from Debian packages fetched once with
# apt-get download) curated into WebDataset tars, pixel shards and caption token ids.
demo-images: $(STAMP)
	$(VENV)/bin/mindfoundry data demo-images
	$(VENV)/bin/mindfoundry prepare configs/demo-images.yaml
	$(VENV)/bin/mindfoundry data inspect configs/demo-images.yaml

# The multimodal demos on that corpus (and the handwritten digits the linear probe may fit on): masked image modelling
# (configs/demo-mae.yaml, with the digits probe) then image-conditioned captioning (configs/demo-caption.yaml).
demo-mm: $(STAMP)
	$(VENV)/bin/mindfoundry data demo-images
	$(VENV)/bin/mindfoundry run configs/demo-mae.yaml --resume auto
	$(VENV)/bin/mindfoundry run configs/demo-caption.yaml --resume auto

# Two workers (pytest-xdist) on this project's 2-core machine: most test time is single-threaded (graph compiles,
# process start-up, waiting on launched ranks), so the suite takes ~0.6 of its serial time. --maxschedchunk 1 hands out
# tests one at a time (xdist's default sends each worker a run of consecutive tests, which put every slow test on one
# worker); tests/conftest.py puts the slow ones first. TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --maxschedchunk 1

test-fast: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --maxschedchunk 1 -m "not slow"

bench: $(STAMP)
	$(PY) bench/train_throughput.py
