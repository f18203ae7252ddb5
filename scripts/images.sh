#!/usr/bin/env bash
# Builds the images of the Dockerfile with a real Docker daemon (docs/images.md):
#
#   scripts/images.sh build [TARGET...]   pipeline and trainer-tpu by default; trainer-gpu on request (its
#                                          CUDA wheels are gigabytes)
#
# Each target becomes ${EFFNET_IMAGES:-effnet}/TARGET:local. Debian's docker.io is installed where dockerd is
# missing, and a daemon is started for the run where none answers (scripts/docker_daemon.sh). The Dockerfile is
# the one users build in the cloud; what this machine cannot reach is stood in, each stand-in built here from
# what it can reach and named effnet-stand-in/...:
#   - python:3.11-slim-bookworm (Docker Hub): Debian bookworm's Python 3.11, its root made with mmdebstrap;
#   - apache/beam_python3.11_sdk:2.59.0 (Docker Hub): only its boot program's place, by a script that fails;
#   - Google's libtpu index: a libtpu wheel of the pinned version that is no TPU runtime, served on 127.0.0.1.
# The dependencies are layers of their own, so a build after a change of the code takes seconds.
# One line per phase; the builder's output goes to outputs/images/*.log, shown when a phase fails.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/docker_daemon.sh
. scripts/docker_daemon.sh

PREFIX=${EFFNET_IMAGES:-effnet}
LOGS=outputs/images
PYTHON_IMAGE=python:3.11-slim-bookworm
BEAM_SDK_IMAGE=apache/beam_python3.11_sdk:2.59.0
LIBTPU_FIND_LINKS=https://storage.googleapis.com/libtpu-tf-releases/index.html
STAND_IN=effnet-stand-in
# What the stand-in for python:3.11-slim-bookworm is made of: Python 3.11 with its headers (the official image
# has them: packages without a wheel compile against them), venv, and the CA certificates.
DEBIAN_PACKAGES=python3.11,python3.11-dev,python3-venv,ca-certificates
ALL_TARGETS=(pipeline trainer-tpu trainer-gpu)
LABEL=effnet.images  # on every image this command builds

usage() {
  echo "usage: scripts/images.sh build [pipeline|trainer-tpu|trainer-gpu ...]" >&2
  exit 2
}

work=""
server=""
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  if [ -n "$work" ]; then rm -rf "$work"; fi
  docker_down
}
trap cleanup EXIT
trap 'echo "[images] stopped; the same command goes on from the layers already built" >&2; exit 130' INT TERM

phase() {
  local what=$1 log=$2
  shift 2
  echo "[images] $what" >&2
  if ! "$@" >>"$log" 2>&1; then
    echo "[images] failed: $what. The end of its output (all of it in $log):" >&2
    tail -n 40 "$log" | sed 's/^/  /' >&2
    exit 1
  fi
}

reachable_image() {  # the image is here, or can be pulled
  "$DOCKER" image inspect "$1" >/dev/null 2>&1 || timeout 120 "$DOCKER" pull -q "$1" >/dev/null 2>&1
}

python_base() {  # sets BASE_IMAGE, the image to build on
  BASE_IMAGE=$PYTHON_IMAGE
  if reachable_image "$PYTHON_IMAGE"; then return; fi
  local stand_in=$STAND_IN/python:3.11-slim-bookworm recipe
  # Rebuilt when its recipe changes (the image keeps the recipe's digest as a label).
  recipe=$(printf '%s\n' "$DEBIAN_PACKAGES" | cat - scripts/stand-ins/python.Dockerfile | sha256sum | cut -c1-16)
  if [ "$("$DOCKER" image inspect --format '{{index .Config.Labels "effnet.recipe"}}' "$stand_in" 2>/dev/null)" \
    != "$recipe" ]; then
    if ! command -v mmdebstrap >/dev/null 2>&1; then
      phase "installing Debian's mmdebstrap" "$LOGS/stand-ins.log" \
        env DEBIAN_FRONTEND=noninteractive apt-get install -y -q mmdebstrap
    fi
    phase "stand-in for $PYTHON_IMAGE: Debian bookworm's Python 3.11 (mmdebstrap, about a minute)" \
      "$LOGS/stand-ins.log" mmdebstrap --variant=minbase --include="$DEBIAN_PACKAGES" bookworm "$work/root.tar"
    phase "importing it" "$LOGS/stand-ins.log" "$DOCKER" import --change "LABEL $LABEL=stand-in" "$work/root.tar" \
      "$STAND_IN/debian-root:bookworm"
    rm -f "$work/root.tar"
    mkdir -p "$work/python"
    cp scripts/stand-ins/python.Dockerfile "$work/python/Dockerfile"
    cp /etc/ssl/certs/ca-certificates.crt "$work/python/"
    phase "building $stand_in" "$LOGS/stand-ins.log" "$DOCKER" build --network host \
      --build-arg BASE="$STAND_IN/debian-root:bookworm" --label "effnet.recipe=$recipe" --label "$LABEL=stand-in" \
      -t "$stand_in" "$work/python"
  fi
  BASE_IMAGE=$stand_in
}

