#!/usr/bin/env bash
# Install the Debian/Ubuntu packages that scripts/slurm-local.sh needs:
# Slurm (slurmctld, slurmd, clients), munge, slurmdbd and MariaDB (Slurm accounting, and Optuna's database
# for parallel tunes); and Chromium, the headless browser the
# tests open `ablate report --html` pages in.
# Idempotent: returns at once when everything is already installed.
# Runs as root (CI) or through sudo.  Daemons are NOT started here.
set -euo pipefail

PACKAGES=(slurm-wlm munge slurmdbd mariadb-server chromium)

installed() {
    [[ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" == installed ]]
}

missing=()
for pkg in "${PACKAGES[@]}"; do
    installed "$pkg" || missing+=("$pkg")
done
if ((${#missing[@]} == 0)); then
    echo "[install-system-deps] already installed: ${PACKAGES[*]}"
    exit 0
fi

SUDO=()
if [[ "$(id -u)" -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "[install-system-deps] ERROR: need root or sudo" >&2; exit 1; }
    SUDO=(sudo)
fi

# Keep package maintainer scripts from starting services (e.g. a system
# MariaDB on port 3306, or munged/slurmd under init scripts): slurm-local.sh
# starts its own daemons.  Only if no policy is in place already.
policy=/usr/sbin/policy-rc.d
added_policy=0
if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$policy" >/dev/null
    "${SUDO[@]}" chmod 0755 "$policy"
    added_policy=1
fi
cleanup() { if ((added_policy)); then "${SUDO[@]}" rm -f "$policy"; fi; }
trap cleanup EXIT

echo "[install-system-deps] installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -q
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "[install-system-deps] done"
