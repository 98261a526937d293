# fleetrun: `make demo` runs the example job on a local 3-node fleet; `make test` runs the suite.
# Both do their own setup (system packages when missing, the virtualenv, the local fleet image).

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.fleetrun-installed

.PHONY: demo test docs docs-pictures setup system-deps horovod lint typecheck pytest bench bench-scale bench-256 bench-uplink bench-exec bench-peers bench-gpu clean clean-image

demo: setup
	$(BIN)/fab demo

test: setup lint typecheck horovod pytest

setup: system-deps $(STAMP)

# openssh-server, rsync and iproute2 for the local fleet (nodes are namespaces running real sshd);
# pdsh only as bench/scale.py's baseline (its smoke test runs in `make test`); shellcheck for the
# lint test of images/ scripts (tests/infra/test_bootstrap.py), which a machine without it skips;
# dash, the /bin/sh of Debian-based images, to run an exported pod's command as a pod runs it.
# docker-registry (Debian's build of distribution 2.8): the image registry the container tests
# start on the local fleet's network (tests/registrykit.py); its own service is not used.
# slurm-wlm (slurmctld, slurmd, the client commands) and munge for `fab local.up --with-slurm`, the real
# Slurm cluster that tests/test_slurm_*.py run fleetrun's slurm fleet kind against.
# podman (with uidmap for rootless use, crun, slirp4netns, fuse-overlayfs): the container runtime the
# image pull and container tests run for real (tests/test_image_pull_script.py, test_doctor_container.py).
system-deps:
	@missing=""; \
	[ -x /usr/sbin/sshd ] || missing="$$missing openssh-server"; \
	command -v ssh >/dev/null || missing="$$missing openssh-client"; \
	command -v rsync >/dev/null || missing="$$missing rsync"; \
	command -v ip >/dev/null || missing="$$missing iproute2"; \
	command -v pgrep >/dev/null || missing="$$missing procps"; \
	command -v pdsh >/dev/null || missing="$$missing pdsh"; \
	command -v shellcheck >/dev/null || missing="$$missing shellcheck"; \
	command -v dash >/dev/null || missing="$$missing dash"; \
	command -v docker-registry >/dev/null || missing="$$missing docker-registry"; \
	command -v podman >/dev/null || missing="$$missing podman uidmap crun slirp4netns fuse-overlayfs"; \
	command -v slurmctld >/dev/null || [ -x /usr/sbin/slurmctld ] || missing="$$missing slurm-wlm"; \
	command -v munged >/dev/null || [ -x /usr/sbin/munged ] || missing="$$missing munge"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# Editable install: fleetrun's packages (launch, infra, fleetrun_contract, and images/ as
# fleetrun_images; see setup.py) are found in the checkout, so Pulumi's run of infra/ and the
# tests import the same code. Reinstalled when the packaging changes.
$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev,aws,gcp]'
	touch $(STAMP)

# Horovod 0.28.1 (torch + Gloo) in the local fleet's image, for `launcher: horovod` and its tests.
# Built once from the sdist (about 3.5 min on 2 cores) and cached as a wheel in /opt/fleetrun/wheels,
# so later runs and `make clean-image` rebuilds install it in seconds. Needs root (like the fleet).
horovod: setup
	@if [ "$$(id -u)" != 0 ]; then echo "horovod: not root; skipped (the local fleet needs root)"; exit 0; fi; \
	if ! command -v g++ >/dev/null || ! command -v make >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends g++ make; \
	fi; \
	$(BIN)/python -c 'from launch.fleets.local import ensure_image; ensure_image()' && \
	sh images/horovod/install.sh "$$($(BIN)/python -c 'from launch.fleets.local import image_python; print(image_python())')"

# The docs site (MkDocs, strict): the reference pages and JSON Schemas regenerated from the code
# first. tests/test_docs.py checks in `make test` that they are current and that the site builds.
docs: setup
	$(BIN)/python docs/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The docs' pictures from real runs on a local fleet (as root): fab doctor healthy and with a
# fault, fab train's live table and report, the loss plot (docs/pictures.py).
docs-pictures: setup
	$(BIN)/python docs/pictures.py

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# One mypy run over launch and the Pulumi programs (with the SDK types); tests/infra has the same
# check as a `typecheck`-marked test for running alone, deselected here so it does not run twice.
typecheck:
	$(BIN)/mypy launch fabfile.py infra fleetrun_contract

# Includes tests/test_install.py (marker `install`): the wheel built and installed outside the checkout.
# Two workers, whole files each (--dist loadfile): fleet tests mostly wait on nodes, so two run
# side by side on this 2-core machine kind; tests/conftest.py gives each worker its own fleets.
# --durations=40: the slowest tests named in every run, to keep the suite inside its time budget.
pytest:
	$(BIN)/pytest -m "not typecheck" -n 2 --dist loadfile --no-loadscope-reorder --durations=40

bench: setup
	$(BIN)/python bench/fault_latency.py
	$(BIN)/python bench/horovod_vs_torchrun.py
	$(BIN)/python bench/pulumi_eval.py
	$(BIN)/python bench/scale.py
	$(BIN)/python bench/exec_profile.py
	$(BIN)/python bench/sync_uplink.py
	$(BIN)/python bench/doctor.py
	$(BIN)/python bench/recovery.py
	$(BIN)/python bench/preempt_notice.py
	$(BIN)/python bench/peers.py
	$(BIN)/python bench/gpu_health.py
	$(BIN)/python bench/recovery_faults.py
	$(BIN)/python bench/warm_rerun.py

# GPU health on real local fleets with the nvidia-smi stand-in (doctor at 64 and 256 nodes, the
# collective on 16, gpu_fault, straggler, spare); one row: ARGS="--only fault --trials 3".
bench-gpu: setup
	$(BIN)/python bench/gpu_health.py $(ARGS)

# 4, 16, 32, 64 and 256 nodes (256: first sync once per tool, a 1,000-file tree); sizes: ARGS="--sizes 4 16".
bench-scale: setup
	$(BIN)/python bench/scale.py $(ARGS)

# The 256-node row alone (fan-out, unchanged re-sync, poll round; the fleet takes about a minute to come up).
bench-256: setup
	$(BIN)/python bench/scale.py --sizes 256 --skip-train --repeat 3 --out bench/results/scale_256.json

# Code sync through a 200 Mbit/s laptop uplink (tc tbf on the fleet's bridge): direct vs through the head.
bench-uplink: setup
	$(BIN)/python bench/sync_uplink.py $(ARGS)

# where `fab exec` spends its time at 4 nodes, next to pdsh (phases and imports).
bench-exec: setup
	$(BIN)/python bench/exec_profile.py

# fleetrun next to Ray's cluster launcher and pdsh-started torchrun (installs Ray 2.60.0 into its own venv).
bench-peers: setup
	$(BIN)/python bench/peers.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build dist *.egg-info

# The local fleet's shared Python image (torch CPU) is kept between fleets, like a machine image.
clean-image:
	rm -rf /opt/fleetrun/image