beam_sdk() {  # sets SDK_IMAGE, the image Beam's boot program is copied from
  SDK_IMAGE=$BEAM_SDK_IMAGE
  if reachable_image "$BEAM_SDK_IMAGE"; then return; fi
  SDK_IMAGE=$STAND_IN/beam_python3.11_sdk:2.59.0
  phase "stand-in for $BEAM_SDK_IMAGE's boot program" "$LOGS/stand-ins.log" "$DOCKER" build -q \
    --label "$LABEL=stand-in" -f scripts/stand-ins/beam-sdk.Dockerfile -t "$SDK_IMAGE" scripts/stand-ins
}

libtpu_index() {  # sets TPU_INDEX, the find-links the trainer-tpu build takes libtpu from
  TPU_INDEX=$LIBTPU_FIND_LINKS
  if timeout 20 curl -sfI "$LIBTPU_FIND_LINKS" >/dev/null 2>&1; then return; fi
  local version port
  version=$(sed -n 's/^libtpu==//p' constraints-accelerators.txt)
  mkdir -p "$work/libtpu"
  phase "stand-in for libtpu $version (Google's index is out of reach)" "$LOGS/stand-ins.log" \
    python3 scripts/stand-ins/libtpu_wheel.py "$work/libtpu" "$version"
  # A fixed port where free: the index's address is part of the TPU layer's cache key. Reusable like the
  # server's own, so that the last build's connections, still closing, do not move it.
  port=$(python3 -c 'import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", 18470))
except OSError:
    s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
  python3 -m http.server --bind 127.0.0.1 --directory "$work/libtpu" "$port" >>"$LOGS/stand-ins.log" 2>&1 &
  server=$!
  TPU_INDEX=http://127.0.0.1:$port/
}

[ "${1:-}" = build ] || usage
shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(pipeline trainer-tpu)
for target in "${targets[@]}"; do
  [[ " ${ALL_TARGETS[*]} " == *" $target "* ]] || {
    echo "error: unknown target '$target'; the Dockerfile's are: ${ALL_TARGETS[*]}" >&2
    exit 2
  }
done
mkdir -p "$LOGS"
: >"$LOGS/stand-ins.log"
work=$(mktemp -d "${TMPDIR:-/tmp}/effnet-images.XXXXXX")
docker_up
python_base
beam_sdk
args=(--network host --build-arg "PYTHON_IMAGE=$BASE_IMAGE" --build-arg "BEAM_SDK_IMAGE=$SDK_IMAGE")
if [[ " ${targets[*]} " == *" trainer-tpu "* ]]; then
  libtpu_index
  args+=(--build-arg "LIBTPU_FIND_LINKS=$TPU_INDEX")
fi
for target in "${targets[@]}"; do
  start=$SECONDS
  : >"$LOGS/build-$target.log"
  phase "building $PREFIX/$target:local" "$LOGS/build-$target.log" \
    "$DOCKER" build --progress plain "${args[@]}" --label "$LABEL=$target" --target "$target" \
    -t "$PREFIX/$target:local" .
  echo "[images] $PREFIX/$target:local built in $((SECONDS - start)) s" >&2
done
# What a build replaced (the tag moved on) is left untagged: removed, the layers still used kept.
"$DOCKER" image prune --force --filter "label=$LABEL" >/dev/null
