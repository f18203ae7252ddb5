# Sourced by scripts/images.sh and scripts/test.sh: a Docker daemon for the commands that need one.
#
#   docker_up     installs Debian's docker.io where dockerd is missing, and starts dockerd when none answers
#                 (it then runs until docker_down); sets DOCKER, the client to call
#   docker_down   stops the daemon docker_up started, if it did
#
# The daemon runs without touching the host's network (no iptables rules, no bridge): containers and builds use
# --network host or --network none. DOCKER is a client that builds with BuildKit (which builds only the stages
# a target needs): `docker` when it has the buildx plugin, else Debian's 20.10 client, whose BuildKit is built in.

DOCKERD_PID=""
DOCKERD_LOG=${DOCKERD_LOG:-outputs/images/dockerd.log}

docker_up() {
  mkdir -p "$(dirname "$DOCKERD_LOG")"
  if ! command -v dockerd >/dev/null 2>&1; then
    echo "[docker] installing Debian's docker.io" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io >>"$DOCKERD_LOG" 2>&1 || {
      echo "[docker] failed: apt-get install docker.io (its output: $DOCKERD_LOG)" >&2
      return 1
    }
  fi
  if docker buildx version >/dev/null 2>&1; then
    DOCKER=docker
  elif [ -x /usr/bin/docker ]; then
    DOCKER=/usr/bin/docker
  else
    DOCKER=docker
  fi
  export DOCKER DOCKER_BUILDKIT=1
  if "$DOCKER" info >/dev/null 2>&1; then
    return 0
  fi
  echo "[docker] starting dockerd for this run (its log: $DOCKERD_LOG)" >&2
  dockerd --iptables=false --ip-forward=false --bridge=none >>"$DOCKERD_LOG" 2>&1 &
  DOCKERD_PID=$!
  for _ in $(seq 1 60); do
    if "$DOCKER" info >/dev/null 2>&1; then
      return 0
    fi
    if ! kill -0 "$DOCKERD_PID" 2>/dev/null; then
      break
    fi
    sleep 0.5
  done
  echo "[docker] failed: dockerd did not answer (its log: $DOCKERD_LOG)" >&2
  docker_down
  return 1
}

docker_down() {
  if [ -n "$DOCKERD_PID" ]; then
    kill "$DOCKERD_PID" 2>/dev/null || true
    wait "$DOCKERD_PID" 2>/dev/null || true
    DOCKERD_PID=""
  fi
}
