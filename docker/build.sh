#!/usr/bin/env bash
# Build the toolkit images, with docker when its daemon answers, else with buildah.
#
#   docker/build.sh cpu [BUILD-OPTIONS...]        -> localhost/toolkit:cpu  (docker/Dockerfile.cpu)
#   docker/build.sh gpu [BUILD-OPTIONS...]        -> localhost/toolkit:gpu  (docker/Dockerfile)
#   docker/build.sh base                          -> the local Debian base (buildah only, debootstrap)
#   docker/build.sh run cpu|gpu [-- ] CMD [ARGS...] -> CMD in a throwaway container of the image
#
# BUILD-OPTIONS go to `docker build` / `buildah bud` as they are, e.g. --build-arg FRAMEWORKS=torch.
# Nothing about this machine is written in the repository: the Debian mirror, pip's CA bundle, its
# index URLs and find-links are read here, at run time, from apt's sources and `pip config list`.
#
# Environment: BASE_IMAGE (a base to build on; default: the Dockerfile's, or with buildah the
# local debootstrap base), IMAGE (the tag to build), DEBIAN_MIRROR (else from apt's sources),
# TORCH_INDEX_URL (else the Dockerfile's default, or pip's own configuration when that index is
# unreachable), CONTEXT (the build context; default the repository's working tree), WHEELHOUSE (a
# folder `toolkit build-horovod --export DIR` wrote: Horovod is installed from it, nothing compiled,
# no compiler in the image, the host's Horovod cache not mounted),
# ENGINE=docker|buildah (default: docker when `docker info` answers, a CLI alone is not enough).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# The build context: the working tree by default; CONTEXT=DIR builds another copy (e.g. `git archive`).
CONTEXT=${CONTEXT:-$ROOT}
# The Debian release of the local base (debootstrap): bookworm (12) by default, e.g. SUITE=trixie (13).
SUITE=${SUITE:-bookworm}
LOCAL_BASE=${LOCAL_BASE:-localhost/toolkit-base:$SUITE}
# Where the host's caches and CA appear inside a buildah build (bind mounts, never in a layer).
HOST_CACHE=/run/host-cache

