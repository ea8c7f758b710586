#!/usr/bin/env bash
# Set up ablate on a fresh machine: a virtual environment in .venv with PyTorch first, then the package.
#   scripts/setup.sh               the Python side only
#   scripts/setup.sh --with-slurm  also Debian's Slurm + munge + MariaDB, and a single-node cluster on localhost
# ABLATE_TORCH picks the PyTorch requirement (default torch==2.13.0, the CPU wheel this machine has; on a
# GPU node use e.g. ABLATE_TORCH="torch==2.13.0" with the CUDA index your cluster uses).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check "${ABLATE_TORCH:-torch==2.13.0}"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev,mysql]"
if [ "${1:-}" = "--with-slurm" ]; then
  bash scripts/install-system-deps.sh
  bash scripts/slurm-local.sh start >/dev/null
  echo "Slurm is up: export SLURM_CONF=${ABLATE_SLURM_DIR:-/tmp/ablate-slurm}/etc/slurm.conf"
fi
echo "ablate is installed in .venv ($(.venv/bin/ablate --help >/dev/null && echo ok))"
