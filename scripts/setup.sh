#!/usr/bin/env bash
# Set up ablate on a fresh machine: a virtual environment in .venv with PyTorch first, then the package.
#   scripts/setup.sh               the Python side only
#   scripts/setup.sh --with-slurm  also Debian's Slurm + munge + MariaDB, and a single-node cluster on localhost
# ABLATE_TORCH picks the PyTorch requirement (default torch==2.13.0, the CPU wheel this machine has; on a
# GPU node use e.g. ABLATE_TORCH="torch==2.13.0" with the CUDA index your cluster uses).
set -euo pipefail
cd "$(dirname "$0")/.."

# torch.compile on the CPU (`compile: true`, and tests/test_precision_compile.py) builds its kernels with a
# C++ compiler against Python's headers: Debian's g++ (and python3-dev where the Python lacks its headers).
cxx_packages=()
command -v g++ >/dev/null || cxx_packages+=(g++)
headers='import os, sysconfig; raise SystemExit(not os.path.isfile(sysconfig.get_paths()["include"] + "/Python.h"))'
python3 -c "$headers" || cxx_packages+=(python3-dev)
if ((${#cxx_packages[@]})); then
  sudo=(); [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  echo "[setup] installing for torch.compile: ${cxx_packages[*]}"
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${cxx_packages[@]}"
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check "${ABLATE_TORCH:-torch==2.13.0}"
# dev: the test tools and every extra (hf, trackers, tune: pyproject.toml); a user's install may take fewer
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]"
if [ "${1:-}" = "--with-slurm" ]; then
  bash scripts/install-system-deps.sh
  bash scripts/slurm-local.sh start >/dev/null
  echo "Slurm is up: export SLURM_CONF=${ABLATE_SLURM_DIR:-/tmp/ablate-slurm}/etc/slurm.conf"
fi
echo "ablate is installed in .venv ($(.venv/bin/ablate --help >/dev/null && echo ok))"