say() { printf 'build.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

engine() {
  if [ -n "${ENGINE:-}" ]; then echo "$ENGINE"
  elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then echo docker
  elif command -v buildah >/dev/null 2>&1; then echo buildah
  else die "neither docker nor buildah is installed (apt-get install buildah)"
  fi
}

# The first Debian mirror apt uses for $SUITE, else for this host's own release (the same archive
# serves every release): one-line sources.list entries, then deb822 stanzas.
apt_mirror() {
  if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
  local host_suite
  host_suite=$(sed -n 's/^VERSION_CODENAME=//p' /etc/os-release 2>/dev/null)
  mirror_for "$SUITE" || { [ -n "$host_suite" ] && mirror_for "$host_suite"; } \
    || die "no Debian $SUITE mirror in /etc/apt/sources*; set DEBIAN_MIRROR"
}

mirror_for() {
  local SUITE=$1 f found=""
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    found=$(awk -v s="$SUITE" '$1 == "deb" {
        for (i = 2; i < NF; i++) if ($i ~ /^[a-z]+:\/\// && $(i + 1) == s) { print $i; exit } }' "$f")
    [ -n "$found" ] && { echo "$found"; return; }
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    found=$(awk -v s="$SUITE" 'BEGIN { RS = "" } {
        uri = ""; ok = 0; on = 1; n = split($0, line, "\n")
        for (j = 1; j <= n; j++) {
          if (line[j] ~ /^URIs:/) { split(line[j], a, /[ \t]+/); uri = a[2] }
          if (line[j] ~ /^Suites:/) { m = split(line[j], b, /[ \t]+/); for (k = 2; k <= m; k++) if (b[k] == s) ok = 1 }
          if (line[j] ~ /^Enabled:[ \t]*no/) on = 0
        }
        if (ok && on && uri != "") { print uri; exit } }' "$f")
    [ -n "$found" ] && { echo "$found"; return; }
  done
  return 1
}

# `pip config list` once; pip_setting KEY prints the value pip uses (environment, then files).
PIP_CONFIG=""
pip_setting() {
  local scope
  for scope in ':env:' install global; do
    printf '%s\n' "$PIP_CONFIG" | awk -v p="$scope.$1=" 'index($0, p) == 1 {
        v = substr($0, length(p) + 1); gsub(/^'\''|'\''$/, "", v); print v; found = 1; exit }
        END { exit !found }' && return
  done
  return 0
}

make_base() {
  [ "$(engine)" = buildah ] || die "'base' is for buildah; docker pulls the Dockerfile's BASE_IMAGE"
  command -v debootstrap >/dev/null 2>&1 || die "debootstrap is missing (apt-get install debootstrap)"
  local mirror rootfs ctr mnt start
  mirror=$(apt_mirror)
  rootfs=$(mktemp -d /var/tmp/toolkit-rootfs.XXXXXX)
  # shellcheck disable=SC2064  # expand now: the path is fixed
  trap "rm -rf '$rootfs'" EXIT
  start=$SECONDS
  say "debootstrap --variant=minbase $SUITE (mirror from apt's sources)"
  debootstrap --variant=minbase "$SUITE" "$rootfs" "$mirror" >/dev/null
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  ctr=$(buildah from scratch)
  mnt=$(buildah mount "$ctr")
  tar -C "$rootfs" -cf - . | tar -C "$mnt" -xpf -
  buildah umount "$ctr" >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/bash "$ctr"
  buildah commit --rm -q "$ctr" "$LOCAL_BASE" >/dev/null
  rm -rf "$rootfs"
  trap - EXIT
  say "base $LOCAL_BASE ready in $((SECONDS - start)) s"
}

image_exists() {
  buildah inspect --type image "$1" >/dev/null 2>&1
}

build() {
  local variant=$1; shift
  local dockerfile image eng args=() mounts=() cert index extra links torch_default start v
  case $variant in
    cpu) dockerfile=$HERE/Dockerfile.cpu ;;
    gpu) dockerfile=$HERE/Dockerfile ;;
    *) die "unknown image '$variant': cpu or gpu" ;;
  esac
  image=${IMAGE:-localhost/toolkit:$variant}
  eng=$(engine)
  PIP_CONFIG=$("${PYTHON:-python3}" -m pip config list 2>/dev/null || true)

  # pip's CA bundle: a build secret, so it never lands in a layer.
  cert=$(pip_setting cert)
  [ -z "$cert" ] && cert=${PIP_CERT:-}
  if [ -n "$cert" ] && [ -r "$cert" ]; then
    args+=(--secret "id=pip-ca,src=$cert")
  fi
  # pip's indexes and find-links; local folders (file:// or a path) are bind-mounted, buildah only.
  index=$(pip_setting index-url)
  extra=$(pip_setting extra-index-url)
  links=$(pip_setting find-links)
  [ -n "$index" ] && args+=(--build-arg "PIP_INDEX_URL=$index")
  # A local index's pages link to files beside it (../../files/x.whl): its parent is mounted.
  for v in $index $extra $links; do
    v=${v#file://}
    case " $index $extra " in *" file://$v "*|*" $v "*) v=$(dirname "${v%/}") ;; esac
    case $v in
      /*) if [ "$eng" = buildah ] && [ -e "$v" ]; then mounts+=(-v "$v:$v:ro")
          else say "pip location $v is local to this machine: not visible to a docker build"; fi ;;
    esac
  done
  [ -n "$extra" ] && args+=(--build-arg "PIP_EXTRA_INDEX_URL=$extra")
  [ -n "$links" ] && args+=(--build-arg "PIP_FIND_LINKS=$links")

  # torch's wheel index: the Dockerfile's default unless unreachable from here.
  torch_default=$(sed -n 's/^ARG TORCH_INDEX_URL=//p' "$dockerfile")
  if [ -n "${TORCH_INDEX_URL+set}" ]; then
    args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
  elif [ -n "$torch_default" ] && ! curl -fsS -o /dev/null --max-time 20 "${torch_default%/}/torch/" 2>/dev/null; then
    say "$torch_default is unreachable: torch comes from pip's own configuration"
    args+=(--build-arg "TORCH_INDEX_URL=")
  fi

  if [ -n "${BASE_IMAGE:-}" ]; then
    args+=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
  elif [ "$eng" = buildah ]; then
    # No registry needed: both images build on Debian, from debootstrap, made once.
    image_exists "$LOCAL_BASE" || make_base
    args+=(--build-arg "BASE_IMAGE=$LOCAL_BASE")
  fi

  # A wheelhouse replaces the Dockerfile's empty `wheelhouse` stage (a named build context).
  if [ -n "${WHEELHOUSE:-}" ]; then
    [ -d "$WHEELHOUSE" ] || die "WHEELHOUSE=$WHEELHOUSE: no such folder (write one with \`toolkit build-horovod --export DIR\`)"
    WHEELHOUSE=$(cd "$WHEELHOUSE" && pwd)
    args+=(--build-context "wheelhouse=$WHEELHOUSE" --build-arg "WHEELHOUSE=$(basename "$WHEELHOUSE")")
  fi

  start=$SECONDS
  if [ "$eng" = docker ]; then
    DOCKER_BUILDKIT=1 docker build -f "$dockerfile" -t "$image" "${args[@]}" "$@" "$CONTEXT"
  else
    # The host's pip and Horovod caches: a Horovod wheel built here once is reused by the image.
    # With a WHEELHOUSE the Horovod cache stays out: the wheelhouse is the only way in.
    mkdir -p "$HOME/.cache/pip" "$HOME/.cache/toolkit"
    mounts+=(-v "$HOME/.cache/pip:$HOST_CACHE/pip")
    args+=(--build-arg "PIP_CACHE_DIR=$HOST_CACHE/pip")
    if [ -z "${WHEELHOUSE:-}" ]; then
      mounts+=(-v "$HOME/.cache/toolkit:$HOST_CACHE/toolkit")
      args+=(--build-arg "TOOLKIT_CACHE_DIR=$HOST_CACHE/toolkit")
    fi
    # --format docker: the OCI format drops SHELL (RUN would use /bin/sh, without pipefail).
    buildah bud --isolation chroot --pull=never --layers --format docker -f "$dockerfile" \
      --ignorefile "$dockerfile.dockerignore" -t "$image" "${mounts[@]}" "${args[@]}" "$@" "$CONTEXT"
  fi
  say "$image built in $((SECONDS - start)) s"
}

run_in() {
  local variant=$1; shift
  [ "${1:-}" = -- ] && shift
  [ $# -gt 0 ] || die "usage: docker/build.sh run cpu|gpu -- COMMAND [ARGS...]"
  local image=${IMAGE:-localhost/toolkit:$variant} ctr rc=0
  if [ "$(engine)" = docker ]; then
    docker run --rm --shm-size=1g "$image" "$@"
    return
  fi
  ctr=$(buildah from --pull=never "$image")
  # The host's network and, with --uts host, its hostname: Gloo segfaults (exit 139) when the
  # hostname does not resolve, and buildah, unlike docker, does not add it to the container's hosts.
  buildah run --isolation chroot --uts host "$ctr" -- "$@" || rc=$?
  buildah rm "$ctr" >/dev/null
  return "$rc"
}

case ${1:-} in
  cpu|gpu) build "$@" ;;
  base) make_base ;;
  run) shift; [ $# -gt 0 ] || die "usage: docker/build.sh run cpu|gpu -- COMMAND"; run_in "$@" ;;
  *) sed -n '2,/^set -euo/s/^# \{0,1\}//p' "$0"; exit 2 ;;
esac
