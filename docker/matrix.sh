#!/usr/bin/env bash
# The toolchain matrix: Horovod built by `toolkit build-horovod` and a 2-rank training, in buildah
# containers made from debootstrap bases (docker/build.sh base), one row per toolchain:
#
#   debian12  bookworm  GCC 12, CMake 3.25 (apt), Python 3.11
#   debian13  trixie    GCC 14, CMake >= 4 (pip), Python 3.13
#
#   docker/matrix.sh [ROW...]        (default: every row; `make matrix`)
#
# Each row prints a line `| row | toolchain | workarounds | framework | built (s) | trained |`; the
# table and its date are in docs/TOOLCHAINS.md. torch only: its PyPI wheel exists for every Python
# here (TensorFlow 2.21 and MXNet 1.9.1 need numpy < 2, which has no wheel for Python 3.13).
# Nothing about this machine is written here: pip's configuration (indexes, find-links, CA,
# constraints) is read at run time and its local folders mounted read-only.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
PYTHON=${PYTHON:-python3}
say() { printf 'matrix.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

declare -A SUITE=([debian12]=bookworm [debian13]=trixie)
# Debian packages of each row; CMAKE_PIP: CMake from pip instead (Debian 13's apt has 3.31).
declare -A CMAKE_APT=([debian12]=cmake [debian13]="")
declare -A CMAKE_PIP=([debian12]="" [debian13]="cmake>=4,<5")
APT="python3 python3-venv python3-dev g++ make openmpi-bin libopenmpi-dev openssh-client ca-certificates"

command -v buildah >/dev/null 2>&1 || die "buildah is missing (apt-get install buildah debootstrap)"

# pip's own configuration, passed through: PIP_* variables, the config files, and every local path
# they name (find-links folders, file:// indexes with the folder beside them, the CA, constraints).
pip_mounts() {
  local v
  {
    for v in /etc/xdg/pip /etc/pip.conf "$HOME/.config/pip" "$HOME/.pip"; do echo "$v"; done
    "$PYTHON" -m pip config list 2>/dev/null | sed -E "s/^[^=]+='?//; s/'$//" | tr ' ' '\n'
  } | while read -r v; do
    v=${v#file://}
    case $v in /*) ;; *) continue ;; esac
    [ -e "$v" ] || continue
    [ -d "$v" ] && [ "$(basename "$v")" = simple ] && v=$(dirname "$v")
    echo "$v"
  done | sort -u | awk 'prev == "" || index($0, prev "/") != 1 { print; prev = $0 }' \
    | while read -r v; do printf -- '-v\n%s:%s:ro\n' "$v" "$v"; done
}

pip_env() {
  env | grep '^PIP_' | sed 's/^/--env\n/' || true
}

run_row() {
  local row=$1 suite=${SUITE[$1]:-} base ctr start built trained toolchain workarounds log
  [ -n "$suite" ] || die "unknown row '$row': ${!SUITE[*]}"
  base=localhost/toolkit-base:$suite
  buildah inspect --type image "$base" >/dev/null 2>&1 || SUITE=$suite "$HERE/build.sh" base
  log=$(mktemp "/var/tmp/toolkit-matrix-$row.XXXXXX.log")
  say "$row: log $log"
  ctr=$(buildah from --pull=never "$base")
  # shellcheck disable=SC2064  # expand now: the container's name is fixed
  trap "buildah rm '$ctr' >/dev/null 2>&1 || true" RETURN
  local -a mounts envs
  mapfile -t mounts < <(pip_mounts)
  mapfile -t envs < <(pip_env)
  # Horovod's build log and wheel stay on the host, one cache per row (TOOLKIT_CACHE_DIR).
  local cache=/var/tmp/toolkit-matrix-cache/$row
  mkdir -p "$HOME/.cache/pip" "$cache"
  # pip's files are mounted for the pip and build steps only (apt must be free to write the CA bundle).
  in_ctr() {
    local -a m=("${mounts[@]}")
    [ "${2:-}" = apt ] && m=()
    buildah run --isolation chroot --uts host "${m[@]}" "${envs[@]}" \
      -v "$HOME/.cache/pip:/root/.cache/pip" -v "$cache:/root/.cache/toolkit" --env OMPI_ALLOW_RUN_AS_ROOT=1 \
      --env OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 --env OMPI_MCA_btl_vader_single_copy_mechanism=none \
      --env PYTHONUNBUFFERED=1 "$ctr" -- bash -c "$1" >>"$log" 2>&1
  }
  (cd "$ROOT" && git archive --format=tar HEAD) | buildah run --isolation chroot "$ctr" -- \
    bash -c 'mkdir -p /opt/toolkit && tar -x -C /opt/toolkit'
  say "$row: apt-get install (${APT// /, })"
  in_ctr "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
          $APT ${CMAKE_APT[$row]}" apt || die "$row: apt failed, see $log"
  say "$row: venv, torch and the toolkit's own needs"
  local torch
  torch=$(sed -n 's/^ *"torch": "\([^"]*\)".*/\1/p' "$ROOT/toolkit/install/pins.py")
  in_ctr "python3 -m venv /opt/venv && /opt/venv/bin/pip install -q torch==$torch numpy pyyaml scikit-learn setuptools \
          psutil cloudpickle packaging tqdm ${CMAKE_PIP[$row]:+\"${CMAKE_PIP[$row]}\"} \
          && /opt/venv/bin/pip install -q --no-deps --no-build-isolation -e /opt/toolkit" \
    || die "$row: pip failed, see $log"
  say "$row: toolkit build-horovod --frameworks torch (cffi is not installed: the build must install it)"
  start=$SECONDS
  if in_ctr "export PATH=/opt/venv/bin:\$PATH && cd /opt/toolkit && toolkit build-horovod --frameworks torch"; then
    built="yes, $((SECONDS - start)) s"
  else
    built="no (see $log)"
  fi
  toolchain=$(sed -n 's/^horovod: toolchain \([^;]*\);.*/\1/p' "$log" | tail -1)
  workarounds=$(sed -n 's/^horovod: toolchain [^;]*; workarounds: //p' "$log" | tail -1)
  trained="-"
  if [ "${built%%,*}" = yes ]; then
    say "$row: 2 ranks, Gloo, digits, 3 epochs"
    start=$SECONDS
    if in_ctr "export PATH=/opt/venv/bin:\$PATH && cd /opt/toolkit && toolkit launch -np 2 --gloo --timeout 600 -- \
               python examples/train.py --framework torch --dataset digits --epochs 3 --quiet"; then
      trained="yes, accuracy $(grep -o '"accuracy": [0-9.]*' "$log" | tail -1 | cut -d' ' -f2 | cut -c1-5), \
$((SECONDS - start)) s"
    else
      trained="no (see $log)"
    fi
  fi
  printf '| %s | %s | %s | torch | %s | %s |\n' "$row ($suite)" "${toolchain:-?}" "${workarounds:-?}" "$built" "$trained"
}

rows=("$@")
[ ${#rows[@]} -gt 0 ] || rows=(debian12 debian13)
printf '| toolchain | detected | workarounds applied | framework | built | trained (2 ranks) |\n|---|---|---|---|---|---|\n'
for row in "${rows[@]}"; do
  run_row "$row"
done
